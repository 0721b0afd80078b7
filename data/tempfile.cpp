#include "data/tempfile.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "autograd/error.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

// The handler may only touch what is async-signal-safe: fixed buffers, flags, unlink, raise.
constexpr int kSlots = 16;
constexpr size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
volatile sig_atomic_t g_used[kSlots];
std::mutex g_mutex;  // guards slot assignment (not the handler's reads)
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Folders: a staging folder to empty and remove, or (with a name part) an output folder whose
// entries holding that part (this process's temporary files) are removed.
constexpr int kFolderSlots = 4;
constexpr size_t kPartMax = 64;
char g_folders[kFolderSlots][kPathMax];
char g_parts[kFolderSlots][kPartMax];
volatile sig_atomic_t g_folder_used[kFolderSlots];

// name is `<target><part><digits>`, the whole form temp_path_for gives this process's temporary
// files (part ".tmp.<pid>."), and nothing else: a user's file that merely holds the part is kept.
bool is_temp_name(const char* name, const char* part) {
  for (const char* s = name + 1; *s; s++) {
    size_t i = 0;
    while (part[i] && s[i] == part[i]) i++;
    if (part[i]) continue;
    const char* d = s + i;
    if (!*d) return false;
    while (*d >= '0' && *d <= '9') d++;
    if (!*d) return true;
  }
  return false;
}

// With open, getdents64, unlinkat and rmdir alone (async-signal-safe); entries removed while the
// folder is read may hide others from the same pass, so passes repeat until one removes nothing.
void clean_folder(const char* dir, const char* part) {
  for (int pass = 0; pass < 8; pass++) {
    const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    bool removed = false;
    alignas(8) char buf[4096];
    for (long n; (n = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;) {
      for (long at = 0; at < n;) {
        struct Entry {
          uint64_t ino;
          int64_t off;
          unsigned short reclen;
          unsigned char type;
          char name[1];
        };
        const Entry* e = reinterpret_cast<const Entry*>(buf + at);
        at += e->reclen;
        // regular files alone (a sub-folder or a symbolic link is never this process's file)
        if (e->type == DT_DIR || e->type == DT_LNK || (e->name[0] == '.' && (!e->name[1] || (e->name[1] == '.' && !e->name[2])))) continue;
        if (*part && !is_temp_name(e->name, part)) continue;
        removed = ::unlinkat(fd, e->name, 0) == 0 || removed;
      }
    }
    ::close(fd);
    if (!removed) break;
  }
  if (!*part) ::rmdir(dir);
}

void on_fatal_signal(int sig) {
  remove_guarded_now();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

/// Installs the handler for each signal whose disposition is the default (checked at every guard:
/// a command may install its own handlers later, which then take precedence).
void install_where_default() {
  for (int sig : kSignals) {
    struct sigaction old{};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa{};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

bool process_runs(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

}  // namespace

void remove_guarded_now() {
  for (int i = 0; i < kSlots; i++)
    if (g_used[i]) ::unlink(g_paths[i]);
  for (int i = 0; i < kFolderSlots; i++)
    if (g_folder_used[i]) clean_folder(g_folders[i], g_parts[i]);
}

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

std::string reserve_temp_for(const std::string& path) {
  for (int tries = 0;; tries++) {
    const std::string t = temp_path_for(path);
    const int fd = ::open(t.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return t;
    }
    if (errno != EEXIST || tries >= 100) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
  }
}

TempFileGuard::TempFileGuard(const std::string& path) {
  if (path.size() >= kPathMax) return;  // not guarded; the next writer's sweep still removes it
  std::lock_guard<std::mutex> lock(g_mutex);
  install_where_default();
  for (int i = 0; i < kSlots; i++)
    if (!g_used[i]) {
      std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
      g_used[i] = 1;
      slot_ = i;
      return;
    }
}

FolderGuard::FolderGuard(const std::string& dir, const std::string& part) {
  if (dir.size() >= kPathMax || part.size() >= kPartMax) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  install_where_default();
  for (int i = 0; i < kFolderSlots; i++)
    if (!g_folder_used[i]) {
      std::memcpy(g_folders[i], dir.c_str(), dir.size() + 1);
      std::memcpy(g_parts[i], part.c_str(), part.size() + 1);
      g_folder_used[i] = 1;
      slot_ = i;
      return;
    }
}

FolderGuard::~FolderGuard() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_folder_used[slot_] = 0;
}

TempFileGuard::~TempFileGuard() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_used[slot_] = 0;
}

void remove_stale_temps(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // exactly <name>.tmp.<pid>.<k>, a regular file, of a process that no longer runs
    const std::string rest = name.substr(prefix.size());
    const size_t digits = rest.find_first_not_of("0123456789");
    if (digits == 0 || digits == std::string::npos || rest[digits] != '.' || rest.size() == digits + 1 ||
        rest.find_first_not_of("0123456789", digits + 1) != std::string::npos)
      continue;
    const long pid = std::strtol(rest.substr(0, digits).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || process_runs(pid)) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(e.path().c_str());
  }
}

}  // namespace tapelm
