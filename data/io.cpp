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
#include <mutex>
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

namespace {

// The mappings alive, for the SIGBUS handler: a file truncated under a mapping faults on the
// first page past its new end. The handler names the file, removes this process's temporary
// files and ends the process (exit 1), with async-signal-safe calls alone.
constexpr int kMapSlots = 4096;  // a kept model maps each matrix: a 7B's 225, a 70B's 561
constexpr size_t kMapPath = 512;
struct MapSlot {
  volatile sig_atomic_t used;
  uintptr_t begin, end;
  char path[kMapPath];
};
MapSlot g_maps[kMapSlots];
std::mutex g_maps_mutex;

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w, n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (const MapSlot& m : g_maps)
    if (m.used && at >= m.begin && at < m.end) {
      write_all("tapelm: error: ");
      write_all(m.path);
      write_all(": the file shrank while it was read (truncated or rewritten in place): nothing of it was used; read it again once it is written whole\n");
      remove_guarded_now();
      ::_exit(1);
    }
  ::signal(sig, SIG_DFL);  // not a mapping of ours: the default action
  ::raise(sig);
}

int register_mapping(const uint8_t* data, uint64_t size, const std::string& what, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_maps_mutex);
  // (again whenever another handler took SIGBUS since: a test harness installs its own per test)
  struct sigaction now {};
  if (::sigaction(SIGBUS, nullptr, &now) == 0 && !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)) {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  }
  for (int i = 0; i < kMapSlots; i++)
    if (!g_maps[i].used) {
      const std::string name = cut_for_message(what + " " + path, kMapPath - 1);
      std::memcpy(g_maps[i].path, name.c_str(), name.size() + 1);
      g_maps[i].begin = reinterpret_cast<uintptr_t>(data);
      g_maps[i].end = g_maps[i].begin + size;
      g_maps[i].used = 1;
      return i;
    }
  return -1;  // more mappings than slots: SIGBUS then ends the process by its default action
}

void unregister_mapping(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_maps_mutex);
  g_maps[slot].used = 0;
}

