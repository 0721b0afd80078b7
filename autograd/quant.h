#pragma once
// 8-bit and 16-bit storage for inference, as the file formats and the KV cache store values:
// ggml's q8_0 blocks (32 int8 values and an f16 scale d = max|x| / 127: 34 bytes per 32 values)
// and the rows of a 16-bit or 8-bit KV cache. Implemented beside the kernels that read them
// (autograd/kernels/quant.cpp); the products of q8_0 weights are in autograd/kernels/quant.h.
#include <array>
#include <cstdint>
#include <utility>

#include "autograd/names.h"

namespace tapelm {

constexpr int64_t kQ8Block = 32;       // values per q8_0 block
constexpr int64_t kQ8BlockBytes = 34;  // f16 scale + 32 int8

/// Bytes of n values (n a multiple of kQ8Block) in q8_0.
inline int64_t q8_0_bytes(int64_t n) { return n / kQ8Block * kQ8BlockBytes; }
/// x [n] (n a multiple of 32) -> q8_0 blocks as ggml's quantize_row_q8_0_ref: q = round(x / d).
/// Returns -1, or the first block whose scale overflows f16 (|x| beyond 127 · 65504).
int64_t quantize_q8_0(uint8_t* out, const float* x, int64_t n);
/// quantize_q8_0 of each row of x [rows, cols] into rows of q8_0_bytes(cols), on the threads;
/// returns -1 or a row holding a block that overflows.
int64_t quantize_q8_0_rows(uint8_t* out, const float* x, int64_t rows, int64_t cols);
/// out [n] = the values of n q8_0-quantized values.
void dequantize_q8_0(float* out, const uint8_t* q, int64_t n);

/// The type a model's weights are stored in (--dtype; each format's row says which it holds,
/// and --weights: what decoding multiplies by):
/// float32, bfloat16, IEEE half, and GGUF's q8_0 (blocks of 32 int8 with one f16 scale).
enum class WeightType { f32, bf16, f16, q8_0 };
template <> struct EnumNames<WeightType> {
  static constexpr std::array<std::pair<WeightType, const char*>, 4> values{
      {{WeightType::f32, "f32"}, {WeightType::bf16, "bf16"}, {WeightType::f16, "f16"}, {WeightType::q8_0, "q8_0"}}};
};

/// The bytes of a matrix [rows, cols] stored as `type` (q8_0: cols a multiple of 32).
inline int64_t packed_bytes(WeightType type, int64_t rows, int64_t cols) {
  return type == WeightType::q8_0 ? rows * q8_0_bytes(cols) : rows * cols * (type == WeightType::f32 ? 4 : 2);
}

/// Float32 values stored in 16 bits (type bf16 or f16, rounded to nearest even), on the threads:
/// returns how many of the n values the type did not hold exactly (0: the narrowing lost nothing),
/// and in first_overflow (when given) the first finite value that rounded to infinity, or -1.
/// With dst null nothing is stored: only the count (and first_overflow).
int64_t narrow_values(WeightType type, uint16_t* dst, const float* src, int64_t n, int64_t* first_overflow = nullptr);
/// dst [n] = the float32 values of n stored in 16 bits (bf16 or f16): exact. On the threads.
void widen_values(WeightType type, float* dst, const uint16_t* src, int64_t n);
/// Whether every one of the n values is one `type` (bf16 or f16) holds exactly.
inline bool holds_exactly(WeightType type, const float* x, int64_t n) { return narrow_values(type, nullptr, x, n) == 0; }

/// How a KV cache stores its values. f16 and bf16 round to nearest even; q8 is q8_0 blocks along
/// each head's row of hd values (hd a multiple of 32), one scale per block.
enum class KvType { f32, f16, bf16, q8 };
template <> struct EnumNames<KvType> {
  static constexpr std::array<std::pair<KvType, const char*>, 4> values{
      {{KvType::f32, "f32"}, {KvType::f16, "f16"}, {KvType::bf16, "bf16"}, {KvType::q8, "q8"}}};
};
/// Bytes of one cached row of hd values.
int64_t kv_row_bytes(KvType t, int64_t hd);
/// Stores n rows of hd floats as `t`, rows of kv_row_bytes(t, hd) bytes.
void kv_encode_rows(KvType t, uint8_t* dst, const float* src, int64_t n, int64_t hd);
/// The values of n stored rows, widened to f32 (vector conversions).
void kv_decode_rows(KvType t, float* dst, const uint8_t* src, int64_t n, int64_t hd);
/// dst = the values n rows of src stand for once stored as t, on the threads.
void kv_round_rows(KvType t, float* dst, const float* src, int64_t n, int64_t hd);

}  // namespace tapelm
