#pragma once
// Helpers shared by the test suites.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/error.h"
#include "autograd/ops.h"
#include "data/dataset.h"
#include "train/train_config.h"
#include "autograd/runtime.h"

namespace tapelm::test {

/// A program the tests run, named by ctest's environment (the sanitizer pass names its
/// instrumented builds), else the file beside the test binary.
inline std::string program(const char* env, const char* name) {
  if (const char* p = std::getenv(env); p && *p) return p;
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / name).string();
}

}  // namespace tapelm::test

/// The tapelm binary under test, and the MPI suite's worker.
#define TAPELM_BINARY (::tapelm::test::program("TAPELM_BINARY", "tapelm"))
#define TAPELM_MPI_WORKER (::tapelm::test::program("TAPELM_MPI_WORKER", "tapelm_mpi_worker"))

namespace tapelm::test {

/// Gradient-checks f on the inputs and reports the worst element when it fails.
inline void check_grad(const std::string& what, const std::function<Var(const std::vector<Var>&)>& f,
                       const std::vector<Tensor>& inputs, GradCheckOptions opt = {}) {
  GradCheckResult r = gradcheck(f, inputs, opt);
  BOOST_TEST(r.ok, what << ": worst ratio " << r.worst_ratio << " at " << r.detail);
}

/// True in the sanitizer pass: the rooms linked into this binary are instrumented with ASan.
extern "C" void __asan_init() __attribute__((weak));
inline bool sanitized() { return &__asan_init != nullptr; }

/// Writes bytes to path as they are.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file's bytes.
inline std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Same shape and the same bits in every element.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.numel())) == 0;
}

/// The directory holding the project's test data.
/// A weight type by its name (the tests loop over names, as users type them).
inline WeightType wt(const std::string& s) { return enum_from_name<WeightType>(s, "test dtype"); }

inline std::string fixture_path(const std::string& rel) { return std::string(TAPELM_SOURCE_DIR) + "/tests/fixtures/" + rel; }

/// One of the PyTorch reference's parity fixtures (tests/fixtures/parity/).
inline std::string parity_fixture(const std::string& name) { return fixture_path("parity/" + name); }

/// The bundled corpus, loaded once.
inline const Corpus& shakespeare() {
  static Corpus c = load_corpus(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt");
  return c;
}

/// The closing evaluation of tiny_train's runs: the val split's first 4096 tokens (256 windows),
/// not all 111 thousand, which cost most of each tiny run's time (10 of 11 s under the sanitizers).
constexpr int64_t kTinyFinalEvalTokens = 4096;
/// A two-layer GQA run of `iters` steps small enough for a unit test.
inline TrainConfig tiny_train(int64_t iters) {
  nlohmann::json j = {{"vocab_size", 65}, {"n_layer", 2},         {"n_head", 4},          {"n_kv_head", 2},
                      {"n_embd", 32},     {"block_size", 16},     {"batch_size", 4},      {"max_iters", iters},
                      {"dropout", 0.1},   {"learning_rate", 3e-3}, {"min_lr", 3e-4},      {"warmup_iters", 6},
                      {"lr_decay_iters", 10}, {"grad_clip", 0.5}, {"eval_interval", 5},   {"eval_iters", 2},
                      {"log_interval", 1}, {"checkpoint_interval", 100}, {"seed", 7},
                      {"final_eval_tokens", kTinyFinalEvalTokens}};
  return TrainConfig::from_json(j);
}

/// A fresh directory under the system's temp directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("tapelm_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The path of `name` inside the directory.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  /// The names of the directory's entries.
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path)) names.insert(e.path().filename().string());
    return names;
  }
};

/// f must throw an Error of this kind with a one-line message containing every part.
inline void expect_throw(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    f();
    BOOST_ERROR("nothing thrown; expected a " << to_string(kind) << " error mentioning '" << parts.front() << "'");
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST(to_string(e.kind()) == to_string(kind), "kind of '" << msg << "'");
    BOOST_TEST(msg.find('\n') == std::string::npos, "message is not one line: " << msg);
    for (const std::string& p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << msg << "' lacks '" << p << "'");
  }
}

/// A predicate for BOOST_CHECK_EXCEPTION(expr, Error, is_kind(k)).
inline std::function<bool(const Error&)> is_kind(ErrorKind k) {
  return [k](const Error& e) { return e.kind() == k; };
}

/// Sets the thread count for its lifetime and restores the previous one, so a test that pins
/// threads leaves the next test the count it expects.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : prev_(get_num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(prev_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int prev_;
};

inline std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Run {
  int code;
  std::string out, err;
};

/// The id of a process that has ended: what a killed run leaves in its file names.
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

/// A copy of a folder tapelm wrote that keeps each file's identity, as its manifest records it
/// (device, inode, size, time): files hard-linked (tapelm never writes into a file in place; it
/// renames new ones over), the lock and the manifest copied, so that copies lock files of their
/// own. Across file systems files are copied.
inline void link_tree(const std::filesystem::path& from, const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    const fs::path t = to / e.path().filename();
    const fs::file_status st = e.symlink_status();
    std::error_code ec;
    if (fs::is_symlink(st)) {
      fs::copy_symlink(e.path(), t);
    } else if (fs::is_directory(st)) {
      link_tree(e.path(), t);
    } else if (e.path().filename() == ".lock" || e.path().filename() == ".tapelm-manifest.json" ||
               (fs::create_hard_link(e.path(), t, ec), bool(ec))) {
      fs::copy_file(e.path(), t);
    }
  }
}

