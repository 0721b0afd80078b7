#include "data/io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "data/tempfile.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

const uint64_t page_bytes = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// An output must be absent or a regular file: renaming over a device or a FIFO would replace it.
void require_replaceable(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return;
  if (fs::is_directory(st)) throw Error(ErrorKind::data, "cannot write " + path + ": is a directory");
  if (!fs::is_regular_file(st))
    throw Error(ErrorKind::data, "cannot write " + path + ": it exists and is not a regular file (a device, FIFO or socket)");
}

std::string parent_of(const std::string& path) {
  const fs::path d = fs::path(path).parent_path();
  return d.empty() ? "." : d.string();
}

// Rename errors a sync of the directory may give on file systems that cannot sync one.
bool unsyncable(int err) { return err == EINVAL || err == EROFS || err == ENOTSUP; }

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

// ---- MappedFile -----------------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  require_regular_file(path, what);
  const std::string at = what + " " + path + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorKind::data, at + "cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorKind::data, at + "cannot stat: " + std::strerror(err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* a = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    if (a == MAP_FAILED) {
      ::close(fd);
      throw Error(ErrorKind::data, at + "cannot map: " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(a);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedFile::advise_random() const {
  if (data_) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_RANDOM);
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (!data_ || begin >= end) return;
  // A fault maps more than the page it touches (fault-around, large page-cache folios), so the
  // 2 MiB-aligned span around [begin, end) is dropped, within the mapping: the pages stay in the
  // page cache, and a neighbouring read that needs one again maps it back cheaply.
  const uint64_t span = 2u << 20;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  const uint64_t lo = std::max<uint64_t>(0, (base + begin) / span * span), hi = (base + end + span - 1) / span * span;
  const uint64_t a = std::max<uint64_t>(base, lo), z = std::min<uint64_t>((base + size_ + page_bytes - 1) / page_bytes * page_bytes, hi);
  if (z > a) ::madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED);
}

std::string file_digest(const std::string& path, const std::string& what) {
  const MappedFile f(path, what);
  // Four lanes of 64-bit multiply-xorshift over 8-byte words, then the tail and the length: a
  // fast non-cryptographic digest (several GB/s), enough to tell one model file from another.
  constexpr uint64_t k = 0x9E3779B97F4A7C15ull;
  auto mix = [](uint64_t h, uint64_t w) {
    h = (h ^ w) * k;
    return h ^ (h >> 29);
  };
  uint64_t lane[4] = {1, 2, 3, 4};
  const uint8_t* p = f.data();
  const uint64_t n = f.size(), body = n / 32 * 32, chunk = 64u << 20;
  for (uint64_t at = 0; at < body; at += 32) {
    for (int j = 0; j < 4; j++) {
      uint64_t w;
      std::memcpy(&w, p + at + 8 * j, 8);
      lane[j] = mix(lane[j], w);
    }
    if ((at + 32) % chunk == 0) f.release(at + 32 - chunk, at + 32);  // a file larger than memory stays out of the RSS
  }
  uint64_t h = mix(mix(mix(mix(n, lane[0]), lane[1]), lane[2]), lane[3]);
  for (uint64_t at = body; at < n; at++) h = mix(h, p[at]);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(mix(h, n)));
  return out;
}

// ---- writing ----------------------------------------------------------------------------------------

void sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) throw Error(ErrorKind::data, "cannot write " + path + ": cannot open it to sync: " + std::strerror(errno));
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0 && !(directory && unsyncable(err)))
    throw Error(ErrorKind::data, "cannot write " + path + ": cannot sync it to disk: " + std::strerror(err));
}

void commit_together(const std::vector<std::string>& paths, const std::function<void(const std::vector<std::string>& temps)>& write) {
  for (const std::string& path : paths) {
    remove_stale_temps(path);
    require_replaceable(path);
  }
  // Temps and backups are removed if a signal ends the process (guards) or on any error (below).
  std::vector<std::string> temps, backups(paths.size());
  std::vector<std::unique_ptr<TempFileGuard>> guards;
  auto remove_all = [&] {
    std::error_code ec;
    for (const std::string& t : temps) fs::remove(t, ec);
    for (const std::string& b : backups)
      if (!b.empty()) fs::remove(b, ec);
  };
  try {
    for (const std::string& path : paths) {
      temps.push_back(temp_path_for(path));
      guards.push_back(std::make_unique<TempFileGuard>(temps.back()));
    }
    write(temps);
    for (const std::string& t : temps) sync_path(t);
    // The files go together or not at all: each one replaced is kept as a hard link first, so a
    // later rename that fails (a directory, an immutable file) puts the earlier ones back.
    for (size_t i = 0; i < paths.size(); i++) {
      const std::string& path = paths[i];
      if (!fs::exists(path)) continue;
      backups[i] = temp_path_for(path);
      guards.push_back(std::make_unique<TempFileGuard>(backups[i]));
      if (::link(path.c_str(), backups[i].c_str()) != 0) {
        const int err = errno;
        backups[i].clear();
        throw Error(ErrorKind::data, "cannot write " + path + ": cannot keep the old file while replacing it: " + std::strerror(err));
      }
    }
    for (size_t i = 0; i < paths.size(); i++) {
      std::error_code ec;
      fs::rename(temps[i], paths[i], ec);
      if (!ec) continue;
      for (size_t j = 0; j < i; j++) {  // undo: the old file back, or no file where there was none
        std::error_code undo;
        if (!backups[j].empty()) fs::rename(backups[j], paths[j], undo);
        else fs::remove(paths[j], undo);
      }
      throw Error(ErrorKind::data, "cannot write " + paths[i] + ": " + ec.message());
    }
  } catch (...) {
    remove_all();
    throw;
  }
  remove_all();  // the backups (the temps are renamed away)
  std::set<std::string> dirs;
  for (const std::string& path : paths) dirs.insert(parent_of(path));
  for (const std::string& d : dirs) sync_path(d, true);
}

