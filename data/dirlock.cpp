#include "data/dirlock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <filesystem>

namespace tapelm {

namespace fs = std::filesystem;

namespace {
constexpr const char* kTag = "tapelm ";

// A lock file of tapelm's: a regular file holding "tapelm <pid>\n"; in a folder known to be
// tapelm's also a bare pid (older locks) or nothing (a holder killed before it wrote its pid).
bool is_lock_file(int fd, bool known) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 40) return false;
  char buf[48] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  if (n < 0 || n != st.st_size) return false;
  std::string s(buf, static_cast<size_t>(n));
  const bool tagged = s.rfind(kTag, 0) == 0;
  if (tagged) s = s.substr(std::strlen(kTag));
  else if (!known) return false;
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (tagged && s.empty()) return false;
  return s.find_first_not_of("0123456789") == std::string::npos;
}
}  // namespace

DirLock::DirLock(const std::string& dir, ErrorKind kind, bool known) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(kind, dir + ": cannot create the directory");
  const std::string path = (fs::path(dir) / ".lock").string();
  // O_CLOEXEC: a child (gnuplot, a test's tapelm) must not inherit the lock and outlive us with it.
  // A .lock already there is rewritten only when it is a lock file of tapelm's: never a user's
  // file of that name, nor what a symbolic link points to.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  const bool made = fd_ >= 0;  // removed again if this lock is not had after all
  bool foreign = false;
  if (fd_ < 0 && errno == EEXIST) {
    fd_ = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    const int err = errno;
    foreign = (fd_ < 0 && (err == ELOOP || err == EISDIR || err == ENXIO)) || (fd_ >= 0 && !is_lock_file(fd_, known));
    if (foreign && fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) foreign = false;  // held: in use
    else if (foreign && fd_ >= 0) ::flock(fd_, LOCK_UN);
  }
  if (foreign) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw Error(kind, dir + ": .lock is there and is not a lock file of tapelm's (one holds \"tapelm\" and a process id); move it "
                            "away or choose another folder");
  }
  if (fd_ < 0) throw Error(kind, dir + ": directory is not writable (cannot create .lock)");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[48] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    if (pid.rfind(kTag, 0) == 0) pid = pid.substr(std::strlen(kTag));
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (err != EWOULDBLOCK) throw Error(kind, dir + ": cannot lock " + path);
    // The holder writes its pid just after locking: an empty file means it is still starting.
    throw Error(kind, dir + " is in use by another tapelm process (pid " + (pid.empty() ? "unknown" : pid) +
                                      "); one writer per directory");
  }
  const std::string pid = kTag + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    if (made) ::unlink(path.c_str());
    ::close(fd_);
    fd_ = -1;
    throw Error(kind, dir + ": directory is not writable (cannot write .lock)");
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor of the open file drops the lock
}

}  // namespace tapelm
