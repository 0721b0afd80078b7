// bfloat16 storage for mixed-precision products: float32 to bf16 (round to nearest even, as
// float16.h's f32_to_bf16 and PyTorch) and back, over whole buffers.
#include <cstdint>

#include "autograd/float16.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/common.h"

namespace tapelm::kern {

namespace {
// f32_to_bf16 without a branch, so that the loops over it vectorise: NaN keeps its sign and
// becomes quiet, everything else rounds to nearest even on the 16 dropped bits.
inline uint32_t bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}
}  // namespace

void to_bf16(uint16_t* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] = static_cast<uint16_t>(bf16_bits(src[i]));
}

void round_bf16(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] = bits_float(bf16_bits(src[i]) << 16);
}

void from_bf16(float* dst, const uint16_t* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] = bits_float(static_cast<uint32_t>(src[i]) << 16);
}

}  // namespace tapelm::kern
