#include "data/outdir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "data/io.h"
#include "data/tempfile.h"

#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000  // Linux 5.8's flag, for headers that predate it
#endif

namespace tapelm {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStageMarker = ".tapelm-staging";
constexpr uint64_t kManifestMaxBytes = 1u << 20;

// An entry name tapelm may write or remove in a folder: one plain component.
bool plain_name(const std::string& n) {
  return !n.empty() && n.size() <= 255 && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

// The lock, the manifest and the manifest's own temporary files: tapelm's bookkeeping.
bool bookkeeping(const std::string& n) {
  const std::string m = kManifestName;
  return n == ".lock" || n == m || (n.rfind(m + ".tmp.", 0) == 0 && n.find_first_not_of("0123456789.", m.size() + 5) == std::string::npos);
}

// "<base>.tmp.<pid>.<k>" (temp_path_for), nested as a temp's temp may be: the base and the pid of
// the outermost ".tmp."; nothing when n is not exactly such a name.
std::optional<std::pair<std::string, long>> temp_name(const std::string& n) {
  const size_t at = n.find(".tmp.");
  if (at == std::string::npos || at == 0) return std::nullopt;
  std::string rest = n.substr(at + 5);
  long pid = -1;
  for (;;) {  // <pid>.<k>, then optionally .tmp.<pid>.<k> again
    const size_t d1 = rest.find_first_not_of("0123456789");
    if (d1 == 0 || d1 == std::string::npos || rest[d1] != '.') return std::nullopt;
    if (pid < 0) pid = std::strtol(rest.substr(0, d1).c_str(), nullptr, 10);
    const size_t d2 = rest.find_first_not_of("0123456789", d1 + 1);
    if (d2 == d1 + 1) return std::nullopt;
    if (d2 == std::string::npos) break;
    if (rest.compare(d2, 5, ".tmp.") != 0) return std::nullopt;
    rest = rest.substr(d2 + 5);
  }
  return std::make_pair(n.substr(0, at), pid);
}

bool process_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

bool lexists(const fs::path& p, struct stat* st = nullptr) {
  struct stat s {};
  const bool ok = ::lstat(p.c_str(), &s) == 0;
  if (st) *st = s;
  return ok;
}

// Removes p if it is a file or a symbolic link (never a folder); true when it is gone.
bool unlink_file(const fs::path& p) {
  struct stat st {};
  if (!lexists(p, &st)) return true;
  if (S_ISDIR(st.st_mode)) return false;
  return ::unlink(p.c_str()) == 0 || errno == ENOENT;
}

// The names in dir. A folder that cannot be listed is an Error: an empty listing would read as a
// folder holding nothing of anyone's.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) names.push_back(it->path().filename().string());
  if (ec) throw Error(ErrorKind::data, "cannot list " + dir.string() + ": " + ec.message());
  return names;
}

// The same where nothing may throw (clean-up): what can be listed.
std::vector<std::string> entries_or_none(const fs::path& dir) noexcept {
  try {
    return entries(dir);
  } catch (...) {
    return {};
  }
}

// The deepest nesting of [ and { outside strings: the manifest is parsed only when shallow.
int json_depth(const std::string& s) {
  int depth = 0, most = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return most;
}

std::string manifest_json(const Manifest& m) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const auto& [name, e] : m.files) {
    nlohmann::ordered_json j = {{"by", e.by}};
    if (!e.id.empty()) j["id"] = e.id;
    files[name] = j;
  }
  nlohmann::ordered_json j = {{"format", "tapelm-manifest"}, {"version", 1}, {"created", m.created}, {"files", files}};
  if (m.temps_of > 0) j["temps_of"] = m.temps_of;
  if (m.replacing) j["replacing"] = true;
  return j.dump(1) + "\n";
}

void write_manifest(const fs::path& dir, const Manifest& m) { write_file_atomic((dir / kManifestName).string(), manifest_json(m)); }

