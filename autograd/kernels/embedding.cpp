#include "autograd/kernels/embedding.h"

#include <algorithm>
#include <cstring>

namespace tapelm::kern {

void embedding_fwd(float* out, const float* w, const int32_t* idx, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t t = 0; t < N; t++) std::memcpy(out + t * C, w + int64_t(idx[t]) * C, sizeof(float) * C);
}

void embedding_bwd(float* dw, const float* dout, const int32_t* idx, int64_t N, int64_t C) {
  const int64_t nb = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t blk = 0; blk < nb; blk++) {
    const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t t = 0; t < N; t++) {
      float* d = dw + int64_t(idx[t]) * C;
      const float* g = dout + t * C;
      for (int64_t c = c0; c < c1; c++) d[c] += g[c];
    }
  }
}

}  // namespace tapelm::kern
