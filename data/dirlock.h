#pragma once
// One writer per directory: train, uptrain, sweep and prepare lock their output directory.
#include <string>

#include "autograd/error.h"

namespace tapelm {

/// An exclusive lock on a directory for the life of the object: flock on dir/.lock, which holds
/// "tapelm <pid>" of the holder. The kernel drops the lock when the process ends however it ends (kill -9
/// included), so no lock is ever stale; the file stays, as removing it would race a new holder.
/// A lock is per open file, so a second DirLock on one directory fails in the same process too.
class DirLock {
 public:
  /// Creates dir if needed and locks it; another holder -> an Error of `kind` naming dir and its pid.
  /// A .lock already there is taken only when it is a lock file of tapelm's ("tapelm <pid>"), or,
  /// in a folder known to be tapelm's (`known`: it holds tapelm's manifest), of an older form (a
  /// bare pid, or nothing yet); anything else (a user's file, a symbolic link) is an Error, never
  /// truncated or followed.
  explicit DirLock(const std::string& dir, ErrorKind kind = ErrorKind::train, bool known = false);
  ~DirLock();
  DirLock(DirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  DirLock& operator=(DirLock&&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace tapelm
