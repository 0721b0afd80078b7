// No tapelm write moves, renames or deletes anything in its output folder that it did not write
// (docs/reliability.md). `convert --format hf`, `export --format hf` and `prepare`, through the real
// binary, into folders of every kind the test makes (a new one, an empty one, an earlier output of
// tapelm's, a user's folder with sub-folders, files and a symbolic link beside an earlier output or
// alone, with a mounted sub-folder, a mount point, another model's files, the command's own source
// inside it), at every failure point (RENAME_EXCHANGE unsupported, the staging folder refused, each
// file-system call of the write failing with EIO or killed with SIGKILL, the disk full), checked
// against a listing of every user file before and after. The faults come from tests/shim/failshim.c,
// preloaded into the binary; the mounts live in a mount namespace of this process alone, and `/` is
// a chroot of the test's own making. Nothing outside a folder the test made is ever written.
#include <boost/test/unit_test.hpp>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "data/dataset.h"
#include "data/io.h"
#include "data/outdir.h"
#include "train/formats/hf.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;

BOOST_AUTO_TEST_SUITE(outputs)

namespace {

std::string shim() {
  if (const char* p = std::getenv("TAPELM_FAILSHIM_LIB"); p && *p) return p;
  return (fs::canonical("/proc/self/exe").parent_path() / "libtapelm_failshim.so").string();
}

bool sanitized_binary() { return std::string(TAPELM_BINARY).find("_asan") != std::string::npos; }

// The binary, its OpenMP wait policy given (which spares each of the suite's thousand start-ups
// tapelm's re-execution to set it).
std::string plain() { return "GOMP_SPINCOUNT=10000 " + std::string(TAPELM_BINARY) + " --threads 1 "; }

// The binary with the fault shim preloaded (ASan accepts a library before its runtime when told).
std::string faulty(const std::string& faults, const std::string& log = "") {
  std::string env = "env LD_PRELOAD=" + shim() + " TAPELM_FAILSHIM='" + faults + "'";
  if (!log.empty()) env += " TAPELM_FAILSHIM_LOG=" + log;
  if (sanitized_binary()) env += " ASAN_OPTIONS=\"$ASAN_OPTIONS:verify_asan_link_order=0\"";
  return env + " " + plain();
}

// ---- the commands, each with an older and a newer output -----------------------------------------

struct Sources {
  TempDir d;
  std::string hf, ck_old, ck_new, text_old, text_new;
  int64_t tokens_old = 0, tokens_new = 0;
  Sources() {
    hf = fixture_path("hf/llama_mha_f32");
    ck_old = d / "old.h5";
    ck_new = d / "new.h5";
    BOOST_TEST_REQUIRE(run_cli("convert --from " + hf + " --kv-heads 2 --out " + ck_old).code == 0);
    BOOST_TEST_REQUIRE(run_cli("convert --from " + hf + " --kv-heads 1 --out " + ck_new).code == 0);
    const std::string all = slurp(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt");
    text_old = d / "old.txt";
    text_new = d / "new.txt";
    write_bytes(text_old, all.substr(0, 3000));
    write_bytes(text_new, all.substr(0, 5000));
  }
};

const Sources& sources() {
  static Sources s;
  return s;
}

enum class Cmd { convert, export_, prepare };
const Cmd kCmds[] = {Cmd::convert, Cmd::export_, Cmd::prepare};

std::string cmd_name(Cmd c) {
  return c == Cmd::convert ? "convert --format hf" : c == Cmd::export_ ? "export --format hf" : "prepare";
}

// The command's arguments writing the older or the newer output into out.
std::string args(Cmd c, bool newer, const std::string& out) {
  const Sources& s = sources();
  switch (c) {
    case Cmd::convert:
      return "convert --from " + s.hf + " --kv-heads " + (newer ? "1" : "2") + " --format hf --out " + out;
    case Cmd::export_:
      return "export --checkpoint " + (newer ? s.ck_new : s.ck_old) + " --format hf --out " + out;
    default:
      return "prepare --quiet --text " + (newer ? s.text_new : s.text_old) + " --out " + out;
  }
}

// What the folder holds as tapelm's readers see it: "old", "new", "none" (no output of this
// command), "interrupted" (refused: a file-by-file write ended midway), or "broken: <why>".
std::string state_of(Cmd c, const std::string& out) {
  const bool hf = c != Cmd::prepare;
  if (!fs::exists(fs::path(out) / (hf ? "config.json" : "meta.json"))) {
    try {
      if (read_manifest(out).replacing) return "interrupted";
    } catch (const Error&) {
    }
    return "none";
  }
  try {
    if (hf) {
      const int64_t kv = hf::open_model(out).config.n_kv_head;
      return kv == 2 ? "old" : kv == 1 ? "new" : "broken: " + std::to_string(kv) + " KV heads";
    }
    const Corpus corpus = load_corpus(out);
    const int64_t n = corpus.train.size() + corpus.val.size();
    return n == 3000 ? "old" : n == 5000 ? "new" : "broken: " + std::to_string(n) + " tokens";
  } catch (const Error& e) {
    const std::string m = e.what();
    return m.find("ended while replacing") != std::string::npos ? "interrupted" : "broken: " + m;
  }
}

// ---- the folders ---------------------------------------------------------------------------------

// Every entry below root, recursively (not into symbolic links): path -> kind and content. Only
// entries under the top-level names in `only` (all when empty).
// one_file_system: a folder on another file system than root's (a mount) is listed, not entered:
// the chroot's read-only binds of the build and source folders change while other suites run.
std::map<std::string, std::string> listing(const fs::path& root, const std::set<std::string>& only = {}, bool one_file_system = false) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (!fs::exists(root)) return out;
  struct stat root_st {};
  ::stat(root.c_str(), &root_st);
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::none, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path rel = fs::relative(it->path(), root);
    if (!only.empty() && !only.count(rel.begin()->string())) {
      if (it->is_directory() && !it->is_symlink()) it.disable_recursion_pending();
      continue;
    }
    const fs::file_status st = it->symlink_status();
    struct stat here {};
    if (one_file_system && fs::is_directory(st) && ::lstat(it->path().c_str(), &here) == 0 && here.st_dev != root_st.st_dev) {
      out[rel.string()] = "mount";
      it.disable_recursion_pending();
    } else if (fs::is_symlink(st)) out[rel.string()] = "link -> " + fs::read_symlink(it->path()).string();
    else if (fs::is_directory(st)) out[rel.string()] = "dir";
    else out[rel.string()] = "file " + slurp(it->path().string());
  }
  return out;
}

