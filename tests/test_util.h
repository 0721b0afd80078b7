#pragma once
// Helpers shared by the test suites.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace tapelm::test {

/// Gradient-checks f on the inputs and reports the worst element when it fails.
inline void check_grad(const std::string& what, const std::function<Var(const std::vector<Var>&)>& f,
                       const std::vector<Tensor>& inputs, GradCheckOptions opt = {}) {
  GradCheckResult r = gradcheck(f, inputs, opt);
  BOOST_TEST(r.ok, what << ": worst ratio " << r.worst_ratio << " at " << r.detail);
}

/// The directory holding the project's test data.
inline std::string fixture_path(const std::string& rel) { return std::string(TAPELM_SOURCE_DIR) + "/tests/fixtures/" + rel; }

/// A fresh directory under the system's temp directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           ("tapelm_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
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

/// A bad input must give a non-zero exit, one line on stderr naming the problem, no crash.
inline void expect_error(const Run& r, const std::string& part) {
  BOOST_TEST(r.code == 1, "exit code " << r.code << ", stderr: " << r.err);
  BOOST_TEST(r.err.find(part) != std::string::npos, "stderr lacks '" << part << "': " << r.err);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, "not one line: " << r.err);
  BOOST_TEST(r.err.find("Sanitizer") == std::string::npos, r.err);
}

/// The lines of a metrics.jsonl file.
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace tapelm::test
