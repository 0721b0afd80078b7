#pragma once
// Products of packed weights (autograd/ops.h's PackedMatrix) with float32 activations: q8_0
// weights with activations quantized the same way (ggml's q8_0 × q8_0 dot product: int8
// multiplies, int32 sums per block, scaled and accumulated in f32), and 16-bit weights (bf16 or
// IEEE half) widened to float32 as they are read.
#include <cstdint>

#include "autograd/quant.h"

namespace tapelm::kern {

/// Σ a_i b_i of two q8_0 rows of n values: per block the int32 sum of the int8 products times
/// both scales, summed in f32 (ggml's ggml_vec_dot_q8_0_q8_0).
float dot_q8_0(const uint8_t* a, const uint8_t* b, int64_t n);

/// y [M, N] = x [M, K] · Wᵀ (+ bias [N]) for W [N, K] in q8_0 rows (K a multiple of 32), with x
/// rounded to q8_0 row by row as ggml does. Up to kQ8RowsDirect rows, int8 dot products, each W
/// row read once for all M rows (decoding, bound by reading the weights); more rows (a prefill):
/// the rounded x and W widened panel by panel, multiplied by sgemm (faster than int8 dot products
/// there; the same products, summed in another order). The sum order does not depend on the
/// thread count.
constexpr int64_t kQ8RowsDirect = 16;
void matmul_q8_0(float* y, const float* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, const float* bias);

/// dst [n] = src rounded to nearest even in IEEE half, on the threads (bf16: kern::to_bf16);
/// returns -1, or the first index of a finite value f16 cannot hold (it would become infinite).
int64_t to_f16(uint16_t* dst, const float* src, int64_t n);

/// The first of n bf16 (bf16 true) or IEEE half values that is infinite or NaN, or -1; on the
/// threads (a mapped file's weights, checked once before they are used).
int64_t first_non_finite_w16(const uint16_t* h, int64_t n, bool bf16);
/// The first of `blocks` q8_0 blocks whose f16 scale is infinite or NaN, or -1.
int64_t first_non_finite_q8_0(const uint8_t* q, int64_t blocks);

/// y [M, N] = x [M, K] · Wᵀ (+ bias [N]) for W [N, K] in bf16 (bf16 true) or IEEE half: the
/// products of W's widened values. Up to kW16RowsDirect rows, each W row is read once for all M
/// rows and widened in registers (decoding, bound by reading the weights: half of float32's
/// bytes); more rows (a prefill): W widened panel by panel, multiplied by sgemm. The sum order
/// does not depend on the thread count.
constexpr int64_t kW16RowsDirect = 16;
void matmul_w16(float* y, const float* x, int64_t M, int64_t K, const uint16_t* W, int64_t N, const float* bias,
                bool bf16);

}  // namespace tapelm::kern
