#include "train/run_dir.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "autograd/error.h"
#include "data/io.h"
#include "data/outdir.h"

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
  if (lock && !folder_) {
    // the lock first: a second writer fails here, before touching anything in the folder
    folder_.emplace(dir_, "run directory", ErrorKind::train);
    folder_->claim(run_files(), "run");  // refused when the folder holds another program's file of one of these names
    folder_->keep();
  } else if (!lock) {
    fs::create_directories(dir_, ec);
  }
  // a file of a name no one else has: it proves the folder writable now, not after the first interval
  std::string probe = (fs::path(dir_) / ".tapelm-write-test.XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw Error(ErrorKind::train, dir_ + ": run directory is not writable");
  ::close(fd);
  ::unlink(probe.c_str());
  // Only under the lock: another writer's temp file is a checkpoint being written. The checkpoint
  // itself is intact: it is renamed into place only when complete.
  const std::string tmp = "checkpoint.h5.tmp.";
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(tmp, 0) == 0 && n.find_first_not_of("0123456789.", tmp.size()) == std::string::npos && e.is_regular_file() &&
        !e.is_symlink())
      fs::remove(e.path(), ec);
  }
}

std::vector<std::string> RunDir::run_files() { return {"checkpoint.h5", "metrics.jsonl"}; }

void RunDir::open_metrics(bool resume, int64_t resumed_step) {
  const std::string path = metrics();
  if (fs::is_symlink(path)) throw Error(ErrorKind::train, path + ": a symbolic link; the run writes its metrics only to a file of its own");
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
