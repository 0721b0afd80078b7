#include "data/io.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "data/tempfile.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void write_whole(const std::string& path, const StreamWriter& write, const std::string& final_path) {
  errno = 0;
  std::FILE* raw = std::fopen(path.c_str(), "wb");
  if (!raw) throw Error(ErrorKind::data, "cannot write " + final_path + ": " + std::strerror(errno));
  File f(raw);
  write(f.get());
  if (std::fflush(f.get()) != 0) throw Error(ErrorKind::data, "cannot write " + final_path + ": " + std::strerror(errno));
  if (std::fclose(f.release()) != 0) throw Error(ErrorKind::data, "cannot write " + final_path + ": " + std::strerror(errno));
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what, ErrorKind kind) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  const std::string at = (what.empty() ? "" : what + " ") + path + ": ";
  if (!fs::exists(st)) throw Error(kind, at + "no such file");
  if (fs::is_directory(st)) throw Error(kind, at + "is a directory, not a file");
  if (!fs::is_regular_file(st)) throw Error(kind, at + "not a regular file (a FIFO, device or socket)");
}

std::string read_file_bytes(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  errno = 0;
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(ErrorKind::data, what + " " + path + ": cannot open: " + std::strerror(errno));
  std::string bytes;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f.get())) > 0) bytes.append(buf, got);
  if (std::ferror(f.get())) throw Error(ErrorKind::data, what + " " + path + ": cannot read: " + std::strerror(errno));
  return bytes;
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::pair<std::string, StreamWriter>> writers;
  for (const auto& [path, bytes] : files)
    writers.emplace_back(path, [&bytes = bytes, &path = path](std::FILE* f) {
      if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
        throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
    });
  write_files_atomic_streamed(writers);
}

void write_files_atomic_streamed(const std::vector<std::pair<std::string, StreamWriter>>& files) {
  for (const auto& [path, writer] : files) {
    remove_stale_temps(path);
    if (fs::is_directory(path)) throw Error(ErrorKind::data, "cannot write " + path + ": is a directory");
  }
  // Temps and backups are removed if a signal ends the process (guards) or on any error (below).
  std::vector<std::string> temps, backups(files.size());
  std::vector<std::unique_ptr<TempFileGuard>> guards;
  auto remove_all = [&] {
    std::error_code ec;
    for (const std::string& t : temps) fs::remove(t, ec);
    for (const std::string& b : backups)
      if (!b.empty()) fs::remove(b, ec);
  };
  try {
    for (const auto& [path, writer] : files) {
      temps.push_back(temp_path_for(path));
      guards.push_back(std::make_unique<TempFileGuard>(temps.back()));
      write_whole(temps.back(), writer, path);
    }
    // The files go together or not at all: each one replaced is kept as a hard link first, so a
    // later rename that fails (a directory, an immutable file) puts the earlier ones back.
    for (size_t i = 0; i < files.size(); i++) {
      const std::string& path = files[i].first;
      if (!fs::exists(path)) continue;
      backups[i] = temp_path_for(path);
      guards.push_back(std::make_unique<TempFileGuard>(backups[i]));
      if (::link(path.c_str(), backups[i].c_str()) != 0) {
        const int err = errno;
        backups[i].clear();
        throw Error(ErrorKind::data, "cannot write " + path + ": cannot keep the old file while replacing it: " + std::strerror(err));
      }
    }
    for (size_t i = 0; i < files.size(); i++) {
      std::error_code ec;
      fs::rename(temps[i], files[i].first, ec);
      if (!ec) continue;
      for (size_t j = 0; j < i; j++) {  // undo: the old file back, or no file where there was none
        std::error_code undo;
        if (!backups[j].empty()) fs::rename(backups[j], files[j].first, undo);
        else fs::remove(files[j].first, undo);
      }
      throw Error(ErrorKind::data, "cannot write " + files[i].first + ": " + ec.message());
    }
  } catch (...) {
    remove_all();
    throw;
  }
  remove_all();  // the backups (the temps are renamed away)
}

void write_file_atomic(const std::string& path, const std::string& bytes) { write_files_atomic({{path, bytes}}); }

}  // namespace tapelm