void commit_files(const std::vector<std::pair<std::string, PathWriter>>& files) {
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.first);
  commit_together(paths, [&](const std::vector<std::string>& temps) {
    for (size_t i = 0; i < files.size(); i++) files[i].second(temps[i]);
  });
}

void write_files_atomic_streamed(const std::vector<std::pair<std::string, StreamWriter>>& files) {
  std::vector<std::pair<std::string, PathWriter>> writers;
  for (const auto& [path, stream] : files)
    writers.emplace_back(path, [&path = path, &stream = stream](const std::string& tmp) {
      errno = 0;
      File f(std::fopen(tmp.c_str(), "wb"));
      if (!f) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
      stream(f.get());
      if (std::fflush(f.get()) != 0) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
      if (std::fclose(f.release()) != 0) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
    });
  commit_files(writers);
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

void write_file_atomic(const std::string& path, const std::string& bytes) { write_files_atomic({{path, bytes}}); }

// ---- DirectoryCommit --------------------------------------------------------------------------------

namespace {

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// The sibling a directory output is built in; those of processes that no longer run (killed
// mid-build) are removed.
fs::path build_dir_for(const fs::path& out, const std::string& tag) {
  const std::string prefix = "." + out.filename().string() + "." + tag + ".";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(n.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) remove_tree(e.path());
  }
  return out.parent_path() / (prefix + std::to_string(::getpid()));
}

// "HF model" -> "HF-model": the noun as part of a file name.
std::string tag_of(std::string noun) {
  for (char& c : noun)
    if (c == ' ' || c == '/' || c == '.') c = '-';
  return noun;
}

}  // namespace

DirectoryCommit::DirectoryCommit(const std::string& out, const std::string& noun, std::function<bool(const std::string&)> is_output,
                                 ErrorKind kind)
    : noun_(noun), is_output_(std::move(is_output)), kind_(kind) {
  out_ = fs::absolute(out).lexically_normal();
  if (out_.filename().empty()) out_ = out_.parent_path();  // "dir/"
  std::error_code ec;
  const fs::file_status st = fs::status(out_, ec);
  existed_ = fs::exists(st);
  if (existed_ && !fs::is_directory(st)) throw Error(kind, "output directory " + out + ": cannot create: a file of that name exists");
  lock_.emplace(out_.string(), kind);  // one writer: a second one fails here
  built_ = build_dir_for(out_, tag_of(noun));
  remove_tree(built_);
  fs::create_directory(built_, ec);
  if (ec) {
    lock_.reset();
    if (!existed_) remove_tree(out_);
    throw Error(kind, "output directory " + out + ": cannot write beside it: " + ec.message());
  }
}

DirectoryCommit::~DirectoryCommit() {
  if (committed_) return;
  remove_tree(built_);
  if (!existed_) {  // leave nothing new behind: the directory this run made for its lock
    std::error_code ec;
    fs::remove(out_ / ".lock", ec);
    lock_.reset();
    fs::remove(out_, ec);
  }
}

void DirectoryCommit::commit() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(built_, ec))
    if (e.is_regular_file()) sync_path(e.path().string());
  for (const auto& e : fs::directory_iterator(out_, ec)) {
    const std::string n = e.path().filename().string();
    if (is_output_(n)) continue;
    const fs::path to = built_ / n;
    if (fs::exists(to)) continue;  // the new contents have a file of that name
    std::error_code mv;
    if (e.is_regular_file() ? ::link(e.path().c_str(), to.c_str()) != 0 : (fs::rename(e.path(), to, mv), bool(mv)))
      throw Error(kind_, "cannot write " + out_.string() + ": cannot carry " + n + " over to the new contents");
  }
  sync_path(built_.string(), true);
  if (::renameat2(AT_FDCWD, built_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) != 0)
    throw Error(kind_, "cannot write " + out_.string() + ": cannot swap in the new contents: " + std::strerror(errno));
  committed_ = true;
  sync_path(out_.parent_path().string(), true);
  fs::remove_all(built_, ec);
  if (ec)
    std::fprintf(stderr, "tapelm: warning: the previous %s could not be removed whole: %s holds what is left (%s)\n",
                 noun_.c_str(), built_.c_str(), ec.message().c_str());
}

}  // namespace tapelm