// A mount point (whose folder cannot be renamed, nor files renamed into it from beside it).
bool is_mount_point(const fs::path& dir) {
  struct statx sx {};
  if (::statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) == 0 &&
      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
    return true;
  struct stat a {}, b {};
  if (::stat(dir.c_str(), &a) != 0 || ::stat(dir.parent_path().c_str(), &b) != 0) return true;
  return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

// "HF model" -> "HF-model": the noun as part of a file name.
std::string tag_of(std::string noun) {
  for (char& c : noun)
    if (c == ' ' || c == '/' || c == '.') c = '-';
  return noun;
}

}  // namespace

std::string file_identity(const fs::path& p) {
  struct stat st {};
  if (!lexists(p, &st)) return "";
  char b[96];
  std::snprintf(b, sizeof b, "%llu:%llu:%lld:%lld.%09ld", static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino), static_cast<long long>(st.st_size), static_cast<long long>(st.st_mtim.tv_sec),
                st.st_mtim.tv_nsec);
  return b;
}

// ---- the manifest ------------------------------------------------------------------------------

Manifest read_manifest(const fs::path& dir) {
  const fs::path p = dir / kManifestName;
  const std::string at = "manifest " + p.string() + ": ";
  struct stat st {};
  if (!lexists(p, &st)) return {};
  if (!S_ISREG(st.st_mode)) throw Error(ErrorKind::data, at + "not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kManifestMaxBytes) throw Error(ErrorKind::data, at + "over a megabyte, not tapelm's manifest");
  const std::string text = read_file_bytes(p.string(), "manifest");
  Manifest m;
  try {
    if (json_depth(text) > 4) throw std::runtime_error("nested too deep");
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object() || j.value("format", std::string()) != "tapelm-manifest") throw std::runtime_error("not tapelm's manifest");
    for (const auto& [name, e] : j.at("files").items()) {
      if (!plain_name(name)) throw std::runtime_error("lists \"" + cut_for_message(name) + "\", not a file name");
      m.files[name] = {e.at("by").get<std::string>(), e.value("id", std::string())};
    }
    m.created = j.value("created", false);
    m.temps_of = j.value("temps_of", 0L);
    m.replacing = j.value("replacing", false);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::data, at + "damaged (" + cut_for_message(e.what(), 120) + "); remove it, and tapelm will take no file in " +
                                     dir.string() + " for its own");
  }
  return m;
}

void require_complete_output(const std::string& dir, const std::string& what) {
  const Manifest m = read_manifest(dir);
  if (m.replacing)
    throw Error(ErrorKind::data, what + " " + dir + ": a tapelm write into it (process " + std::to_string(m.temps_of) +
                                     ") ended while replacing its files one at a time, so they may be of two writes; write it again");
}

// ---- outputs and inputs ------------------------------------------------------------------------

void refuse_outputs_over_inputs(const std::vector<FlagPath>& outputs, const std::vector<FlagPath>& inputs) {
  struct Id {
    dev_t dev;
    ino_t ino;
  };
  std::vector<std::pair<Id, const FlagPath*>> in;
  for (const FlagPath& i : inputs) {
    struct stat st {};
    if (!i.path.empty() && ::stat(i.path.c_str(), &st) == 0) in.push_back({{st.st_dev, st.st_ino}, &i});
  }
  for (const FlagPath& o : outputs) {
    if (o.path.empty()) continue;
    std::error_code ec;
    // the output, then each folder above it, as far as they exist (followed through links)
    fs::path p = fs::absolute(o.path, ec).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    for (bool self = true;; self = false) {
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0)
        for (const auto& [id, i] : in)
          if (id.dev == st.st_dev && id.ino == st.st_ino)
            throw Error(ErrorKind::usage, o.flag + " " + o.path + (self ? " is the " + i->flag + " file" : " lies inside the " + i->flag + " folder") +
                                              (self && i->path == o.path ? "" : " " + i->path) + ": write it elsewhere");
      if (p == p.parent_path()) break;
      p = p.parent_path();
    }
  }
}

