#pragma once
// The one place tapelm calls BLAS. The thread count of BLAS and of the OpenMP kernels is set
// through autograd/runtime.h (implemented in blas.cpp, next to the BLAS calls).
#include <cstdint>
#include <string>

namespace tapelm::kern {

/// The kernel set OpenBLAS runs (openblas_get_corename(): "Cooperlake", "Haswell", "Prescott", ...).
std::string blas_core_name();

/// The library behind sgemm. TAPELM_GEMM (read once): auto (the default in a build with oneDNN)
/// sends products to oneDNN's dnnl_sgemm except those under 2^18 multiply-adds and x·Wᵀ with
/// K >= 4N, which go to OpenBLAS (see use_onednn in blas.cpp);
/// openblas or onednn send every product to one library. Matrix-vector products always go to
/// OpenBLAS's sgemv.
enum class GemmBackend { openblas, onednn };
/// "OpenBLAS", "oneDNN": the backend in use; "oneDNN, OpenBLAS for matrix-vector products" etc.
std::string gemm_backend_description();
/// Tests and benchmarks: send every product to this backend from now on (onednn in a build
/// without it -> false).
bool set_gemm_backend(GemmBackend b);

/// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = Xᵀ when the flag is set.
/// lda/ldb/ldc are the row strides of A, B, C as stored. The one place tapelm calls BLAS: a
/// product with a single row or column goes to sgemv, everything else to sgemm.
///   C: [M, ldc]   A: [M, lda] ([K, lda] if trans_a)   B: [K, ldb] ([N, ldb] if trans_b)
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// `batch` independent sgemms whose operands start stride_a/stride_b/stride_c floats apart.
/// Small problems run one per thread with single-threaded BLAS; large ones one after another
/// with threaded BLAS.
///   C, A, B: `batch` matrices each shaped as in sgemm, stride_c, stride_a, stride_b floats apart
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

}  // namespace tapelm::kern
