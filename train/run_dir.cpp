#include "train/run_dir.h"

#include <cerrno>
#include <filesystem>

#include "autograd/error.h"
#include "data/io.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {
// Keeps only the metrics of steps up to `step`.
void trim_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t(0)) <= step) kept += line + "\n";
    } catch (const std::exception&) {
    }
  }
  in.close();
  write_file_atomic(path, kept);
}
}  // namespace


RunDir::RunDir(std::string dir) : dir_(std::move(dir)) {}

std::string RunDir::checkpoint() const { return (fs::path(dir_) / "checkpoint.h5").string(); }

std::string RunDir::metrics() const { return (fs::path(dir_) / "metrics.jsonl").string(); }

void RunDir::prepare(bool lock) {
  std::error_code ec;
  if (lock && !lock_) lock_.emplace(dir_);  // creates the directory
  else if (!lock) fs::create_directories(dir_, ec);
  const std::string probe = (fs::path(dir_) / ".write_test").string();
  std::ofstream t(probe);
  if (!t) throw Error(ErrorKind::train, dir_ + ": run directory is not writable");
  t.close();
  fs::remove(probe, ec);
  // Only under the lock: another writer's temp file is a checkpoint being written. The checkpoint
  // itself is intact: it is renamed into place only when complete.
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().filename().string().rfind("checkpoint.h5.tmp.", 0) == 0) fs::remove(e.path(), ec);
}

void RunDir::open_metrics(bool resume, int64_t resumed_step) {
  const std::string path = metrics();
  if (resume) trim_metrics(path, resumed_step);
  else std::ofstream(path, std::ios::trunc);
  metrics_.open(path, std::ios::app);
  if (!metrics_) throw Error(ErrorKind::train, path + ": cannot open the metrics file for writing");
}

void RunDir::log(const nlohmann::json& record) {
  metrics_ << record.dump() << "\n";
  metrics_.flush();
}

}  // namespace tapelm