// ---- OutputFolder ------------------------------------------------------------------------------

OutputFolder::OutputFolder(const std::string& dir, std::string what, ErrorKind kind) : given_(dir), what_(std::move(what)), kind_(kind) {
  const std::string at = what_ + " " + dir + ": ";
  if (dir.empty()) throw Error(ErrorKind::usage, what_ + ": no folder named");
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) throw Error(kind, at + "cannot resolve the path: " + ec.message());
  if (abs.filename().empty()) abs = abs.parent_path();  // "dir/"
  if (abs == abs.root_path()) throw Error(kind, at + "the root folder; name a folder of tapelm's outputs' own");
  const fs::file_status st = fs::status(abs, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) throw Error(kind, at + "exists and is not a directory");
  } else {
    fs::create_directories(abs.parent_path(), ec);
    if (::mkdir(abs.c_str(), 0777) == 0) created_ = true;
    else if (errno != EEXIST) throw Error(kind, at + "cannot create it: " + std::strerror(errno));
  }
  path_ = abs;
  try {
    // a folder with tapelm's manifest may hold a lock file of an older form
    lock_.emplace(given_, kind, created_ || lexists(path_ / kManifestName));
    manifest_ = read_manifest(path_);
  } catch (...) {
    if (created_ && lock_) ::unlink((path_ / ".lock").c_str());  // ours: held
    lock_.reset();
    if (created_) ::rmdir(path_.c_str());  // only when empty: another writer's lock stays
    throw;
  }
  if (created_) {  // a folder of tapelm's is known as such from its first instant on
    Manifest m;
    m.created = true;
    try {
      save(m);
    } catch (...) {
      ::unlink((path_ / ".lock").c_str());
      lock_.reset();
      ::rmdir(path_.c_str());
      throw;
    }
  }
}

OutputFolder::~OutputFolder() {
  if (!created_ || kept_) return;
  // leave nothing new behind: the folder this run made, when it holds only the lock and manifest
  const std::vector<std::string> names = entries_or_none(path_);
  for (const std::string& n : names)
    if (!bookkeeping(n)) return;
  for (const std::string& n : names) ::unlink((path_ / n).c_str());
  lock_.reset();
  ::rmdir(path_.c_str());
}

Error OutputFolder::foreign(const std::string& name) const {
  return Error(kind_, what_ + " " + given_ + ": holds " + name + ", which tapelm did not write (its " + kManifestName +
                          " does not list it as this command's, or it changed since); move it away or choose another folder");
}

bool OutputFolder::owns(const std::string& name, const std::string& by) const {
  const auto it = manifest_.files.find(name);
  return it != manifest_.files.end() && it->second.by == by && (it->second.id.empty() || it->second.id == file_identity(path_ / name));
}

void OutputFolder::refuse_foreign(const std::vector<std::string>& names, const std::string& by) const {
  for (const std::string& n : names)
    if (lexists(path_ / n) && !owns(n, by)) throw foreign(n);
}

void OutputFolder::claim(const std::vector<std::string>& names, const std::string& by) {
  Manifest m = manifest_;
  bool added = false;
  for (const std::string& n : names) {
    if (!plain_name(n)) throw Error(ErrorKind::internal, what_ + " " + given_ + ": \"" + n + "\" is not a file name");
    if (owns(n, by)) continue;
    if (lexists(path_ / n)) throw foreign(n);
    m.files[n] = {by, ""};
    added = true;
  }
  if (added) save(m);
}

void OutputFolder::record(const std::vector<std::string>& names) {
  Manifest m = manifest_;
  for (const std::string& n : names) {
    auto it = m.files.find(n);
    if (it == m.files.end()) throw Error(ErrorKind::internal, what_ + " " + given_ + ": " + n + " was written unclaimed");
    it->second.id = file_identity(path_ / n);
  }
  save(m);
}

void OutputFolder::save(const Manifest& m) {
  write_manifest(path_, m);
  manifest_ = m;
}

// ---- DirectoryCommit ---------------------------------------------------------------------------