// The user's things: six projects of nested files, two files, a symbolic link to a project.
std::set<std::string> make_user_files(const fs::path& dir) {
  std::set<std::string> names{"notes.txt", "todo.txt", "latest"};
  for (int i = 1; i <= 6; i++) {
    const fs::path p = dir / ("project" + std::to_string(i));
    fs::create_directories(p / "chapters");
    write_bytes((p / "draft.txt").string(), "chapter " + std::to_string(i) + "\n");
    write_bytes((p / "chapters" / "one.md").string(), "# one of " + std::to_string(i) + "\n");
    names.insert(p.filename().string());
  }
  write_bytes((dir / "notes.txt").string(), "notes\n");
  write_bytes((dir / "todo.txt").string(), "todo\n");
  fs::create_directory_symlink("project1", dir / "latest");
  return names;
}

// This process in a mount namespace of its own (mounts made here vanish with it and are seen by no
// one else), once; false when that cannot be had (not root, or no namespaces).
bool own_mount_namespace() {
  static const bool ok = [] {
    if (::geteuid() != 0) return false;
    if (::unshare(CLONE_NEWNS) != 0) return false;
    return ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  }();
  return ok;
}

boost::test_tools::assertion_result can_mount(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(own_mount_namespace());
  if (!r) r.message() << "mounting a tmpfs needs root and a mount namespace of this process (unshare CLONE_NEWNS), not had here";
  return r;
}

void mount_tmpfs(const fs::path& at) {
  fs::create_directories(at);
  BOOST_TEST_REQUIRE(::mount("tmpfs", at.c_str(), "tmpfs", 0, "size=16m") == 0, at << ": " << std::strerror(errno));
}

// The folder kinds, as made in a case folder `base` for command c; out is base/"out".
enum class Kind { fresh, empty, earlier, shared, user, in_place, mounted, mount_point, source_inside };
std::string kind_name(Kind k) {
  static const char* names[] = {"new",  "empty", "earlier output", "user files + earlier output", "user files",
                                "user files + earlier, no staging folder", "user files + mounted sub-folder",
                                "a mount point: user files + earlier", "its own source inside"};
  return names[static_cast<int>(k)];
}

struct Folder {
  fs::path out;
  std::set<std::string> user;  // top-level names that are the user's
  std::string always;          // faults of every run of this kind (the staging folder refused)
  bool had_output = false;
};

Folder make_folder(Kind k, Cmd c, const fs::path& base) {
  Folder f{base / "out"};
  if (k == Kind::in_place) f.always = "mkdir~/.out.:EACCES";
  switch (k) {
    case Kind::fresh:
      break;
    case Kind::empty:
      fs::create_directories(f.out);
      break;
    case Kind::earlier:
      break;
    case Kind::shared:
    case Kind::user:
    case Kind::in_place:
    case Kind::mounted:
      fs::create_directories(f.out);
      f.user = make_user_files(f.out);
      break;
    case Kind::mount_point:
      mount_tmpfs(f.out);
      f.user = make_user_files(f.out);
      break;
    case Kind::source_inside: {
      fs::create_directories(f.out);
      f.user = make_user_files(f.out);
      const Sources& s = sources();
      if (c == Cmd::convert) fs::copy(s.hf, f.out / "source", fs::copy_options::recursive);
      else if (c == Cmd::export_) fs::copy_file(s.ck_new, f.out / "source.h5");
      else fs::copy_file(s.text_new, f.out / "source.txt");
      f.user.insert(c == Cmd::convert ? "source" : c == Cmd::export_ ? "source.h5" : "source.txt");
      break;
    }
  }
  if (k == Kind::mounted) {
    mount_tmpfs(f.out / "zz_mount");
    write_bytes((f.out / "zz_mount" / "inside.txt").string(), "on another file system\n");
    f.user.insert("zz_mount");
  }
  if (k == Kind::earlier || k == Kind::shared || k == Kind::in_place || k == Kind::mount_point) {
    const Run r = run_shell(faulty(f.always) + args(c, false, f.out.string()));
    BOOST_TEST_REQUIRE(r.code == 0, kind_name(k) << ", " << cmd_name(c) << ": " << r.err);
    f.had_output = true;
  }
  return f;
}

