// A fault injector for the output tests (tests/cli/test_outputs.cpp), loaded into the binary under
// test with LD_PRELOAD: it makes chosen file-system calls fail as a file system or a kill would,
// so every failure point of a write can be reached on this machine's own file system.
//
//   TAPELM_FAILSHIM="rule;rule;..."   rule = call[~text][@n]:action
//     call    exchange (renameat2 with RENAME_EXCHANGE), rename, link, fsync, mkdir, unlink, rmdir
//             (remove(3) counts as one of these two), write (write and pwrite)
//     ~text   only calls whose path contains text (ends with it, when text ends in $)
//     @n      only the n-th call the rule matches in the process (1-based); without it, every one
//     action  an errno name (EINVAL, EIO, EXDEV, ENOSPC, EPERM, EACCES, EROFS, ENOTSUP), or kill,
//             term, int, hup: the process sends itself SIGKILL, SIGTERM, SIGINT or SIGHUP just before
//             the call (a handled signal returns, and the call goes on)
//   TAPELM_FAILSHIM_LOG=FILE           appends "call path" for every such call, in order
//
// `write` counts and fails only writes to descriptors above 2 (never stdout or stderr), and the log
// leaves writes out. Nothing is done for a process whose environment has neither variable.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

enum { C_EXCHANGE, C_RENAME, C_LINK, C_FSYNC, C_MKDIR, C_UNLINK, C_RMDIR, C_WRITE, C_COUNT };
static const char* const kNames[C_COUNT] = {"exchange", "rename", "link", "fsync", "mkdir", "unlink", "rmdir", "write"};

struct rule {
  int call;
  char text[128];  // "": any path
  long nth;        // 0: every call
  long seen;       // calls matched so far
  int action;      // an errno, or minus a signal to send
};

static struct rule g_rules[16];
static int g_nrules = -1;  // -1: not parsed yet
static int g_log = -1;

static int errno_of(const char* s) {
  static const struct {
    const char* name;
    int value;
  } kErrnos[] = {{"EINVAL", EINVAL}, {"EIO", EIO},       {"EXDEV", EXDEV},   {"ENOSPC", ENOSPC}, {"EPERM", EPERM},
                 {"EACCES", EACCES}, {"EROFS", EROFS},   {"ENOTSUP", ENOTSUP}, {"EBUSY", EBUSY}, {"ENOSYS", ENOSYS}};
  for (size_t i = 0; i < sizeof kErrnos / sizeof kErrnos[0]; i++)
    if (strcmp(s, kErrnos[i].name) == 0) return kErrnos[i].value;
  if (strcmp(s, "kill") == 0) return -SIGKILL;
  if (strcmp(s, "term") == 0) return -SIGTERM;
  if (strcmp(s, "int") == 0) return -SIGINT;
  if (strcmp(s, "hup") == 0) return -SIGHUP;
  return 0;
}

static void parse(void) {
  if (g_nrules >= 0) return;
  g_nrules = 0;
  const char* log = getenv("TAPELM_FAILSHIM_LOG");
  if (log && *log) g_log = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const char* spec = getenv("TAPELM_FAILSHIM");
  if (!spec) return;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", spec);
  for (char* save = NULL, *r = strtok_r(buf, ";", &save); r && g_nrules < 16; r = strtok_r(NULL, ";", &save)) {
    char* colon = strchr(r, ':');
    if (!colon) continue;
    *colon = '\0';
    struct rule rl = {0};
    char* at = strchr(r, '@');
    if (at) {
      *at = '\0';
      rl.nth = strtol(at + 1, NULL, 10);
    }
    char* tilde = strchr(r, '~');
    if (tilde) {
      *tilde = '\0';
      snprintf(rl.text, sizeof rl.text, "%s", tilde + 1);
    }
    rl.action = errno_of(colon + 1);
    for (int c = 0; c < C_COUNT; c++)
      if (strcmp(r, kNames[c]) == 0 && rl.action != 0) {
        rl.call = c;
        g_rules[g_nrules++] = rl;
      }
  }
}