namespace {

// What of a staging folder (or of a folder's previous contents, after an exchange) is tapelm's and
// may be removed: its bookkeeping, the staging marker, and `by`'s outputs (with their temporary
// files) that it was building (marked) or that its manifest lists. A folder with neither the
// marker nor a manifest is no one's that tapelm knows, and is left whole. Returns the names left.
std::vector<std::string> remove_own(const fs::path& dir, const std::string& by, const std::function<bool(const std::string&)>& is_output) {
  struct stat st {};
  if (!lexists(dir, &st) || !S_ISDIR(st.st_mode)) return {"."};  // never through a symbolic link
  const bool staging = lexists(dir / kStageMarker);
  Manifest m;
  bool listed = false;
  try {
    listed = lexists(dir / kManifestName);
    m = read_manifest(dir);
  } catch (const Error&) {
    listed = false;
  }
  if (!staging && !listed) {  // an empty one is what a kill between its last file and its rmdir leaves
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return {};
    return {"."};
  }
  auto own = [&](const std::string& n) {
    if (bookkeeping(n) || n == kStageMarker) return true;
    const auto t = temp_name(n);
    const std::string base = t ? t->first : n;
    if (!is_output(base)) return false;
    const auto e = m.files.find(base);
    return staging || (e != m.files.end() && e->second.by == by);
  };
  std::vector<std::string> left;
  for (const std::string& n : entries_or_none(dir)) {
    if (n == kManifestName || n == kStageMarker) continue;  // last: they say what the rest is
    if (!own(n) || !unlink_file(dir / n)) left.push_back(n);
  }
  if (left.empty()) {
    unlink_file(dir / kStageMarker);
    unlink_file(dir / kManifestName);
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) left.push_back(".");
  }
  return left;
}

}  // namespace

DirectoryCommit::DirectoryCommit(const std::string& out, const std::string& noun, std::function<bool(const std::string&)> is_output,
                                 ErrorKind kind)
    : folder_(out, noun + " directory", kind), noun_(noun), is_output_(std::move(is_output)), kind_(kind) {
  const fs::path& dir = folder_.path();
  Manifest m = folder_.manifest();
  // A write that put files in one at a time and was killed: its temporary files are its own (the
  // lock is ours, so that process is gone).
  if (m.temps_of > 0) {
    for (const std::string& n : entries(dir)) {
      const auto t = temp_name(n);
      struct stat st {};
      if (t && t->second == m.temps_of && is_output_(t->first) && lexists(dir / n, &st) && S_ISREG(st.st_mode)) unlink_file(dir / n);
    }
  }
  // Another program's model, another command's file of one of these names, or one changed since
  // tapelm wrote it: refused before any work.
  for (const std::string& n : entries(dir)) {
    if (bookkeeping(n)) continue;
    const auto e = m.files.find(n);
    if (e == m.files.end() ? is_output_(n) : (e->second.by == noun_ ? !folder_.owns(n, noun_) : is_output_(n))) throw folder_.foreign(n);
  }
  // The set is built beside the folder when it can be renamed into it: not across a mount.
  const fs::path parent = dir.parent_path();
  const std::string prefix = "." + dir.filename().string() + "." + tag_of(noun) + ".";
  for (const std::string& n : entries_or_none(parent)) {  // what killed writers of this folder left beside it
    if (n.rfind(prefix, 0) != 0) continue;
    const std::string rest = n.substr(prefix.size());
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    if (pid == ::getpid() || process_gone(pid)) remove_own(parent / n, noun_, is_output_);
  }
  if (!is_mount_point(dir)) {
    const fs::path stage = parent / (prefix + std::to_string(::getpid()));
    if (::mkdir(stage.c_str(), 0777) == 0) {
      // the marker first, in one step: a killed run's folder is then empty or marked as tapelm's
      const int fd = ::open((stage / kStageMarker).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::close(fd);
        stage_ = stage;
        stage_guard_.emplace(stage_.string());
      } else {
        ::rmdir(stage.c_str());
      }
    }
  }
  temps_guard_.emplace(dir.string(), ".tmp." + std::to_string(::getpid()) + ".");
  if (stage_.empty()) {  // temporary files beside their targets, in the folder: the manifest says whose
    m.temps_of = ::getpid();
    folder_.save(m);
  }
}

