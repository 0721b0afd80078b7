#pragma once
// Temp files written beside their final path and renamed into place (`<name>.tmp.<pid>[.<k>]`):
// removed if a signal ends the process while they exist, and by the next writer of the same path
// when a process died without that chance (kill -9).
#include <string>

namespace tapelm {

/// The temp path for writing `path`: `<path>.tmp.<pid>.<k>`, k counting within this process.
std::string temp_path_for(const std::string& path);
/// temp_path_for's path made as a new, empty file of this process's (O_CREAT | O_EXCL |
/// O_NOFOLLOW: never a file or a symbolic link that was there); a data Error naming `path` when it
/// cannot be made.
std::string reserve_temp_for(const std::string& path);

/// While alive, `path` is unlinked if SIGINT, SIGTERM or SIGHUP ends the process, before the
/// signal takes its default effect. Signals a command handles itself (train's stop handler) are
/// left alone: such a command finishes its write and cleans up on its own.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  int slot_ = -1;
};

/// While alive, a folder of this process's is cleaned if SIGINT, SIGTERM or SIGHUP ends the
/// process: with no `part`, a staging folder this process made is emptied of its files and removed
/// (rmdir: only when empty); with one, the regular files in `dir` named `<target><part><digits>`,
/// the form temp_path_for gives this process's temporary files, are removed, and no other. Never
/// through a symbolic link; sub-folders and links are left.
class FolderGuard {
 public:
  explicit FolderGuard(const std::string& dir, const std::string& part = "");
  ~FolderGuard();
  FolderGuard(const FolderGuard&) = delete;
  FolderGuard& operator=(const FolderGuard&) = delete;

 private:
  int slot_ = -1;
};

/// Removes every guarded temporary file and cleans every guarded folder now, with
/// async-signal-safe calls alone: what a fatal signal's handler runs before the process ends.
void remove_guarded_now();

/// Removes `<path>.tmp.<pid>...` files beside `path` whose process no longer runs: what a writer
/// killed before its rename left behind.
void remove_stale_temps(const std::string& path);

}  // namespace tapelm
