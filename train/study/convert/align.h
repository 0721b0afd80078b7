#pragma once
// The function-preserving steps of a conversion: they change a model's weights but not, up to
// rounding, its outputs. Both act on the source's copy before its groups are merged.
#include <cstdint>
#include <vector>

#include "nn/gpt.h"
#include "train/study/convert/calibrate.h"

namespace tapelm {

/// Rotates every kv head of each group of `rep` consecutive kv heads onto the group's common
/// reference (generalised Procrustes on the calibration activations; RoPE models: 2×2 rotations
/// on each RoPE plane of the keys only) and folds the rotations into wq/wk and wv/wo.
void align_kv_heads(GPT& model, int64_t rep, const Calibration& c);

/// The kv-head order of layer `layer` that puts similar heads into the same group of `rep`
/// (swap search on aligned K and V activation distances): perm[new position] = old kv head.
std::vector<int64_t> similar_order(const GPT& model, int64_t layer, int64_t rep, const Calibration& c);

/// Permutes layer `layer`'s kv heads (rows of wk, wv) and with them their query heads (rows of
/// wq, columns of wo): new kv head j is old kv head perm[j].
void permute_kv_heads(GPT& model, int64_t layer, const std::vector<int64_t>& perm);

/// The same three steps on one layer's attention, with that layer's calibration second moments
/// S (what a conversion that holds one block at a time calls).
void align_kv_heads(const Attention& at, const GPTConfig& cfg, int64_t rep, const la::Mat& S);
std::vector<int64_t> similar_order(const Attention& at, const GPTConfig& cfg, int64_t rep, const la::Mat& S);
void permute_kv_heads(const Attention& at, const GPTConfig& cfg, const std::vector<int64_t>& perm);

}  // namespace tapelm
