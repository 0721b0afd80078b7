#pragma once
// Whole-file reads and all-or-nothing writes, with errors that name the file.
#include <cstdio>
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
/// Writes each (path, bytes) to a temp file beside it, then renames them all; on error none is left.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);
/// What writes one file's bytes to an open stream (a file too large to hold in memory); it throws
/// an Error naming the file when a write fails.
using StreamWriter = std::function<void(std::FILE*)>;
/// write_files_atomic with each file's bytes streamed by its writer.
void write_files_atomic_streamed(const std::vector<std::pair<std::string, StreamWriter>>& files);
/// write_files_atomic for one file.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace tapelm