void unmount_all(const fs::path& base) {
  for (const char* m : {"out/zz_mount", "out"}) ::umount2((base / m).c_str(), MNT_DETACH);
}

// Each kind is made once per command (its earlier output written by the binary) and copied for
// every case: mounts are made anew in the copy, then the files copied into them.
struct Template {
  TempDir base;
  Folder folder;
  Template(Kind k, Cmd c) : folder(make_folder(k, c, base.path)) {}
  ~Template() { unmount_all(base.path); }
};

Folder copy_folder(Kind k, Cmd c, const fs::path& base) {
  if (k == Kind::mount_point) return make_folder(k, c, base);  // its files' identities are its file system's
  static std::map<std::pair<Kind, Cmd>, std::unique_ptr<Template>> made;
  auto& t = made[{k, c}];
  if (!t) t = std::make_unique<Template>(k, c);
  Folder f = t->folder;
  f.out = base / "out";
  if (!fs::exists(t->folder.out)) return f;
  fs::create_directories(f.out);
  if (k == Kind::mounted) mount_tmpfs(f.out / "zz_mount");
  link_tree(t->folder.out, f.out);  // the earlier output as tapelm wrote it: the same files
  return f;
}

// Entries beside or in the output that a finished write must not leave: staging folders,
// temporary files.
std::vector<std::string> leftovers(const fs::path& base, const Folder& f) {
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(base))
    if (e.path().filename() != "out") left.push_back(e.path().filename().string());
  if (fs::exists(f.out))
    for (const auto& e : fs::directory_iterator(f.out)) {
      const std::string n = e.path().filename().string();
      if (!f.user.count(n) && n.find(".tmp.") != std::string::npos) left.push_back("out/" + n);
    }
  return left;
}

// The user's entries of a folder, every one of them, recursively.
std::map<std::string, std::string> user_listing(const Folder& f) { return f.user.empty() ? std::map<std::string, std::string>{} : listing(f.out, f.user); }

// ---- one case: a folder, a command, a fault -------------------------------------------------------

struct Fault {
  std::string name, spec;  // spec: the shim's rules ("" for none)
  bool kill = false;
};

struct Outcome {
  int code = 0;
  std::string state, err;
};

// The tally for the matrix: kind x command x fault class -> outcome -> count.
std::map<std::string, std::map<std::string, int>>& tally() {
  static std::map<std::string, std::map<std::string, int>> t;
  return t;
}

// Runs every fault on fresh copies of folder kind k for command c, checks each outcome, and tallies.
void run_faults(Kind k, Cmd c, const std::vector<Fault>& faults) {
  struct Case {
    TempDir base;
    Folder folder;
    std::map<std::string, std::string> before;
    std::string before_state;
  };
  std::vector<std::unique_ptr<Case>> cases;
  std::vector<std::string> lines;
  for (const Fault& fault : faults) {
    auto cs = std::make_unique<Case>();
    cs->folder = copy_folder(k, c, cs->base.path);
    cs->before = user_listing(cs->folder);
    cs->before_state = state_of(c, cs->folder.out.string());
    std::string spec = fault.spec;  // first: the shim's first rule that fires acts
    if (!cs->folder.always.empty()) spec += (spec.empty() ? "" : ";") + cs->folder.always;
    lines.push_back(faulty(spec) + args(c, true, cs->folder.out.string()));
    cases.push_back(std::move(cs));
  }
  const std::vector<Run> runs = run_shell_batch(lines, 2, 60);
  std::vector<std::string> reruns;
  for (size_t i = 0; i < faults.size(); i++) {
    Case& cs = *cases[i];
    const Fault& fault = faults[i];
    const Run& r = runs[i];
    const std::string where = kind_name(k) + ", " + cmd_name(c) + ", " + fault.name + " (" + fault.spec + ")";
    const std::string state = state_of(c, cs.folder.out.string());
    BOOST_TEST((user_listing(cs.folder) == cs.before), where << ": the user's files changed");
    if (fault.kill) {
      BOOST_TEST(r.code == 137, where << ": exit " << r.code << ", " << r.err);
    } else {
      BOOST_TEST((r.code == 0 || r.code == 1), where << ": exit " << r.code << ", " << r.err);
      const size_t last = r.err.rfind("tapelm: error:");
      if (r.code == 1) BOOST_TEST((last != std::string::npos && r.err.find('\n', last) == r.err.size() - 1), where << ": " << r.err);
      if (r.code == 0) BOOST_TEST(state == "new", where << ": exit 0, the folder holds " << state);
      // a failed write leaves the old set or the new one; a set marked as mixed only when the manifest
      // itself could not be written after the files were (the readers then refuse it, rightly)
      if (state == "interrupted") BOOST_TEST(r.err.find(kManifestName) != std::string::npos, where << ": an error left a mixed set: " << r.err);
    }
    const bool allowed = state == "new" || state == cs.before_state || state == "interrupted";
    BOOST_TEST(allowed, where << ": the folder holds " << state << " (before: " << cs.before_state << ")");
    if (k == Kind::fresh && r.code == 1) {  // nothing left, unless the error came once the new set was in place
      const bool gone = !fs::exists(cs.folder.out) || fs::is_empty(cs.folder.out);
      BOOST_TEST((gone || state == "new"), where << ": a failed write into a new folder left " << cs.folder.out);
    }
    const std::string cls = fault.name.substr(0, fault.name.find('@'));
    tally()[kind_name(k) + " | " + cmd_name(c) + " | " + cls][(r.code == 137 ? "killed, " : r.code == 0 ? "exit 0, " : "exit 1, ") + state]++;
    reruns.push_back(faulty(cs.folder.always) + args(c, true, cs.folder.out.string()));
  }
  // the next write, without faults, ends well and leaves nothing of the failed one behind
  const std::vector<Run> again = run_shell_batch(reruns, 2, 60);
  for (size_t i = 0; i < faults.size(); i++) {
    Case& cs = *cases[i];
    const std::string where = kind_name(k) + ", " + cmd_name(c) + ", after " + faults[i].name;
    BOOST_TEST(again[i].code == 0, where << ": the next write: " << again[i].err);
    BOOST_TEST(state_of(c, cs.folder.out.string()) == "new", where);
    BOOST_TEST((user_listing(cs.folder) == cs.before), where << ": the user's files changed");
    const std::vector<std::string> left = leftovers(cs.base.path, cs.folder);
    BOOST_TEST(left.empty(), where << ": left " << (left.empty() ? "" : left.front()));
    unmount_all(cs.base.path);
  }
}