/// Runs a shell command line, capturing both streams.
inline Run run_shell(const std::string& cmdline) {
  TempDir d;
  const std::string cmd = cmdline + " >" + (d / "out") + " 2>" + (d / "err");
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(d / "out"), slurp(d / "err")};
}

/// Runs build/tapelm with the given arguments (shell words), capturing both streams.
inline Run run_cli(const std::string& args, const std::string& prefix = "") {
  return run_shell(prefix + std::string(TAPELM_BINARY) + " " + args);
}

/// A bad input must give exit 1, one line on stderr naming the problem, no crash.
inline void expect_error(const Run& r, const std::string& part) {
  BOOST_TEST(r.code == 1, "exit code " << r.code << ", stderr: " << r.err);
  BOOST_TEST(r.err.find(part) != std::string::npos, "stderr lacks '" << part << "': " << r.err);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, "not one line: " << r.err);
  BOOST_TEST(r.err.find("Sanitizer") == std::string::npos, r.err);
}

/// Runs each command line under `timeout` (a hang is exit 124), spread over `jobs` shell scripts
/// run side by side: for hundreds of tiny runs, process start-up is the cost, not the commands.
inline std::vector<Run> run_shell_batch(const std::vector<std::string>& cmdlines, int jobs = 2, int timeout_s = 20) {
  TempDir d;
  std::vector<std::ofstream> scripts;
  for (int j = 0; j < jobs; j++) scripts.emplace_back(d / ("batch" + std::to_string(j) + ".sh"));
  for (size_t i = 0; i < cmdlines.size(); i++) {
    const std::string base = d / std::to_string(i);
    scripts[i % jobs] << "timeout -k 5 " << timeout_s << " " << cmdlines[i] << " >" << base << ".out 2>" << base
                      << ".err </dev/null; echo $? >" << base << ".rc\n";
  }
  std::string all;
  for (int j = 0; j < jobs; j++) {
    scripts[j].close();
    all += "sh " + (d / ("batch" + std::to_string(j) + ".sh")) + " & ";
  }
  std::system((all + "wait").c_str());
  std::vector<Run> out;
  for (size_t i = 0; i < cmdlines.size(); i++) {
    const std::string base = d / std::to_string(i), rc = slurp(base + ".rc");
    out.push_back({rc.empty() ? -1 : std::stoi(rc), slurp(base + ".out"), slurp(base + ".err")});
  }
  return out;
}

/// True if a failed run said so the way every tapelm error does: one stderr line `tapelm: error: ...`.
inline bool is_one_error_line(const Run& r) {
  return r.err.rfind("tapelm: error:", 0) == 0 && std::count(r.err.begin(), r.err.end(), '\n') == 1 &&
         r.err.back() == '\n';
}

/// The lines of a metrics.jsonl file.
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// "equal", or where two id sequences first differ ("first difference at 3 of 10: got 5, want 7"):
/// a tokenizer's ids against an oracle's.
inline std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) i++;
  if (i == got.size() && i == want.size()) return "equal";
  return "first difference at " + std::to_string(i) + " of " + std::to_string(want.size()) + ": got " +
         (i < got.size() ? std::to_string(got[i]) : "end") + ", want " + (i < want.size() ? std::to_string(want[i]) : "end");
}

// ---- preconditions: a test that needs what this machine may lack reports itself skipped ---------

using Precondition = boost::test_tools::assertion_result;

/// chattr +i works on the temporary directory's file system (it needs root and ext4-like support).
inline Precondition chattr_works(boost::unit_test::test_unit_id) {
  const std::string f = (std::filesystem::temp_directory_path() / ("tapelm_chattr_probe_" + std::to_string(::getpid()))).string();
  { std::ofstream(f) << "x"; }
  const bool ok = std::system(("chattr +i " + f + " 2>/dev/null").c_str()) == 0;
  if (ok) std::system(("chattr -i " + f).c_str());
  std::filesystem::remove(f);
  Precondition r(ok);
  if (!ok) r.message() << "chattr +i is not available here (not root, or a file system without immutable files)";
  return r;
}

/// The program under test is not built with AddressSanitizer, which maps terabytes of shadow
/// memory and so cannot start under an address-space limit (prlimit --as).
inline Precondition runs_under_an_address_space_limit(boost::unit_test::test_unit_id) {
  const std::string bin = TAPELM_BINARY;
  Precondition r(bin.find("_asan") == std::string::npos && std::system("command -v prlimit >/dev/null 2>&1") == 0);
  if (!r) r.message() << "the binary under test is sanitized (or prlimit is missing): an address-space limit stops it at start";
  return r;
}

/// The program under test is the release build: a test that kills it at seeded moments checks
/// the commit rule, which the release run already checks; under AddressSanitizer it would only
/// cost three times as long.
inline Precondition release_binary(boost::unit_test::test_unit_id) {
  const std::string bin = TAPELM_BINARY;
  Precondition r(bin.find("_asan") == std::string::npos);
  if (!r) r.message() << "the binary under test is sanitized: the release run kills the release binary";
  return r;
}

/// gnuplot is on the PATH.
inline Precondition gnuplot_works(boost::unit_test::test_unit_id) {
  Precondition r(std::system("command -v gnuplot >/dev/null 2>&1") == 0);
  if (!r) r.message() << "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)";
  return r;
}

}  // namespace tapelm::test
