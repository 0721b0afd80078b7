#pragma once
// The one place tapelm calls BLAS, and its thread control.
#include <cstdint>

namespace tapelm {

/// Threads for OpenMP kernels and OpenBLAS (n <= 0: all cores).
void set_num_threads(int n);
int get_num_threads();

namespace kern {

/// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = Xᵀ when the flag is set.
/// lda/ldb/ldc are the row strides of A, B, C as stored. The one place tapelm calls BLAS: a
/// product with a single row or column goes to sgemv, everything else to sgemm.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// `batch` independent sgemms whose operands start stride_a/stride_b/stride_c floats apart.
/// Small problems run one per thread with single-threaded BLAS; large ones one after another
/// with threaded BLAS.
void sgemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                   float beta, float* C, int64_t ldc, int64_t stride_c);

/// While alive, BLAS calls made from this process use one thread (for use around OpenMP regions
/// that call sgemm from several threads).
class SerialBlas {
 public:
  SerialBlas();
  ~SerialBlas();
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  int prev_;
};

}  // namespace kern
}  // namespace tapelm