static int matches(const char* path, const char* text) {
  if (!path) return 0;
  const size_t n = strlen(text);
  if (n && text[n - 1] == '$') {
    const size_t m = strlen(path);
    return m >= n - 1 && strncmp(path + m - (n - 1), text, n - 1) == 0;
  }
  return strstr(path, text) != NULL;
}

// Counts the call, logs it, and says whether it fails (0: go on; else the errno to fail with).
static int check(int call, const char* path) {
  parse();
  if (g_log >= 0 && call != C_WRITE) {
    char line[4200];
    const int len = snprintf(line, sizeof line, "%s %s\n", kNames[call], path ? path : "");
    if (len > 0) (void)!write(g_log, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
  }
  int action = 0;  // every rule counts the calls it matches; the first that fires acts
  for (int i = 0; i < g_nrules; i++) {
    struct rule* rl = &g_rules[i];
    if (rl->call != call || (rl->text[0] && !matches(path, rl->text))) continue;
    const long seen = ++rl->seen;
    if (!action && (!rl->nth || rl->nth == seen)) action = rl->action;
  }
  if (action < 0) {
    kill(getpid(), -action);
    return 0;
  }
  return action;
}

#define NEXT(fn)                     \
  static __typeof__(&fn) next_##fn; \
  if (!next_##fn) next_##fn = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn)

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned int flags) {
  NEXT(renameat2);
  const int e = check((flags & RENAME_EXCHANGE) ? C_EXCHANGE : C_RENAME, newpath);
  if (e) { errno = e; return -1; }
  return next_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}

int rename(const char* oldpath, const char* newpath) {
  NEXT(rename);
  const int e = check(C_RENAME, newpath);
  if (e) { errno = e; return -1; }
  return next_rename(oldpath, newpath);
}

int link(const char* oldpath, const char* newpath) {
  NEXT(link);
  const int e = check(C_LINK, newpath);
  if (e) { errno = e; return -1; }
  return next_link(oldpath, newpath);
}

int fsync(int fd) {
  NEXT(fsync);
  char self[64], path[4096] = "";
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(self, path, sizeof path - 1);
  if (n > 0) path[n] = '\0';
  const int e = check(C_FSYNC, path);
  if (e) { errno = e; return -1; }
  return next_fsync(fd);
}

int mkdir(const char* path, mode_t mode) {
  NEXT(mkdir);
  const int e = check(C_MKDIR, path);
  if (e) { errno = e; return -1; }
  return next_mkdir(path, mode);
}

int unlink(const char* path) {
  NEXT(unlink);
  const int e = check(C_UNLINK, path);
  if (e) { errno = e; return -1; }
  return next_unlink(path);
}

int rmdir(const char* path) {
  NEXT(rmdir);
  const int e = check(C_RMDIR, path);
  if (e) { errno = e; return -1; }
  return next_rmdir(path);
}

// std::filesystem::remove calls remove(3), whose own unlink and rmdir are inside the C library
int remove(const char* path) {
  NEXT(remove);
  struct stat st;
  const int e = check(lstat(path, &st) == 0 && S_ISDIR(st.st_mode) ? C_RMDIR : C_UNLINK, path);
  if (e) { errno = e; return -1; }
  return next_remove(path);
}

ssize_t write(int fd, const void* buf, size_t count) {
  NEXT(write);
  if (fd > 2 && fd != g_log) {
    const int e = check(C_WRITE, NULL);
    if (e) { errno = e; return -1; }
  }
  return next_write(fd, buf, count);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  NEXT(pwrite64);
  if (fd > 2) {
    const int e = check(C_WRITE, NULL);
    if (e) { errno = e; return -1; }
  }
  return next_pwrite64(fd, buf, count, offset);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) { return pwrite64(fd, buf, count, offset); }