DirectoryCommit::~DirectoryCommit() {
  if (committed_) return;
  clean_stage();
}

void DirectoryCommit::clean_stage() noexcept {
  try {
    if (!stage_.empty()) {
      remove_own(stage_, noun_, is_output_);
      stage_.clear();
      return;
    }
    for (const auto& [name, p] : where_) unlink_file(p);
    Manifest m = folder_.manifest();
    if (m.temps_of == ::getpid() && !m.replacing) {
      m.temps_of = 0;
      folder_.save(m);
    }
  } catch (...) {
  }
}

std::string DirectoryCommit::path(const std::string& name) {
  if (!plain_name(name) || !is_output_(name))
    throw Error(ErrorKind::internal, folder_.what() + " " + folder_.given() + ": \"" + name + "\" is not a name of its files");
  if (auto it = where_.find(name); it != where_.end()) return it->second;
  const std::string p = stage_.empty() ? reserve_temp_for((folder_.path() / name).string()) : (stage_ / name).string();
  names_.push_back(name);
  where_[name] = p;
  return p;
}

void DirectoryCommit::commit() {
  for (const std::string& n : names_) {
    struct stat st {};
    if (!lexists(where_[n], &st) || !S_ISREG(st.st_mode))
      throw Error(ErrorKind::internal, folder_.what() + " " + folder_.given() + ": " + n + " was never written");
    sync_path(where_[n]);
  }
  exchanged_ = !stage_.empty() && exchange();
  if (!exchanged_) file_by_file();
  committed_ = true;
  folder_.keep();
  if (!stage_.empty()) {
    const std::vector<std::string> left = remove_own(stage_, noun_, is_output_);
    if (!left.empty())
      std::fprintf(stderr, "tapelm: warning: the previous %s could not be removed whole: %s holds what is left (%s)\n", noun_.c_str(),
                   stage_.c_str(), left.front().c_str());
  }
}

// The folder is tapelm's and holds only this command's earlier outputs, as it wrote them: the new
// set, built beside it, takes its place in one rename, and the previous set is then removed. False
// (nothing touched) when that cannot be done here: the file-by-file way follows.
bool DirectoryCommit::exchange() {
  const fs::path& dir = folder_.path();
  const Manifest old = folder_.manifest();
  auto only_ours = [&](const fs::path& d) {
    for (const std::string& n : entries(d)) {
      if (bookkeeping(n)) continue;
      const auto e = old.files.find(n);
      struct stat st {};
      if (e == old.files.end() || e->second.by != noun_ || !is_output_(n) || !lexists(d / n, &st) || !S_ISREG(st.st_mode) ||
          (!e->second.id.empty() && e->second.id != file_identity(d / n)))
        return false;
    }
    return true;
  };
  if (!old.created || !only_ours(dir)) return false;
  Manifest now;
  now.created = true;
  for (const std::string& n : names_) now.files[n] = {noun_, file_identity(stage_ / n)};  // a rename keeps each
  write_manifest(stage_, now);
  // the lock goes with the folder: the same file, so it stays held
  if (::link((dir / ".lock").c_str(), (stage_ / ".lock").c_str()) != 0) return false;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    ::chmod(stage_.c_str(), st.st_mode & 07777);
    if (::chown(stage_.c_str(), st.st_uid, st.st_gid) != 0) {
    }  // another owner's folder stays another's where this process may say so
  }
  ::unlink((stage_ / kStageMarker).c_str());
  sync_path(stage_.string(), true);
  if (!only_ours(dir)) return false;  // something arrived meanwhile: file by file instead
  if (::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) return false;
  // stage_ now holds the previous contents; had anything but tapelm's arrived in the last instant,
  // the folders are swapped back and nothing has moved
  bool ours = false;
  try {
    ours = only_ours(stage_);
  } catch (const Error&) {
  }
  if (!ours) {
    if (::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) return false;
    throw Error(kind_, folder_.what() + " " + folder_.given() + ": a file arrived in it during the write, and the folder could not be put back: " +
                           std::strerror(errno) + "; the previous contents are in " + stage_.string());
  }
  // marked at once: a kill from here on leaves the previous contents as a staging folder's
  const int fd = ::open((stage_ / kStageMarker).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  folder_.adopt(now);
  sync_path(dir.parent_path().string(), true);
  return true;
}

