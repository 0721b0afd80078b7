#pragma once
// Files in and out, with errors that name the file: whole-file reads, read-only mappings, and the
// one way every output is written (all or nothing, and durable once the call returns).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

/// Throws an Error of `kind` starting "<what> <path>: " unless path is a regular file: a FIFO would
/// block its reader forever and a device (/dev/zero) never end, so every input is checked before
/// it is opened.
void require_regular_file(const std::string& path, const std::string& what, ErrorKind kind = ErrorKind::data);
/// The bytes of a regular file; `what` ("data file", "token file", ...) starts each error message.
std::string read_file_bytes(const std::string& path, const std::string& what);

/// A regular file mapped read-only for the life of the object: its bytes are read in place, never
/// copied. `what` ("GGUF file", "token file", ...) starts each error; an empty file maps to no bytes.
class MappedFile {
 public:
  /// The whole file, or the window of `length` bytes from `offset` (within the file: a data Error
  /// otherwise): a streamed reader maps one tensor at a time, so that its address space is that
  /// tensor's and not the model's (under `prlimit --as`, a mapped 618 MB model left 7.59 MB).
  /// populate: every page read and mapped now (MAP_POPULATE), for a window that is read whole and
  /// kept (a model's matrices, decoded from the file): one call instead of a fault per page.
  MappedFile(const std::string& path, const std::string& what, uint64_t offset = 0, uint64_t length = UINT64_MAX, bool populate = false);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The window's bytes (the whole file's by default).
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// No read-ahead: the bytes are read at random (token windows).
  void advise_random() const;
  /// Drops the mapped pages around bytes [begin, end) of the window from this process (they stay
  /// in the page cache), so that walking a file larger than memory does not grow the resident set.
  void release(uint64_t begin, uint64_t end) const;
  /// A data Error naming the file when it is not as it was mapped: shorter or longer, or written
  /// since (its modification time), while it is read. Readers call it before and after each
  /// tensor: a model rewritten in place under a streamed run gave text from half of each model.
  /// A file that shrinks under a read in progress raises SIGBUS; while a mapping lives, that
  /// signal ends the process with one line naming the file, exit 1, temporary files removed.
  void check_unchanged() const;
  /// The file's size when it was mapped.
  uint64_t file_size() const { return file_size_; }
  /// Both map the same file as it was: device, inode, size and modification time.
  bool same_file_as(const MappedFile& o) const;

 private:
  std::string path_, what_;
  const uint8_t* base_ = nullptr;  // the mapping, from the page holding `offset`
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0, base_len_ = 0, file_size_ = 0, dev_ = 0, ino_ = 0;
  int64_t mtime_ns_ = 0;
  int slot_ = -1;  // in the SIGBUS handler's table of mappings
};

/// A 16-hex-digit digest of a file's bytes (non-cryptographic: it tells files apart, it does not
/// authenticate them); `what` names the file in errors.
std::string file_digest(const std::string& path, const std::string& what);

/// What writes one output's content, given the temporary path beside it to write (HDF5 writes by
/// path); it throws an Error naming the output when it fails.
using PathWriter = std::function<void(const std::string& tmp)>;
/// What writes one output's bytes to an open stream (a file too large to hold in memory).
using StreamWriter = std::function<void(std::FILE*)>;

/// The one rule for every file tapelm writes: each output is written to a temporary file beside it
/// and synced to disk; then all are renamed into place together (a later rename that fails puts
/// the earlier outputs back as they were); then their directories are synced. On any error, or a
/// signal that ends the process, nothing is left but the old files. An output that exists and is
/// not a regular file (a directory, a device such as /dev/null, a FIFO) is refused before anything
/// is written.
void commit_files(const std::vector<std::pair<std::string, PathWriter>>& files);
/// The same rule for outputs written together, all open at once (a model streamed into several
/// shards): write(temps) fills the temporary paths, in the order of `paths`; then all are synced
/// and renamed into place together.
void commit_together(const std::vector<std::string>& paths, const std::function<void(const std::vector<std::string>& temps)>& write);
/// Renames each temps[i] onto paths[i], all or none: each file replaced is kept as a hard link
/// first, so that a rename that fails puts back the files renamed before it (*restored says
/// whether that undo worked; a data Error names the file that failed). Then the directories are
/// synced.
void replace_files(const std::vector<std::string>& temps, const std::vector<std::string>& paths, bool* restored = nullptr);
/// commit_files with each file's bytes streamed by its writer.
void write_files_atomic_streamed(const std::vector<std::pair<std::string, StreamWriter>>& files);
/// commit_files with each file's bytes in memory.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);
/// write_files_atomic for one file.
void write_file_atomic(const std::string& path, const std::string& bytes);
/// Syncs a file's data (or a directory's entries) to disk; a data Error naming it on failure.
void sync_path(const std::string& path, bool directory = false);

}  // namespace tapelm
