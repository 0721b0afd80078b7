#include "train/formats/model_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "autograd/error.h"
#include "data/io.h"
#include "nn/gpt.h"
#include "train/formats/tensor_source.h"

namespace tapelm::formats {

std::string non_finite(const Tensor& t) {
  const int64_t i = first_non_finite(t.data(), t.numel());
  if (i < 0) return "";
  return non_finite_at(t.data()[i], i);
}

std::string non_finite_at(float v, int64_t i) {
  return std::string(std::isnan(v) ? "NaN" : v > 0 ? "Inf" : "-Inf") + " at index " + std::to_string(i);
}

namespace {

// Open output files, closed (and their errors reported) at the end.
class Fds {
 public:
  // One descriptor per output file, all open at once (a 7B model in 5 GB shards: 3).
  Fds(const std::vector<std::string>& temps, const std::vector<std::string>& names) : names_(names) {
    for (const std::string& t : temps) {
      const int fd = ::open(t.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (fd < 0) {
        const int err = errno;
        close_quietly();
        fail(fds_.size(), err);
      }
      fds_.push_back(fd);
    }
  }
  ~Fds() { close_quietly(); }
  Fds(const Fds&) = delete;
  Fds& operator=(const Fds&) = delete;
  void write_at(size_t i, const std::string& bytes, uint64_t offset) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pwrite(fds_[i], bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(i, n < 0 ? errno : ENOSPC);
      done += static_cast<size_t>(n);
    }
  }
  void close_all() {
    for (size_t i = 0; i < fds_.size(); i++) {
      const int fd = fds_[i];
      fds_[i] = -1;
      if (::close(fd) != 0) fail(i, errno);
    }
  }

 private:
  void close_quietly() {
    for (int& fd : fds_)
      if (fd >= 0) ::close(fd), fd = -1;
  }
  [[noreturn]] void fail(size_t i, int err) const {
    throw Error(ErrorKind::data, "cannot write " + names_[i] + ": " + std::strerror(err));
  }
  std::vector<int> fds_;
  std::vector<std::string> names_;
};

class PlacedWriter : public ModelSink {
 public:
  PlacedWriter(const GPTConfig& c, const std::vector<Placement>& placements, Fds& out, const std::string& what)
      : placements_(placements), out_(out), what_(what), written_(placements.size(), false) {
    for (const auto& [name, shape] : parameter_shapes(c)) expected_[name] = shape;
    for (size_t i = 0; i < placements_.size(); i++)
      for (const auto& part : placements_[i].tensor.parts)
        if (expected_.count(part.first)) users_[part.first].insert(i);
    for (const auto& [name, shape] : expected_)
      if (!users_.count(name)) throw Error(ErrorKind::internal, what_ + ": the layout has no place for parameter " + name);
    for (size_t i = 0; i < placements_.size(); i++) try_write(i);  // those made only of what the model lacks: zeros
  }

  void tensor(const std::string& name, const Tensor& t) override {
    auto it = expected_.find(name);
    if (it == expected_.end() || it->second != t.shape())
      throw Error(ErrorKind::internal, what_ + ": parameter " + name + " " + shape_str(t.shape()) + " is not one the config has yet to write");
    if (const std::string bad = non_finite(t); !bad.empty())
      throw Error(ErrorKind::checkpoint, name + " holds " + bad + "; not writing " + what_ + " (any model already there is kept)");
    expected_.erase(it);
    arrived_[name] = t;
    const std::set<size_t> users = users_.at(name);
    for (size_t i : users) try_write(i);
    if (users_.count(name)) arrived_[name] = t.clone();  // waits for the other parts of a tensor
  }

  void check_complete() const {
    if (!expected_.empty()) throw Error(ErrorKind::internal, what_ + ": parameter " + expected_.begin()->first + " was never written");
    for (size_t i = 0; i < written_.size(); i++)
      if (!written_[i]) throw Error(ErrorKind::internal, what_ + ": tensor " + placements_[i].tensor.name + " was never written");
  }

 private:
  // Writes placement i when all its parts have arrived, and forgets the parts no one else awaits.
  void try_write(size_t i) {
    const Placement& p = placements_[i];
    for (const auto& part : p.tensor.parts)
      if (expected_.count(part.first)) return;
    out_.write_at(p.file, p.encode(file_values(p.tensor, arrived_)), p.offset);
    written_[i] = true;
    for (const auto& part : p.tensor.parts) {
      auto u = users_.find(part.first);
      if (u == users_.end()) continue;
      u->second.erase(i);
      if (u->second.empty()) {
        users_.erase(u);
        arrived_.erase(part.first);
      }
    }
  }

  const std::vector<Placement>& placements_;
  Fds& out_;
  std::string what_;  // the output as the user named it
  std::vector<bool> written_;
  std::map<std::string, Shape> expected_;             // parameters not yet pushed
  std::map<std::string, std::set<size_t>> users_;     // parameter -> placements not yet written that hold it
  TensorMap arrived_;                                 // parameters pushed and still awaited
};

}  // namespace

void write_placed(const std::string& what, const GPTConfig& c, const std::vector<std::pair<std::string, std::string>>& whole,
                  const std::vector<PlacedFile>& placed, const std::vector<Placement>& placements, const SinkFill& fill) {
  std::vector<std::string> paths;
  for (const auto& w : whole) paths.push_back(w.first);
  for (const PlacedFile& f : placed) paths.push_back(f.path);
  commit_together(paths, [&](const std::vector<std::string>& temps) {
    Fds out(temps, paths);
    for (size_t i = 0; i < whole.size(); i++) out.write_at(i, whole[i].second, 0);
    for (size_t i = 0; i < placed.size(); i++) out.write_at(whole.size() + i, placed[i].header, 0);
    std::vector<Placement> shifted = placements;  // file indices past the whole files
    for (Placement& p : shifted) p.file += whole.size();
    PlacedWriter w(c, shifted, out, what);
    fill(w);
    w.check_complete();
    out.close_all();
  });
}

}  // namespace tapelm::formats