// Each file is renamed onto its target. The manifest lists the new files before any is replaced
// and says so while they are; it records the new files' identities once all are in and tapelm's
// earlier outputs that they do not replace are removed. A kill leaves every file listed and the
// set marked; a failure leaves the set as it was, or marked.
void DirectoryCommit::file_by_file() {
  const fs::path& dir = folder_.path();
  const Manifest before = folder_.manifest();
  for (const std::string& n : names_) {
    struct stat st {};
    if (!lexists(dir / n, &st)) continue;
    if (!folder_.owns(n, noun_)) throw folder_.foreign(n);  // arrived or changed during the write
    if (S_ISDIR(st.st_mode)) throw Error(kind_, folder_.what() + " " + folder_.given() + ": " + n + " is a directory");
  }
  Manifest m = before;
  for (const std::string& n : names_) m.files[n] = {noun_, ""};
  m.temps_of = ::getpid();
  m.replacing = true;
  std::vector<std::string> temps, targets;
  for (const std::string& n : names_) {
    temps.push_back(where_[n]);
    targets.push_back((dir / n).string());
  }
  bool restored = true;  // every file as it was
  try {
    folder_.save(m);
    replace_files(temps, targets, &restored);
  } catch (const Error& e) {
    if (restored) {  // the folder as before this write, its manifest too
      Manifest back = before;
      back.temps_of = ::getpid();  // this write's temporary files, until they are removed
      try {
        folder_.save(back);
      } catch (const Error& again) {
        throw Error(kind_, folder_.what() + " " + folder_.given() + ": " + e.what() + "; and its " + kManifestName +
                               " could not be written after it (" + again.what() + ")");
      }
    }
    throw Error(kind_, folder_.what() + " " + folder_.given() + ": " + e.what() +
                           (restored ? "" : std::string("; its ") + kManifestName + " marks its files as written halfway"));
  }
  // tapelm's earlier outputs that the new set does not replace; one that cannot be removed leaves
  // the set marked (a reader could take it for the new set's)
  const std::set<std::string> now(names_.begin(), names_.end());
  std::string stuck;
  for (const auto& [n, e] : before.files)
    if (!now.count(n) && e.by == noun_ && is_output_(n)) {
      if (unlink_file(dir / n)) m.files.erase(n);
      else if (stuck.empty()) stuck = n;
    }
  for (const std::string& n : names_) m.files[n].id = file_identity(dir / n);
  // a backup that could not be removed stays this process's, for the next writer to remove
  m.temps_of = 0;
  for (const std::string& n : entries_or_none(dir)) {
    const auto t = temp_name(n);
    if (t && t->second == ::getpid() && is_output_(t->first) && !unlink_file(dir / n)) m.temps_of = ::getpid();
  }
  m.replacing = !stuck.empty();
  if (m.replacing) m.temps_of = ::getpid();
  try {
    folder_.save(m);
  } catch (const Error& e) {
    throw Error(kind_, folder_.what() + " " + folder_.given() + ": its files are in place, but its " + kManifestName +
                           " could not be written (" + e.what() + ")");
  }
  if (!stuck.empty())
    throw Error(kind_, folder_.what() + " " + folder_.given() + ": the new files are in place, but the earlier " + stuck +
                           " could not be removed: remove it, and write the folder again");
}

}  // namespace tapelm
