#pragma once
// 8-bit and 16-bit storage for inference: ggml's q8_0 blocks (32 int8 values and an f16 scale
// d = max|x| / 127: 34 bytes per 32 values), products of q8_0 weights with activations quantized
// the same way (ggml's q8_0 × q8_0 dot product: int8 multiplies, int32 sums per block, scaled and
// accumulated in f32), and the rows of a 16-bit or 8-bit KV cache.
#include <cstdint>

namespace tapelm::kern {

constexpr int64_t kQ8Block = 32;       // values per q8_0 block
constexpr int64_t kQ8BlockBytes = 34;  // f16 scale + 32 int8

/// Bytes of n values (n a multiple of kQ8Block) in q8_0.
inline int64_t q8_0_bytes(int64_t n) { return n / kQ8Block * kQ8BlockBytes; }
/// x [n] (n a multiple of 32) -> q8_0 blocks as ggml's quantize_row_q8_0_ref: q = round(x / d).
/// Returns -1, or the first block whose scale overflows f16 (|x| beyond 127 · 65504).
int64_t quantize_q8_0(uint8_t* out, const float* x, int64_t n);
/// out [n] = the values of n q8_0-quantized values.
void dequantize_q8_0(float* out, const uint8_t* q, int64_t n);
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

/// How a KV cache stores its values. f16 and bf16 round to nearest even; q8 is q8_0 blocks along
/// each head's row of hd values (hd a multiple of 32), one scale per block.
enum class KvType { f32, f16, bf16, q8 };
/// Bytes of one cached row of hd values.
int64_t kv_row_bytes(KvType t, int64_t hd);
/// Stores n rows of hd floats as `t`, rows of kv_row_bytes(t, hd) bytes.
void kv_encode_rows(KvType t, uint8_t* dst, const float* src, int64_t n, int64_t hd);
/// The values of n stored rows, widened to f32 (vector conversions).
void kv_decode_rows(KvType t, float* dst, const uint8_t* src, int64_t n, int64_t hd);

}  // namespace tapelm::kern
