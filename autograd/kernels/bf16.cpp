// bfloat16 storage for mixed-precision products: float32 to bf16 over whole buffers (float16.h's
// f32_to_bf16: round to nearest even, as PyTorch).
#include <cstdint>

#include "autograd/float16.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/common.h"

namespace tapelm::kern {

void to_bf16(uint16_t* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

void round_bf16(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

}  // namespace tapelm::kern
