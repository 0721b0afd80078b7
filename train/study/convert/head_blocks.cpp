#include "train/study/convert/head_blocks.h"

namespace tapelm::head_blocks {

using la::Mat;

Mat rows_of(const Proj& p, int64_t h, int64_t hd) {
  const int64_t cols = p.w->dim(1);
  Mat m(hd, cols + 1);
  for (int64_t i = 0; i < hd; i++) {
    for (int64_t j = 0; j < cols; j++) m(i, j) = (*p.w)[(h * hd + i) * cols + j];
    m(i, cols) = p.b ? (*p.b)[h * hd + i] : 0.0;
  }
  return m;
}

void set_rows(const Proj& p, int64_t h, int64_t hd, const Mat& m) {
  const int64_t cols = p.w->dim(1);
  for (int64_t i = 0; i < hd; i++) {
    for (int64_t j = 0; j < cols; j++) (*p.w)[(h * hd + i) * cols + j] = static_cast<float>(m(i, j));
    if (p.b) (*p.b)[h * hd + i] = static_cast<float>(m(i, cols));
  }
}

Mat cols_of(const Tensor& wo, int64_t h, int64_t hd) {
  const int64_t d = wo.dim(0), n = wo.dim(1);
  Mat m(d, hd);
  for (int64_t i = 0; i < d; i++)
    for (int64_t j = 0; j < hd; j++) m(i, j) = wo[i * n + h * hd + j];
  return m;
}

void set_cols(Tensor& wo, int64_t h, int64_t hd, const Mat& m) {
  const int64_t d = wo.dim(0), n = wo.dim(1);
  for (int64_t i = 0; i < d; i++)
    for (int64_t j = 0; j < hd; j++) wo[i * n + h * hd + j] = static_cast<float>(m(i, j));
}

}  // namespace tapelm::head_blocks