// The calls a clean write makes, in order (the shim's log), each a point to fail or kill at: the
// n-th call of each kind is "call@n".
std::vector<std::string> call_points(Kind k, Cmd c) {
  TempDir base;
  const Folder f = copy_folder(k, c, base.path);
  const std::string log = base / "calls.log";
  const Run r = run_shell(faulty(f.always, log) + args(c, true, f.out.string()));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  std::map<std::string, int> seen;
  std::vector<std::string> points;
  std::istringstream in(slurp(log));
  for (std::string call, path; in >> call && std::getline(in, path);)
    points.push_back(call + "@" + std::to_string(++seen[call]));
  unmount_all(base.path);
  return points;
}

bool main_kind(Kind k) { return k == Kind::earlier || k == Kind::shared || k == Kind::in_place; }

// The faults of a kind: none, RENAME_EXCHANGE unsupported (EINVAL, as NFS, CIFS and FAT give), the
// disk full, then calls of a clean write failed with EIO or killed. The three kinds that take the
// three ways of writing (the exchange, file by file from a staging folder, file by file beside the
// targets) are killed before, and failed at, each call that changes a folder (mkdir, rename,
// exchange, link, unlink, rmdir), and failed at the first and the last sync (a kill at a sync is a
// kill before the next change), for export and prepare (convert writes through export's code); the
// other cases at two seeded calls each. Kills run on the release binary; under the sanitizers, the
// three kinds' export and prepare with three seeded failures each (the other kinds' cases run on
// the release binary alone: their code is the same, their folders differ).
std::vector<Fault> faults_for(Kind k, Cmd c) {
  std::vector<Fault> f{{"none", ""}};
  const bool full = main_kind(k) && c != Cmd::convert;
  if (sanitized_binary() && !full) return f;
  f.push_back({"no exchange", "exchange:EINVAL"});
  int sanitized_eio = 3;  // under the sanitizers: three seeded failures
  f.push_back({"disk full@1", "write@1:ENOSPC"});
  if (full) f.push_back({"disk full@9", "write@9:ENOSPC"});
  std::mt19937 rng(static_cast<unsigned>(static_cast<int>(k) * 7 + static_cast<int>(c)));
  std::vector<std::string> points = call_points(k, c);
  if (!full) {
    std::shuffle(points.begin(), points.end(), rng);
    points.resize(std::min<size_t>(points.size(), 2));
  }
  std::map<std::string, int> calls;
  for (const std::string& p : points) calls[p.substr(0, p.find('@'))]++;
  for (const std::string& p : points) {
    const std::string call = p.substr(0, p.find('@'));
    const bool sync = call == "fsync", edge = !full || p == "fsync@1" || p == "fsync@" + std::to_string(calls["fsync"]);
    if (!sanitized_binary() && !sync) f.push_back({"kill@" + p, p + ":kill", true});
    if ((!sync || edge) && (!sanitized_binary() || (rng() % 3 == 0 && sanitized_eio-- > 0))) f.push_back({"EIO@" + p, p + ":EIO"});
  }
  return f;
}

void check_kind(Kind k) {
  for (Cmd c : kCmds) run_faults(k, c, faults_for(k, c));
}

}  // namespace

