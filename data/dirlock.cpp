#include "data/dirlock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace tapelm {

namespace fs = std::filesystem;

DirLock::DirLock(const std::string& dir, ErrorKind kind) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(kind, dir + ": cannot create the directory");
  const std::string path = (fs::path(dir) / ".lock").string();
  // O_CLOEXEC: a child (gnuplot, a test's tapelm) must not inherit the lock and outlive us with it.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(kind, dir + ": directory is not writable (cannot create .lock)");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (err != EWOULDBLOCK) throw Error(kind, dir + ": cannot lock " + path);
    // The holder writes its pid just after locking: an empty file means it is still starting.
    throw Error(kind, dir + " is in use by another tapelm process (pid " + (pid.empty() ? "unknown" : pid) +
                                      "); one writer per directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd_);
    throw Error(kind, dir + ": directory is not writable (cannot write .lock)");
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor of the open file drops the lock
}

}  // namespace tapelm
