#pragma once
// Training batches: B random windows of T+1 tokens (inputs = window[:-1], targets = window[1:]),
// and the fixed non-overlapping windows that evaluate a whole split.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "autograd/error.h"
#include "data/shards.h"

namespace tapelm {

/// Throws data Error "<what> of N tokens is shorter than block_size + 1 = T+1" when n < T + 1.
void check_window_fits(int64_t n, int64_t T, const std::string& what);
/// Window starts 0, T, 2T, ... while start + T + 1 <= n: each position after the first is a target once.
std::vector<int64_t> eval_windows(const TokenSeq& data, int64_t T, const std::string& what = "corpus");
/// x[b] = data[starts[b] .. +T), y[b] = data[starts[b]+1 .. +T], both shaped [starts.size(), T].
void fill_windows(const TokenSeq& data, const std::vector<int64_t>& starts, int64_t T, Index& x, Index& y);

class BatchSampler {
 public:
  /// Samples from data, which must hold at least T + 1 tokens; the pages
  /// of mapped shards a batch read are released after it (the resident set stays a batch).
  BatchSampler(TokenSeq data, int64_t B, int64_t T, uint64_t seed,
               const std::string& what = "corpus");
  /// The next batch: B window starts uniform in [0, n - T - 1], x and y shaped [B, T].
  void next(Index& x, Index& y);
  /// The generator's full state as text, so a resumed run continues the same sequence.
  std::string state() const;
  /// Restores a state from state(); malformed text -> data Error.
  void set_state(const std::string& s);

  /// B.
  int64_t batch_size() const { return B_; }
  /// T.
  int64_t block_size() const { return T_; }

 private:
  /// Uniform in [0, range): outputs below 2^64 mod range are redrawn, the rest taken modulo range.
  uint64_t draw(uint64_t range);

  TokenSeq data_;
  int64_t B_, T_;
  std::mt19937_64 gen_;
  std::vector<int64_t> starts_;
};

}  // namespace tapelm