// The issue's reproduction: eight projects beside a mounted folder that cannot be renamed; the
// conversion succeeds beside them, and every project is there, byte for byte.
BOOST_AUTO_TEST_CASE(a_convert_beside_a_mounted_folder_keeps_all_eight_projects, *boost::unit_test::precondition(can_mount)) {
  TempDir d;
  const fs::path u = d.path / "U";
  std::set<std::string> user;
  for (int i = 1; i <= 8; i++) {
    fs::create_directories(u / ("project" + std::to_string(i)));
    write_bytes((u / ("project" + std::to_string(i)) / "draft.txt").string(), "chapter " + std::to_string(i) + "\n");
    user.insert("project" + std::to_string(i));
  }
  mount_tmpfs(u / "zz_mount");
  user.insert("zz_mount");
  const auto before = listing(u, user);
  const Run r = run_cli("convert --from " + sources().hf + " --kv-heads 2 --format hf --out " + u.string());
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST((listing(u, user) == before));
  BOOST_TEST(state_of(Cmd::convert, u.string()) == "old");
  ::umount2((u / "zz_mount").c_str(), MNT_DETACH);
}

BOOST_AUTO_TEST_CASE(a_new_folder, *boost::unit_test::precondition(release_binary)) { check_kind(Kind::fresh); }
BOOST_AUTO_TEST_CASE(an_empty_folder_of_the_users, *boost::unit_test::precondition(release_binary)) { check_kind(Kind::empty); }
BOOST_AUTO_TEST_CASE(an_earlier_output_is_replaced_whole) { check_kind(Kind::earlier); }
BOOST_AUTO_TEST_CASE(user_files_beside_an_earlier_output) { check_kind(Kind::shared); }
BOOST_AUTO_TEST_CASE(user_files_alone, *boost::unit_test::precondition(release_binary)) { check_kind(Kind::user); }
BOOST_AUTO_TEST_CASE(user_files_with_no_staging_folder) { check_kind(Kind::in_place); }
BOOST_AUTO_TEST_CASE(the_commands_source_inside_the_folder, *boost::unit_test::precondition(release_binary)) { check_kind(Kind::source_inside); }
BOOST_AUTO_TEST_CASE(a_mounted_sub_folder, *boost::unit_test::precondition(can_mount) * boost::unit_test::precondition(release_binary)) { check_kind(Kind::mounted); }
BOOST_AUTO_TEST_CASE(a_mount_point, *boost::unit_test::precondition(can_mount) * boost::unit_test::precondition(release_binary)) { check_kind(Kind::mount_point); }

// Another program's model or corpus in the folder (or tapelm's from before it kept a manifest): the
// write is refused in one line, before any work, naming the file; nothing changes.
BOOST_AUTO_TEST_CASE(another_models_files_are_refused_before_any_work) {
  for (Cmd c : kCmds) {
    for (const std::string foreign : {c == Cmd::prepare ? "meta.json" : "config.json", c == Cmd::prepare ? "train_000000.bin" : "model.safetensors"}) {
      TempDir base;
      const fs::path out = base.path / "out";
      fs::create_directories(out);
      std::set<std::string> user = make_user_files(out);
      write_bytes((out / foreign).string(), "someone else's\n");
      user.insert(foreign);
      const auto before = listing(out, user);
      const Run r = run_cli(args(c, true, out.string()));
      expect_error(r, "holds " + foreign + ", which tapelm did not write");
      BOOST_TEST((listing(out, user) == before), cmd_name(c) << " beside " << foreign);
      BOOST_TEST(leftovers(base.path, {out, user}).empty());
      tally()["another model's files | " + cmd_name(c) + " | none"]["exit 1, refused"]++;
    }
  }
}

// A run directory and a sweep claim their files the same way: a user's checkpoint.h5 or report.md
// of their own is never replaced; a .lock that is no lock of tapelm's (a user's file, a symbolic
// link to one) is neither truncated nor followed.
BOOST_AUTO_TEST_CASE(run_and_sweep_folders_claim_their_files) {
  TempDir d;
  const std::string cfg = d / "cfg.json";
  write_bytes(cfg, R"({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "batch_size": 2, "max_iters": 2,
                       "eval_iters": 1, "eval_interval": 2, "log_interval": 1, "peak_flops": 1e9})");
  const std::string text = sources().text_old;
  for (const std::string name : {"checkpoint.h5", "metrics.jsonl"}) {
    const fs::path run = d.path / ("run_" + name);
    fs::create_directories(run);
    write_bytes((run / name).string(), "mine\n");
    expect_error(run_cli("train --config " + cfg + " --data " + text + " --out " + run.string() + " --quiet"),
                 "holds " + name + ", which tapelm did not write");
    BOOST_TEST(slurp((run / name).string()) == "mine\n");
  }
  const fs::path sw = d.path / "sw";
  fs::create_directories(sw);
  write_bytes((sw / "report.md").string(), "my report\n");
  expect_error(run_cli("sweep --preset micro --methods mean --data " + text + " --out " + sw.string()), "holds report.md");
  BOOST_TEST(slurp((sw / "report.md").string()) == "my report\n");
  // .lock: a user's file of that name, and a symbolic link to a file outside
  const fs::path run = d.path / "locked";
  fs::create_directories(run);
  write_bytes(d / "precious.txt", "precious\n");
  fs::create_symlink(d / "precious.txt", run / ".lock");
  expect_error(run_cli("train --config " + cfg + " --data " + text + " --out " + run.string() + " --quiet"),
               ".lock is there and is not a lock file of tapelm's");
  BOOST_TEST(slurp(d / "precious.txt") == "precious\n");
  fs::remove(run / ".lock");
  write_bytes((run / ".lock").string(), "my lock notes\n");
  expect_error(run_cli("train --config " + cfg + " --data " + text + " --out " + run.string() + " --quiet"), ".lock is there");
  BOOST_TEST(slurp((run / ".lock").string()) == "my lock notes\n");
  // and a run directory that is tapelm's runs again, in place
  const fs::path ok = d.path / "ok";
  for (int i = 0; i < 2; i++) {
    const Run r = run_cli("train --config " + cfg + " --data " + text + " --out " + ok.string() + " --quiet");
    BOOST_TEST(r.code == 0, r.err);
  }
}