int64_t mtime_ns(const struct stat& st) { return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

MappedFile::MappedFile(const std::string& path, const std::string& what, uint64_t offset, uint64_t length, bool populate)
    : path_(path), what_(what) {
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
  file_size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = mtime_ns(st);
  dev_ = static_cast<uint64_t>(st.st_dev), ino_ = static_cast<uint64_t>(st.st_ino);
  if (offset > file_size_ || (length != UINT64_MAX && length > file_size_ - offset)) {
    ::close(fd);
    throw Error(ErrorKind::data, at + "holds " + std::to_string(file_size_) + " bytes, fewer than the " + std::to_string(offset) + " + " +
                                     std::to_string(length) + " read from it (truncated?)");
  }
  size_ = length == UINT64_MAX ? file_size_ - offset : length;
  if (size_ > 0) {
    const uint64_t aligned = offset / page_bytes * page_bytes;
    base_len_ = size_ + (offset - aligned);
    void* a = ::mmap(nullptr, base_len_, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, static_cast<off_t>(aligned));
    const int err = errno;
    if (a == MAP_FAILED) {
      ::close(fd);
      throw Error(ErrorKind::data, at + "cannot map: " + std::strerror(err));
    }
    base_ = static_cast<const uint8_t*>(a);
    data_ = base_ + (offset - aligned);
    slot_ = register_mapping(base_, base_len_, what, path);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  unregister_mapping(slot_);
  if (base_) ::munmap(const_cast<uint8_t*>(base_), base_len_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      what_(std::move(o.what_)),
      base_(std::exchange(o.base_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      base_len_(std::exchange(o.base_len_, 0)),
      file_size_(o.file_size_),
      dev_(o.dev_),
      ino_(o.ino_),
      mtime_ns_(o.mtime_ns_),
      slot_(std::exchange(o.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unregister_mapping(slot_);
    if (base_) ::munmap(const_cast<uint8_t*>(base_), base_len_);
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    base_ = std::exchange(o.base_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    base_len_ = std::exchange(o.base_len_, 0);
    file_size_ = o.file_size_, dev_ = o.dev_, ino_ = o.ino_;
    mtime_ns_ = o.mtime_ns_;
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

bool MappedFile::same_file_as(const MappedFile& o) const {
  return dev_ == o.dev_ && ino_ == o.ino_ && file_size_ == o.file_size_ && mtime_ns_ == o.mtime_ns_;
}

void MappedFile::check_unchanged() const {
  // The path's file: another file renamed over it, or none, leaves the mapped one intact (it lives
  // while mapped); the same file written or cut in place does not.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_) return;
  const auto now = static_cast<uint64_t>(st.st_size);
  if (now != file_size_ || mtime_ns(st) != mtime_ns_)
    throw Error(ErrorKind::data, what_ + " " + path_ + ": changed while it was read (" +
                                     (now != file_size_ ? std::to_string(file_size_) + " bytes, now " + std::to_string(now) : std::string("written again")) +
                                     "): nothing of it was used; read it again once it is written whole");
}

void MappedFile::advise_random() const {
  if (base_) ::madvise(const_cast<uint8_t*>(base_), base_len_, MADV_RANDOM);
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (!data_ || begin >= end) return;
  // A fault maps more than the page it touches (fault-around, large page-cache folios), so the
  // 2 MiB-aligned span around [begin, end) is dropped, within the mapping: the pages stay in the
  // page cache, and a neighbouring read that needs one again maps it back cheaply.
  const uint64_t span = 2u << 20;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  const uint64_t lo = std::max<uint64_t>(0, (base + begin) / span * span), hi = (base + end + span - 1) / span * span;
  const auto first = reinterpret_cast<uintptr_t>(base_);
  const uint64_t a = std::max<uint64_t>(first, lo), z = std::min<uint64_t>((first + base_len_ + page_bytes - 1) / page_bytes * page_bytes, hi);
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

void replace_files(const std::vector<std::string>& temps, const std::vector<std::string>& paths, bool* restored) {
  if (restored) *restored = true;
  // The files go together or not at all: each one replaced is kept as a hard link first, so a
  // later rename that fails (a directory, an immutable file) puts the earlier ones back. One file
  // needs no backup (its rename is all or nothing), nor can a file system without hard links keep
  // one: there the files before a failed rename stay new.
  std::vector<std::string> backups(paths.size());
  std::vector<bool> had_old(paths.size(), false);
  std::vector<std::unique_ptr<TempFileGuard>> guards;
  auto remove_backups = [&] {
    std::error_code ec;
    for (const std::string& b : backups)
      if (!b.empty()) fs::remove(b, ec);
  };
  try {
    for (size_t i = 0; i < paths.size(); i++) {
      const std::string& path = paths[i];
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      had_old[i] = true;
      if (paths.size() == 1) break;
      backups[i] = temp_path_for(path);
      guards.push_back(std::make_unique<TempFileGuard>(backups[i]));
      if (::link(path.c_str(), backups[i].c_str()) != 0) {
        const int err = errno;
        backups[i].clear();
        if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS || err == EMLINK) continue;
        throw Error(ErrorKind::data, "cannot write " + path + ": cannot keep the old file while replacing it: " + std::strerror(err));
      }
    }
    for (size_t i = 0; i < paths.size(); i++) {
      std::error_code ec;
      // a target that was absent stays absent until this rename: what arrived meanwhile is not
      // replaced (renameat2's RENAME_NOREPLACE, where the file system has it)
      if (!had_old[i] && ::renameat2(AT_FDCWD, temps[i].c_str(), AT_FDCWD, paths[i].c_str(), RENAME_NOREPLACE) == 0) continue;
      if (!had_old[i] && errno != EINVAL && errno != ENOSYS) ec = std::error_code(errno, std::generic_category());
      else fs::rename(temps[i], paths[i], ec);
      if (!ec) continue;
      for (size_t j = 0; j < i; j++) {  // undo: the old file back, or no file where there was none
        std::error_code undo;
        if (!backups[j].empty()) fs::rename(backups[j], paths[j], undo);
        else if (!had_old[j]) fs::remove(paths[j], undo);
        else undo = std::make_error_code(std::errc::operation_not_supported);
        if (undo && restored) *restored = false;
      }
      throw Error(ErrorKind::data, "cannot write " + paths[i] + ": " + ec.message());
    }
  } catch (...) {
    remove_backups();
    throw;
  }
  remove_backups();
  std::set<std::string> dirs;
  for (const std::string& path : paths) dirs.insert(parent_of(path));
  try {
    for (const std::string& d : dirs) sync_path(d, true);
  } catch (const Error&) {
    if (restored) *restored = false;  // every file is new, but not known to be on disk
    throw;
  }
}

void commit_together(const std::vector<std::string>& paths, const std::function<void(const std::vector<std::string>& temps)>& write) {
  for (const std::string& path : paths) {
    // the folders above an output are made when missing, as for an output folder (transformers'
    // save_pretrained and nanoGPT's out_dir do the same): one rule for every output
    std::error_code ec;
    const fs::path parent = parent_of(path);
    if (!fs::is_directory(parent, ec)) {
      fs::create_directories(parent, ec);
      if (ec) throw Error(ErrorKind::data, "cannot write " + path + ": cannot create the folder " + parent.string() + ": " + ec.message());
    }
    remove_stale_temps(path);
    require_replaceable(path);
  }
  // The temps are removed if a signal ends the process (guards) or on any error (below).
  std::vector<std::string> temps;
  std::vector<std::unique_ptr<TempFileGuard>> guards;
  auto remove_temps = [&] {
    std::error_code ec;
    for (const std::string& t : temps) fs::remove(t, ec);
  };
  try {
    for (const std::string& path : paths) {
      temps.push_back(reserve_temp_for(path));
      guards.push_back(std::make_unique<TempFileGuard>(temps.back()));
    }
    write(temps);
    for (const std::string& t : temps) sync_path(t);
    replace_files(temps, paths);
  } catch (...) {
    remove_temps();
    throw;
  }
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

}  // namespace tapelm
