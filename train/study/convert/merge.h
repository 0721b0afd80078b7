#pragma once
// The merge of each group of kv heads into one, through the attention modules: pooling (with
// mean-norm's rescale) and the least-squares fit.
#include <cstdint>

#include "nn/layers.h"
#include "train/study/convert/linalg.h"
#include "train/study/convert/methods.h"

namespace tapelm {

/// dst's wk and wv (weights and biases) from src's groups of `rep` consecutive kv heads of head_dim hd, by the method's pooling and, if it rescales, mean-norm's factor.
void pool_kv(const Attention& src, const Attention& dst, const MethodRow& m, int64_t rep, int64_t hd, Rng& rng);

/// dst's wk and wv replaced by the weighted means that change the group members' attention scores
/// and outputs least, given S, the layer's calibration second moments (calibrate.h).
void fit_kv(const Attention& src, const Attention& dst, int64_t rep, int64_t hd, const la::Mat& S);

}  // namespace tapelm