// A write that fails after a killed one keeps the folder marked as mixed: the failure must not
// clear the mark the kill left (a mix of two writes would then load without a word).
BOOST_AUTO_TEST_CASE(a_failed_write_after_a_killed_one_keeps_the_mark) {
  for (Cmd c : {Cmd::export_, Cmd::prepare})
    for (const std::string& later : {std::string("write@1:ENOSPC"), std::string("rename@1:EIO")})
      for (const std::string& always : {std::string(), std::string("mkdir~/.out.:EACCES")}) {
        TempDir base;
        const Folder f = copy_folder(always.empty() ? Kind::shared : Kind::in_place, c, base.path);
        // killed at the rename of the last file but one: the set is then part old, part new
        const std::string last_but_one = c == Cmd::prepare ? "/out/tokenizer.json$" : "/out/generation_config.json$";
        const Run killed = run_shell(faulty("rename~" + last_but_one + ":kill;" + f.always) + args(c, true, f.out.string()));
        BOOST_TEST_REQUIRE(killed.code == 137, killed.err);
        BOOST_TEST_REQUIRE(state_of(c, f.out.string()) == "interrupted");
        const Run failed = run_shell(faulty(later + (always.empty() ? "" : ";" + always)) + args(c, false, f.out.string()));
        BOOST_TEST(failed.code == 1, cmd_name(c) << ", " << later << ": " << failed.err);
        BOOST_TEST(state_of(c, f.out.string()) == "interrupted", cmd_name(c) << ", " << later << (always.empty() ? "" : ", in place"));
        const Run again = run_shell(faulty(f.always) + args(c, false, f.out.string()));
        BOOST_TEST(again.code == 0, again.err);
        BOOST_TEST(state_of(c, f.out.string()) == "old");
        tally()["a failed write after a killed one | " + cmd_name(c) + " | " + later]["exit 1, still marked"]++;
      }
}

// Commands share folders: an HF export beside a run's checkpoint leaves the run's files where they
// are (the folder is not tapelm's HF model alone, so it is written file by file); a corpus into an
// HF model directory, whose tokenizer file it would replace, is refused; so is an export over a
// file tapelm wrote and the user changed since.
BOOST_AUTO_TEST_CASE(folders_shared_by_commands_and_files_changed_by_hand) {
  TempDir d;
  const std::string cfg = d / "cfg.json";
  write_bytes(cfg, R"({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "batch_size": 2, "max_iters": 2,
                       "eval_iters": 1, "eval_interval": 2, "log_interval": 1, "peak_flops": 1e9})");
  const fs::path run = d.path / "run";
  BOOST_TEST_REQUIRE(run_cli("train --config " + cfg + " --data " + sources().text_old + " --out " + run.string() + " --quiet").code == 0);
  const std::set<std::string> run_files{"checkpoint.h5", "metrics.jsonl"};
  const auto before = listing(run, run_files);
  const Run exported = run_cli(args(Cmd::export_, true, run.string()));
  BOOST_TEST(exported.code == 0, exported.err);
  BOOST_TEST((listing(run, run_files) == before));
  BOOST_TEST(state_of(Cmd::export_, run.string()) == "new");
  BOOST_TEST(run_cli("train --config " + cfg + " --data " + sources().text_old + " --out " + run.string() + " --quiet --resume --set max_iters=3").code == 0);
  // a corpus into the HF model's folder: its char tokenizer would be tokenizer.json, the model's
  const fs::path hf = d.path / "hf";
  BOOST_TEST_REQUIRE(run_cli("export --checkpoint " + sources().ck_new + " --format hf --out " + hf.string()).code == 0);
  if (fs::exists(hf / "tokenizer.json")) {
    const auto hf_before = listing(hf, {"tokenizer.json"});
    expect_error(run_cli(args(Cmd::prepare, true, hf.string())), "holds tokenizer.json, which tapelm did not write");
    BOOST_TEST((listing(hf, {"tokenizer.json"}) == hf_before));
  }
  // config.json changed by hand after the export: the next export refuses to replace it
  write_bytes((hf / "config.json").string(), slurp((hf / "config.json").string()) + " ");
  expect_error(run_cli(args(Cmd::export_, false, hf.string())), "holds config.json, which tapelm did not write");
  BOOST_TEST(slurp((hf / "config.json").string()).back() == ' ');
}

