#include "data/sampler.h"

#include <algorithm>
#include <sstream>

namespace tapelm {

namespace {
constexpr const char* state_tag = "mt19937_64";
}

void check_window_fits(int64_t n, int64_t T, const std::string& what) {
  if (T < 1) throw Error(ErrorKind::data, "block_size must be at least 1, got " + std::to_string(T));
  if (n < T + 1)
    throw Error(ErrorKind::data, what + " of " + std::to_string(n) +
                    " tokens is shorter than block_size + 1 = " + std::to_string(T + 1));
}

std::vector<int64_t> eval_windows(const TokenSeq& data, int64_t T, const std::string& what) {
  const auto n = static_cast<int64_t>(data.size());
  check_window_fits(n, T, what);
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + T + 1 <= n; s += T) starts.push_back(s);
  return starts;
}

void fill_windows(const TokenSeq& data, const std::vector<int64_t>& starts, int64_t T, Index& x, Index& y) {
  const auto B = static_cast<int64_t>(starts.size());
  x.shape = y.shape = {B, T};
  x.data.resize(B * T);
  y.data.resize(B * T);
  for (int64_t b = 0; b < B; b++) {
    if (starts[b] < 0 || starts[b] + T + 1 > static_cast<int64_t>(data.size()))
      throw Error(ErrorKind::data, "window start " + std::to_string(starts[b]) + " with block_size " + std::to_string(T) +
                      " runs past the " + std::to_string(data.size()) + " tokens");
    data.copy(starts[b], T, x.data.data() + b * T);
    data.copy(starts[b] + 1, T, y.data.data() + b * T);
  }
}

BatchSampler::BatchSampler(TokenSeq data, int64_t B, int64_t T, uint64_t seed,
                           const std::string& what)
    : data_(std::move(data)), B_(B), T_(T), gen_(seed) {
  if (B < 1) throw Error(ErrorKind::data, "batch_size must be at least 1, got " + std::to_string(B));
  check_window_fits(data_.size(), T, what);
}

uint64_t BatchSampler::draw(uint64_t range) {
  // 2^64 mod range: values below it would make the low residues more likely, so they are redrawn.
  const uint64_t reject_below = (0 - range) % range;
  for (;;) {
    const uint64_t v = gen_();
    if (v >= reject_below) return v % range;
  }
}

void BatchSampler::next(Index& x, Index& y) {
  const auto range = static_cast<uint64_t>(data_.size() - T_);
  starts_.resize(B_);
  for (int64_t b = 0; b < B_; b++) starts_[b] = static_cast<int64_t>(draw(range));
  fill_windows(data_, starts_, T_, x, y);
  for (int64_t s : starts_) data_.release(s, s + T_ + 1);
}

std::string BatchSampler::state() const {
  std::ostringstream os;
  os << state_tag << ' ' << gen_;
  return os.str();
}

void BatchSampler::set_state(const std::string& s) {
  std::istringstream is(s);
  std::string tag;
  std::mt19937_64 g;
  is >> tag >> g;
  if (tag != state_tag || is.fail() || !(is >> std::ws).eof())
    throw Error(ErrorKind::data, "sampler state does not parse as a \"" + std::string(state_tag) + "\" generator state");
  gen_ = g;
}

}  // namespace tapelm
