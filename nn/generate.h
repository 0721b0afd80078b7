#pragma once
// Sampling from a GPT with the KV cache: greedy, temperature, top-k, seeded.
#include <vector>

#include "nn/gpt.h"

namespace tapelm {

struct SampleOptions {
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = 0;  // 0: all
};

/// One id per row of logits [B, V].
std::vector<int32_t> sample_next(const Tensor& logits, const SampleOptions& opt, Rng& rng);

/// Continues each prompt (all of one length >= 1) by n_new tokens. Within block_size one forward
/// per token reuses the cache; past it the context is cropped to the last block_size tokens as
/// nanoGPT does (re-filling the cache each step). Returns prompt + new tokens per sequence.
std::vector<std::vector<int32_t>> generate(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                                           int64_t n_new, const SampleOptions& opt, uint64_t seed);

}  // namespace tapelm
