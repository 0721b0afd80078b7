#pragma once
// Copies that change layout: axis permutation and slabs of a middle axis. Each serves as its own
// op's backward (the inverse permutation, the other direction of the slice) with add = true.
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// out = x with its axes permuted: out.shape[k] = shape[perm[k]] (ndim <= 8); add accumulates.
///   out: [shape[perm[0]], ..., shape[perm[ndim-1]]]   x: [shape[0], ..., shape[ndim-1]]
void permute(float* out, const float* x, const int64_t* shape, const int* perm, int ndim, bool add);

/// out = x[:, start:start+M, :] (add accumulates): the slice forward, and concat's backward.
///   out: [O, M, I]   x: [O, N, I]
void slice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add);
/// out[:, start:start+M, :] = x (add accumulates): concat's forward, and the slice backward.
///   out: [O, N, I]   x: [O, M, I]
void unslice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add);

}  // namespace tapelm::kern
