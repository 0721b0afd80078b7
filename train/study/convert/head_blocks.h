#pragma once
// A head's slice of an attention projection as a double matrix, for the conversion's linear
// algebra: rows h·hd … (h+1)·hd−1 of wq/wk/wv with the bias as an extra column, or the matching
// columns of wo. Shared by the function-preserving steps (heads.h) and the merge (merge.h).
#include <cstdint>

#include "nn/layers.h"
#include "train/study/convert/linalg.h"

namespace tapelm::head_blocks {

/// A projection: weight [rows, cols] and optional bias [rows]; rows are head-major.
struct Proj {
  Tensor* w;
  Tensor* b;
};

inline Proj proj(const Linear& l) { return {&l.weight.val(), l.bias.defined() ? &l.bias.val() : nullptr}; }

/// Rows [h·hd, (h+1)·hd) as W̃ = [W | b] (hd × (cols+1)), a zero last column without bias.
la::Mat rows_of(const Proj& p, int64_t h, int64_t hd);
/// Writes W̃ back into rows [h·hd, (h+1)·hd) (and the bias, if the projection has one).
void set_rows(const Proj& p, int64_t h, int64_t hd, const la::Mat& m);
/// Columns [h·hd, (h+1)·hd) of wo [d, H·hd] (d × hd).
la::Mat cols_of(const Tensor& wo, int64_t h, int64_t hd);
void set_cols(Tensor& wo, int64_t h, int64_t hd, const la::Mat& m);
/// W̃_a Σ W̃_bᵀ: the Gram matrix A_aᵀ A_b of the activations A = X̃ W̃ᵀ of two head blocks.
inline la::Mat cross_gram(const la::Mat& wa, const la::Mat& S, const la::Mat& wb) {
  return la::matmul_nt(la::matmul(wa, S), wb);
}

}  // namespace tapelm::head_blocks
