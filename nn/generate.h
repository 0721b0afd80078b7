#pragma once
// Sampling from a GPT with the KV cache: greedy, temperature, top-k, seeded.
#include <functional>
#include <vector>

#include "nn/gpt.h"

namespace tapelm {

struct SampleOptions {
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = 0;  // 0: all
  int64_t vocab_limit = 0;  // > 0: ids >= vocab_limit are never drawn (a tokenizer smaller than the vocabulary)
  KvType kv_cache = KvType::f32;  // how the cache stores K and V
  int32_t stop_id = -1;     // >= 0: generation ends when every sequence draws it (llama2.c's run.c stops
                            // at BOS); that step's ids are not handed on
};

/// Called with each step's new ids, one per sequence, as they are drawn.
using TokenSink = std::function<void(const std::vector<int32_t>&)>;

/// One id per row of logits [B, V].
std::vector<int32_t> sample_next(const Tensor& logits, const SampleOptions& opt, Rng& rng);

/// Continues each prompt (all of one length >= 1) by n_new tokens, handing each step's ids to
/// `sink` as they are drawn. Within block_size one forward per token reuses the cache; past it the
/// context is cropped to the last block_size tokens as nanoGPT does (re-filling the cache each
/// step). Keeps only that context, so n_new is not bounded by memory.
void generate_stream(const Decoder& model, const std::vector<std::vector<int32_t>>& prompts, int64_t n_new,
                     const SampleOptions& opt, uint64_t seed, const TokenSink& sink);
/// generate_stream, collected: prompt + new tokens per sequence.
std::vector<std::vector<int32_t>> generate(const Decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                           int64_t n_new, const SampleOptions& opt, uint64_t seed);

}  // namespace tapelm
