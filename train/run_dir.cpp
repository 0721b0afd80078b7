#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "train/trainer.h"

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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out) throw Error(ErrorKind::train, path + ": cannot rewrite the metrics file");
  }
  fs::rename(tmp, path);
}
}  // namespace

DirLock::DirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(ErrorKind::train, dir + ": cannot create the directory");
  const std::string path = (fs::path(dir) / ".lock").string();
  // O_CLOEXEC: a child (gnuplot, a test's tapelm) must not inherit the lock and outlive us with it.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(ErrorKind::train, dir + ": directory is not writable (cannot create .lock)");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (err != EWOULDBLOCK) throw Error(ErrorKind::train, dir + ": cannot lock " + path);
    // The holder writes its pid just after locking: an empty file means it is still starting.
    throw Error(ErrorKind::train, dir + " is in use by another tapelm process (pid " + (pid.empty() ? "unknown" : pid) +
                                      "); one writer per directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd_);
    throw Error(ErrorKind::train, dir + ": directory is not writable (cannot write .lock)");
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor of the open file drops the lock
}

RunDir::RunDir(std::string dir) : dir_(std::move(dir)) {}

std::string RunDir::checkpoint() const { return (fs::path(dir_) / "checkpoint.h5").string(); }

std::string RunDir::metrics() const { return (fs::path(dir_) / "metrics.jsonl").string(); }

void RunDir::prepare() {
  if (!lock_) lock_.emplace(dir_);  // creates the directory
  std::error_code ec;
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
