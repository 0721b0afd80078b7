#include "autograd/kernels/layout.h"

#include <cstring>

namespace tapelm::kern {

void permute(float* out, const float* x, const int64_t* shape, const int* perm, int ndim, bool add) {
  int64_t in_stride[8], out_shape[8];
  in_stride[ndim - 1] = 1;
  for (int k = ndim - 2; k >= 0; k--) in_stride[k] = in_stride[k + 1] * shape[k + 1];
  int64_t total = 1;
  for (int k = 0; k < ndim; k++) {
    out_shape[k] = shape[perm[k]];
    total *= out_shape[k];
  }
  if (total == 0) return;
  const int64_t L = out_shape[ndim - 1], rows = total / L, step = in_stride[perm[ndim - 1]];
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t r = 0; r < rows; r++) {
    int64_t rem = r, off = 0;
    for (int k = ndim - 2; k >= 0; k--) {
      off += (rem % out_shape[k]) * in_stride[perm[k]];
      rem /= out_shape[k];
    }
    float* o = out + r * L;
    const float* xi = x + off;
    if (add)
      for (int64_t j = 0; j < L; j++) o[j] += xi[j * step];
    else
      for (int64_t j = 0; j < L; j++) o[j] = xi[j * step];
  }
}

void slice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add) {
#pragma omp parallel for schedule(static) if (O * M * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++) {
    const float* s = x + (o * N + start) * I;
    float* d = out + o * M * I;
    if (add)
      for (int64_t i = 0; i < M * I; i++) d[i] += s[i];
    else
      std::memcpy(d, s, sizeof(float) * M * I);
  }
}

void unslice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add) {
#pragma omp parallel for schedule(static) if (O * M * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++) {
    float* d = out + (o * N + start) * I;
    const float* s = x + o * M * I;
    if (add)
      for (int64_t i = 0; i < M * I; i++) d[i] += s[i];
    else
      std::memcpy(d, s, sizeof(float) * M * I);
  }
}

}  // namespace tapelm::kern