// What a killed writer leaves beside its folder is removed by the next one only when it is marked
// as tapelm's: a symbolic link of that name is not followed, and a user's folder of that name (no
// marker, no manifest) is left whole, its .lock file too.
BOOST_AUTO_TEST_CASE(stale_sibling_folders_are_removed_only_when_they_are_tapelms) {
  TempDir d;
  const fs::path out = d.path / "out", other = d.path / "other";
  BOOST_TEST_REQUIRE(run_cli(args(Cmd::prepare, false, other.string())).code == 0);
  const auto other_before = listing(other, {"meta.json", "train_000000.bin", "val_000000.bin", "tokenizer.json", ".lock", kManifestName});
  const std::string dead = std::to_string(dead_pid());
  fs::create_directory_symlink(other, d.path / (".out.corpus." + dead));
  const fs::path users = d.path / (".out.corpus." + std::to_string(dead_pid()));
  fs::create_directories(users);
  write_bytes((users / ".lock").string(), "123\n");
  write_bytes((users / "meta.json").string(), "mine\n");
  BOOST_TEST_REQUIRE(run_cli(args(Cmd::prepare, true, out.string())).code == 0);
  BOOST_TEST((listing(other, {"meta.json", "train_000000.bin", "val_000000.bin", "tokenizer.json", ".lock", kManifestName}) == other_before));
  BOOST_TEST(fs::is_symlink(d.path / (".out.corpus." + dead)));
  BOOST_TEST(slurp((users / ".lock").string()) == "123\n");
  BOOST_TEST(slurp((users / "meta.json").string()) == "mine\n");
}

// An output is never one of the command's inputs, nor inside one, compared by device and inode
// (through symbolic and hard links): `convert --from D --out D/model.safetensors` replaced the
// source's weights with a checkpoint, and D no longer loaded.
BOOST_AUTO_TEST_CASE(an_output_is_never_one_of_the_inputs) {
  TempDir d;
  const fs::path hf = d.path / "hf", corpus = d.path / "corpus";
  fs::copy(sources().hf, hf, fs::copy_options::recursive);
  const std::string ck = d / "ck.h5", text = sources().text_old, cfg = d / "cfg.json";
  BOOST_TEST_REQUIRE(run_cli("convert --from " + hf.string() + " --kv-heads 2 --out " + ck).code == 0);
  BOOST_TEST_REQUIRE(run_cli("prepare --quiet --text " + text + " --out " + corpus.string()).code == 0);
  write_bytes(cfg, R"({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "batch_size": 2, "max_iters": 1})");
  fs::create_symlink(ck, d / "link.h5");
  fs::create_hard_link(ck, d / "hard.h5");
  const auto hf_before = listing(hf), corpus_before = listing(corpus);
  const std::string ck_before = slurp(ck), text_before = slurp(text);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"convert --from " + hf.string() + " --kv-heads 2 --out " + (hf / "model.safetensors").string(), "lies inside the --from"},
      {"convert --from " + ck + " --kv-heads 1 --out " + (d / "link.h5"), "is the --from"},
      {"convert --from " + ck + " --kv-heads 1 --out " + (d / "hard.h5"), "is the --from"},
      {"convert --from " + hf.string() + " --kv-heads 2 --method fit --calib " + text + " --out " + text, "is the --calib"},
      {"import --format hf --model " + hf.string() + " --out " + (hf / "x.h5").string(), "lies inside the --model"},
      {"export --checkpoint " + ck + " --format gguf --out " + (d / "link.h5"), "is the --checkpoint"},
      {"prepare --quiet --text " + text + " --out " + text, "is the --text"},
      {"train --config " + cfg + " --data " + corpus.string() + " --out " + corpus.string(), "is the --data"},
      {"train --config " + cfg + " --data " + corpus.string() + " --out " + (corpus / "run").string(), "lies inside the --data"},
      {"uptrain --from " + ck + " --kv-heads 1 --data " + text + " --out " + (d / "link.h5"), "is the --from"},
      {"eval --checkpoint " + ck + " --data " + text + " --grad-out " + (d / "hard.h5"), "is the --checkpoint"}};
  for (const auto& [args, says] : cases) {
    expect_error(run_cli(args), says);
    tally()["an output over an input | " + args.substr(0, args.find(' ')) + " | none"]["exit 1, refused"]++;
  }
  BOOST_TEST((listing(hf) == hf_before));
  BOOST_TEST((listing(corpus) == corpus_before));
  BOOST_TEST(slurp(ck) == ck_before);
  BOOST_TEST(slurp(text) == text_before);
}

