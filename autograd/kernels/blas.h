#pragma once
// The one place tapelm calls BLAS. The thread count of BLAS and of the OpenMP kernels is set
// through autograd/runtime.h (implemented in blas.cpp, next to the BLAS calls).
#include <cstdint>
#include <string>

namespace tapelm::kern {

/// The kernel set OpenBLAS runs (openblas_get_corename(): "Cooperlake", "Haswell", "Prescott", ...).
std::string blas_core_name();

/// The library behind sgemm. TAPELM_GEMM (read once): auto (the default in a build with oneDNN)
/// sends most products to oneDNN's dnnl_sgemm and the rest to OpenBLAS by a rule on the shape and
/// on oneDNN's vector width (use_onednn in blas.cpp); openblas or onednn send every product to one
/// library. Matrix-vector products always go to OpenBLAS's sgemv, x·Wᵀ with 2-16 rows to
/// tapelm's own few-row kernel.
enum class GemmBackend { openblas, onednn };
/// "OpenBLAS", "oneDNN": the backend in use; "oneDNN, OpenBLAS for matrix-vector products" etc.
std::string gemm_backend_description();
/// fp32 lanes of the vector units the GEMMs run on: 16 when oneDNN runs its AVX-512 kernels,
/// 8 when it is held to AVX2 (its own choice or ONEDNN_MAX_CPU_ISA); 0 without oneDNN (unknown).
int gemm_vector_lanes();
/// Tests and benchmarks: send every product to this backend from now on (onednn in a build
/// without it -> false).
bool set_gemm_backend(GemmBackend b);

/// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(X) = Xᵀ when the flag is set.
/// lda/ldb/ldc are the row strides of A, B, C as stored. The one place tapelm calls BLAS: a
/// product with a single row or column goes to sgemv, everything else to sgemm.
///   C: [M, ldc]   A: [M, lda] ([K, lda] if trans_a)   B: [K, ldb] ([N, ldb] if trans_b)
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// One of several products x·Wᵢᵀ of the same x: C[M, N] = x · Bᵀ (+ bias on every row).
///   B: [N, ldb]   C: [M, ldc]   bias: [N] or null
struct XwtProduct {
  const float* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
  const float* bias;
};
constexpr int kMaxXwtProducts = 4;
/// C_i = A · B_iᵀ (+ bias_i) for n ≤ kMaxXwtProducts products of the same A (a decoding step's
/// query, key and value projections; SwiGLU's gate and up). With 1 ≤ M ≤ 16 rows every product's
/// W rows are spread over the threads in one parallel region, read once for all M rows (decoding
/// is bound by reading the weights; one fork and one barrier instead of one per product); more
/// rows: one sgemm each. The sum order does not depend on the thread count.
///   A: [M, lda]
void sgemm_xwt_many(int64_t M, int64_t K, const float* A, int64_t lda, const XwtProduct* ps, int n);

/// `batch` independent sgemms whose operands start stride_a/stride_b/stride_c floats apart.
/// Small problems run one per thread with single-threaded BLAS; large ones one after another
/// with threaded BLAS.
///   C, A, B: `batch` matrices each shaped as in sgemm, stride_c, stride_a, stride_b floats apart
void sgemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                   float beta, float* C, int64_t ldc, int64_t stride_c);

/// bfloat16 buffers (float32's upper half; autograd/float16.h): dst = bf16(src), rounded to
/// nearest even (NaN stays NaN); round_bf16 keeps the bf16 values in float32.
///   dst, src: [n]
void to_bf16(uint16_t* dst, const float* src, int64_t n);
void round_bf16(float* dst, const float* src, int64_t n);

/// "" when gemm_bf16 can run here: a build with oneDNN on a CPU with AVX512-BF16 (or AMX, which
/// comes with it); otherwise what is missing ("this CPU has no avx512_bf16 (it runs AVX2+FMA)",
/// "this build has no oneDNN").
std::string bf16_gemm_native_missing();
/// C[M,N] = alpha · op(A) · op(B) + beta · C, as sgemm but with A and B in bf16 (C float32,
/// accumulation float32) on bf16 instructions: oneDNN's matmul. An internal Error where
/// bf16_gemm_native_missing() is not empty. (sgemm on round_bf16'd operands gives the same
/// products, each exact in float32, summed in another order.)
///   C: [M, ldc]   A: [M, lda] ([K, lda] if trans_a)   B: [K, ldb] ([N, ldb] if trans_b)
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

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