// SIGTERM, SIGINT or SIGHUP at each step of a write that changes a folder: the process ends by the
// signal, and its staging folder and temporary files go with it (`.X.HF-model.<pid>` stayed beside
// the output in 8 of 12 trials); the user's files stay; the folder holds the old set, the new one,
// or is marked as written halfway.
BOOST_AUTO_TEST_CASE(a_signal_leaves_no_staging_folder_or_temporary_file, *boost::unit_test::precondition(release_binary)) {
  const std::pair<const char*, int> signals[] = {{"term", SIGTERM}, {"int", SIGINT}, {"hup", SIGHUP}};
  int runs = 0;
  for (Kind k : {Kind::earlier, Kind::shared, Kind::in_place})
    for (Cmd c : {Cmd::export_, Cmd::prepare}) {
      size_t n = 0;
      for (const std::string& p : call_points(k, c)) {
        if (p.rfind("fsync", 0) == 0) continue;
        const auto [name, sig] = signals[n++ % 3];
        TempDir base;
        const Folder f = copy_folder(k, c, base.path);
        const auto before = user_listing(f);
        const std::string where = kind_name(k) + ", " + cmd_name(c) + ", " + name + " at " + p;
        const Run r = run_shell(faulty(p + ":" + name + (f.always.empty() ? "" : ";" + f.always)) + args(c, true, f.out.string()));
        BOOST_TEST((r.code == 128 + sig || r.code == 0), where << ": exit " << r.code << ", " << r.err);
        const std::vector<std::string> left = leftovers(base.path, f);
        BOOST_TEST(left.empty(), where << ": left " << (left.empty() ? "" : left.front()));
        BOOST_TEST((user_listing(f) == before), where);
        const std::string state = state_of(c, f.out.string());
        BOOST_TEST((state == "old" || state == "new" || state == "interrupted"), where << ": " << state);
        tally()[kind_name(k) + " | " + cmd_name(c) + " | a signal"][(r.code == 0 ? "exit 0, " : "signalled, ") + state]++;
        runs++;
        unmount_all(base.path);
      }
    }
  BOOST_TEST(runs > 0);
}

// `--out /` in a chroot of the test's own (a tmpfs holding /etc, /home, a read-only /proc and the
// system's /usr mounted read-only): each command is refused in one line before any work, as are
// /proc/x and /etc/.., and nothing in the chroot changes.
BOOST_AUTO_TEST_CASE(the_root_folder_in_a_chroot, *boost::unit_test::precondition(can_mount)) {
  TempDir d;
  const fs::path root = d.path / "root";
  mount_tmpfs(root);
  auto bind_ro = [&](const fs::path& from) {
    const fs::path at = root / fs::path(from).relative_path();
    fs::create_directories(at);
    BOOST_TEST_REQUIRE(::mount(from.c_str(), at.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0, from);
    BOOST_TEST_REQUIRE(::mount(nullptr, at.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) == 0, from);
  };
  bind_ro("/usr");
  for (const char* l : {"lib", "lib64", "bin", "sbin"})
    if (fs::is_symlink(fs::path("/") / l)) fs::create_symlink(fs::read_symlink(fs::path("/") / l), root / l);
  bind_ro(fs::path(TAPELM_BINARY).parent_path());
  bind_ro(fixture_path(""));
  bind_ro("/etc/alternatives");  // where Debian's libblas.so.3 and liblapack.so.3 point
  fs::copy_file("/etc/ld.so.cache", root / "etc/ld.so.cache");
  bind_ro(sources().d.path);
  fs::create_directories(root / "proc");
  BOOST_TEST_REQUIRE(::mount("proc", (root / "proc").c_str(), "proc", MS_RDONLY, nullptr) == 0);
  fs::create_directories(root / "home/user");
  fs::create_directories(root / "tmp");
  write_bytes((root / "etc/passwd").string(), "root:x:0:0:root:/root:/bin/sh\n");
  write_bytes((root / "etc/hostname").string(), "chroot\n");
  make_user_files(root / "home/user");
  const std::set<std::string> user{"etc", "home", "tmp"};
  const auto before = listing(root, user, true);
  const std::string in = "GOMP_SPINCOUNT=10000 chroot " + root.string() + " " + std::string(TAPELM_BINARY) + " --threads 1 ";
  for (Cmd c : kCmds)
    for (const std::string out : {"/", "/etc/..", "/proc/x"}) {
      const Run r = run_shell(in + args(c, true, out));
      BOOST_TEST(r.code == 1, cmd_name(c) << " --out " << out << ": " << r.err);
      BOOST_TEST(is_one_error_line(r), cmd_name(c) << " --out " << out << ": " << r.err);
      if (out != "/proc/x") BOOST_TEST(r.err.find("the root folder") != std::string::npos, r.err);
      BOOST_TEST((listing(root, user, true) == before), cmd_name(c) << " --out " << out);
      tally()["/ in a chroot | " + cmd_name(c) + " | --out " + out]["exit 1, refused"]++;
    }
  for (const char* f : {"config.json", "meta.json", ".tapelm-manifest.json", ".lock"}) BOOST_TEST(!fs::exists(root / f), f);
  ::umount2(root.c_str(), MNT_DETACH);
}

// Written last: the matrix of what was run, for docs/reliability.md.
BOOST_AUTO_TEST_CASE(the_matrix) {
  int total = 0;
  std::ostringstream s;
  for (const auto& [row, outcomes] : tally()) {
    s << "\n  " << row << ":";
    for (const auto& [o, n] : outcomes) {
      s << " " << o << " x" << n << ";";
      total += n;
    }
  }
  BOOST_TEST_MESSAGE("output folder cases: " << total << s.str());
  BOOST_TEST(total > 0);
}

BOOST_AUTO_TEST_SUITE_END()
