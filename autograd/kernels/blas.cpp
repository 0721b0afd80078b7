#include "autograd/kernels/blas.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef TAPELM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "autograd/cpu.h"
#include "autograd/error.h"
#include "autograd/kernels/common.h"
#include "autograd/runtime.h"

extern "C" {
int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP
char* openblas_get_corename(void);
}

namespace tapelm {

namespace {
int g_threads = 0;
}

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int get_num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

namespace kern {

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? n : "unknown";
}

namespace {
#ifdef TAPELM_HAVE_ONEDNN
constexpr bool kHaveOneDnn = true;
#else
constexpr bool kHaveOneDnn = false;
#endif

// The backend setting: auto (by shape, below), or one library for every product.
enum class Choice { automatic, openblas, onednn };

Choice initial_choice() {
  const char* env = std::getenv("TAPELM_GEMM");
  const std::string v = env ? env : "";
  if (v.empty() || v == "auto") return kHaveOneDnn ? Choice::automatic : Choice::openblas;
  if (v == "openblas") return Choice::openblas;
  if (v == "onednn") {
    if (!kHaveOneDnn) fail(ErrorKind::usage, "TAPELM_GEMM=onednn: this build has no oneDNN (install libdnnl-dev and rebuild)");
    return Choice::onednn;
  }
  fail(ErrorKind::usage, "TAPELM_GEMM=" + v + ": expected auto, openblas or onednn");
}

Choice& choice_slot() {
  static Choice c = initial_choice();
  return c;
}

// The auto rule depends on the vector width oneDNN's kernels run at (its own choice from cpuid,
// capped by ONEDNN_MAX_CPU_ISA), because the products where it loses to OpenBLAS differ
// (bench/GEMM.md, 2 threads, both measured on the same CPU):
//  - AVX-512: oneDNN for every product of at least 2^18 multiply-adds except x·Wᵀ with a deep
//    inner dimension (K >= 4N: the MLP's output projection forward, 0.83-0.90x there).
//  - AVX2: oneDNN for every product of at least 2^18 multiply-adds except the weight gradients
//    Xᵀ·dY (A transposed) with an output of at most 2^18 elements: its AVX2 kernels ran those at
//    0.52-0.87x OpenBLAS's speed on mid's 4096-row steps, where the deep-K forward product that
//    AVX-512 keeps on OpenBLAS ran 1.06-1.31x faster on oneDNN.
// Under 2^18 multiply-adds (a 32-row causal attention block) OpenBLAS is faster on both. A rule
// on the shape and the machine alone, never on timings, so a run computes the same bits every
// time on a given machine (resume stays bit-exact).
bool onednn_is_avx512() {
#ifdef TAPELM_HAVE_ONEDNN
  static const bool wide = dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core;
  return wide;
#else
  return false;
#endif
}

bool use_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  switch (choice_slot()) {
    case Choice::onednn: return true;
    case Choice::openblas: return false;
    case Choice::automatic:
      if (M * N * K < (int64_t{1} << 18)) return false;
      if (onednn_is_avx512()) return !(tb && K >= 4 * N);
      return !(ta && M * N <= (int64_t{1} << 18));
  }
  return false;
}
}  // namespace

int gemm_vector_lanes() {
#ifdef TAPELM_HAVE_ONEDNN
  return onednn_is_avx512() ? 16 : 8;
#else
  return 0;
#endif
}

std::string gemm_backend_description() {
  switch (choice_slot()) {
    case Choice::onednn: return "oneDNN (matrix-vector products: OpenBLAS)";
    case Choice::automatic:
      return onednn_is_avx512()
                 ? "oneDNN (AVX-512 rule), OpenBLAS for products under 2^18 multiply-adds, x·Wᵀ with K >= 4N and matrix-vector products"
                 : "oneDNN (AVX2 rule), OpenBLAS for products under 2^18 multiply-adds, Aᵀ·B with at most 2^18 outputs and matrix-vector products";
    default: return "OpenBLAS";
  }
}

bool set_gemm_backend(GemmBackend b) {
  if (b == GemmBackend::onednn && !kHaveOneDnn) return false;
  choice_slot() = b == GemmBackend::onednn ? Choice::onednn : Choice::openblas;
  return true;
}

namespace {

// Products x·Wᵀ with a few rows (2 ≤ M ≤ 16: decoding a batch of sequences one token at a time).
// OpenBLAS and oneDNN pack W for every call and reach a seventh of their peak there; this reads
// each pair of W's rows once for a block of x's rows, holding the block's rows × 2 W rows of
// vector accumulators, and spreads the W row pairs over the threads. The sum order is fixed (lanes,
// then the lanes one after another), so the result does not depend on the thread count.
#ifdef __AVX512F__
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int64_t kSmallM = 16;
// x's rows a block: its 2·MB accumulators, two W vectors and one x vector fit the 16 (AVX2) or 32
// (AVX-512) vector registers. Eight rows on AVX2 needed 19: the compiler kept them on the stack and
// ran the loop at a third of the FMA peak (the `small` study's batch-16 decoding step).
constexpr int kMaxBlockRows = kLanes == 16 ? 8 : 4;
// One vector of kLanes floats (GCC's vector extension: one ymm or zmm register), and the same
// loaded from an address with floats' alignment.
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float VecU __attribute__((vector_size(kLanes * sizeof(float)), aligned(4), may_alias));

// W's rows stream from memory, two at a time per thread: too few streams for the hardware
// prefetchers to hide the latency (the loop stalled on W's loads at a fifth of the bandwidth), so
// the first pass over a row pair also asks for the lines of the next pair, pf0 and pf1 (null: none).
template <int MB>
void small_m_block(int64_t K, const float* A, int64_t lda, const float* B0, const float* B1, float* out0, float* out1,
                   const char* pf0, const char* pf1) {
  Vec acc0[MB], acc1[MB];
  for (int m = 0; m < MB; m++) acc0[m] = acc1[m] = Vec{};
  const int64_t Kv = K / kLanes * kLanes;
  for (int64_t k = 0; k < Kv; k += kLanes) {
    if (pf0) {
      __builtin_prefetch(pf0 + k * 4);
      __builtin_prefetch(pf1 + k * 4);
    }
    const Vec b0 = *reinterpret_cast<const VecU*>(B0 + k), b1 = *reinterpret_cast<const VecU*>(B1 + k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++) {
      const Vec a = *reinterpret_cast<const VecU*>(A + m * lda + k);
      acc0[m] += a * b0;  // contracted to one FMA, as the loop over lanes before was
      acc1[m] += a * b1;
    }
  }
  for (int m = 0; m < MB; m++) {
    float s0 = 0, s1 = 0;
    for (int v = 0; v < kLanes; v++) s0 += acc0[m][v], s1 += acc1[m][v];
    for (int64_t k = Kv; k < K; k++) s0 += A[m * lda + k] * B0[k], s1 += A[m * lda + k] * B1[k];
    out0[m] = s0;
    out1[m] = s1;
  }
}

void small_m_rows(int64_t M, int64_t K, const float* A, int64_t lda, const float* B0, const float* B1, float* out0,
                  float* out1, const char* pf0, const char* pf1) {
  int64_t m = 0;
  for (; m + kMaxBlockRows <= M; m += kMaxBlockRows, pf0 = pf1 = nullptr)
    small_m_block<kMaxBlockRows>(K, A + m * lda, lda, B0, B1, out0 + m, out1 + m, pf0, pf1);
  if (kMaxBlockRows > 4 && m + 4 <= M) {
    small_m_block<4>(K, A + m * lda, lda, B0, B1, out0 + m, out1 + m, pf0, pf1);
    m += 4, pf0 = pf1 = nullptr;
  }
  if (m + 2 <= M) {
    small_m_block<2>(K, A + m * lda, lda, B0, B1, out0 + m, out1 + m, pf0, pf1);
    m += 2, pf0 = pf1 = nullptr;
  }
  for (; m < M; m++, pf0 = pf1 = nullptr) small_m_block<1>(K, A + m * lda, lda, B0, B1, out0 + m, out1 + m, pf0, pf1);
}

// The W row pairs of every product, numbered in order: pair p of the whole list is pair
// p - first[i] of product i.
struct PairList {
  const XwtProduct* ps;
  int n;
  int64_t first[kMaxXwtProducts + 1];
  int64_t total() const { return first[n]; }
  int product_of(int64_t p) const {
    int i = 0;
    while (p >= first[i + 1]) i++;
    return i;
  }
  // W's rows of pair p: the pair's two rows (the same row twice for an odd last row).
  void rows(int64_t p, const float*& b0, const float*& b1, int64_t& n0, int64_t& n1, int& i) const {
    i = product_of(p);
    const XwtProduct& q = ps[i];
    n0 = 2 * (p - first[i]);
    n1 = std::min(n0 + 1, q.N - 1);
    b0 = q.B + n0 * q.ldb;
    b1 = q.B + n1 * q.ldb;
  }
};

// C_i = alpha · A · B_iᵀ + beta · C_i (+ bias_i) for every product of the list.
void sgemm_small_m_many(int64_t M, int64_t K, const float* A, int64_t lda, const XwtProduct* ps, int n, float alpha,
                        float beta) {
  PairList pl{ps, n, {}};
  pl.first[0] = 0;
  int64_t work = 0;
  for (int i = 0; i < n; i++) {
    pl.first[i + 1] = pl.first[i] + (ps[i].N + 1) / 2;
    work += ps[i].N * K;
  }
  const int64_t pairs = pl.total();
  auto pair = [&](int64_t p) {
    const float *b0, *b1, *nb0 = nullptr, *nb1 = nullptr;
    int64_t n0, n1, nn0, nn1;
    int i, ni;
    pl.rows(p, b0, b1, n0, n1, i);
    if (p + 1 < pairs) pl.rows(p + 1, nb0, nb1, nn0, nn1, ni);
    float r0[kSmallM], r1[kSmallM];
    small_m_rows(M, K, A, lda, b0, b1, r0, r1, reinterpret_cast<const char*>(nb0), reinterpret_cast<const char*>(nb1));
    const XwtProduct& q = ps[i];
    for (int64_t m = 0; m < M; m++) {
      float* c = q.C + m * q.ldc;
      c[n0] = alpha * r0[m] + (beta == 0.f ? 0.f : beta * c[n0]);
      if (n1 != n0) c[n1] = alpha * r1[m] + (beta == 0.f ? 0.f : beta * c[n1]);
      if (q.bias) {
        c[n0] += q.bias[n0];
        if (n1 != n0) c[n1] += q.bias[n1];
      }
    }
  };
  if (!omp_in_parallel() && work >= (1 << 16)) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; p++) pair(p);
  } else {
    for (int64_t p = 0; p < pairs; p++) pair(p);
  }
}

void sgemm_small_m(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                   float beta, float* C, int64_t ldc) {
  const XwtProduct p{B, ldb, N, C, ldc, nullptr};
  sgemm_small_m_many(M, K, A, lda, &p, 1, alpha, beta);
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (!ta && tb && M >= 2 && M <= kSmallM && K >= 64 && N >= 64) {
    sgemm_small_m(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // A product with one row or one column is a matrix-vector product: OpenBLAS's sgemm small
  // kernels are several times slower than its sgemv there (one-token decoding is all of these).
  if (M == 1 && K > 0) {  // Cᵀ = op(B)ᵀ · op(A)ᵀ
    cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, (int)(tb ? N : K), (int)(tb ? K : N), alpha, B,
                (int)ldb, A, ta ? (int)lda : 1, beta, C, 1);
    return;
  }
  if (N == 1 && K > 0) {  // C = op(A) · op(B)
    cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, (int)(ta ? K : M), (int)(ta ? M : K), alpha, A,
                (int)lda, B, tb ? 1 : (int)ldb, beta, C, (int)ldc);
    return;
  }
#ifdef TAPELM_HAVE_ONEDNN
  if (use_onednn(ta, tb, M, N, K)) {
    const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success) fail(ErrorKind::internal, "dnnl_sgemm failed with status " + std::to_string(int(st)));
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
              (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void sgemm_xwt_many(int64_t M, int64_t K, const float* A, int64_t lda, const XwtProduct* ps, int n) {
  if (n < 1 || n > kMaxXwtProducts) fail(ErrorKind::internal, "sgemm_xwt_many: " + std::to_string(n) + " products");
  if (M >= 1 && M <= kSmallM && K >= 64) {
    sgemm_small_m_many(M, K, A, lda, ps, n, 1.f, 0.f);
    return;
  }
  for (int i = 0; i < n; i++) {
    const XwtProduct& q = ps[i];
    sgemm(false, true, M, q.N, K, 1.f, A, lda, q.B, q.ldb, 0.f, q.C, q.ldc);
    if (q.bias) {
#pragma omp parallel for schedule(static) if (M * q.N >= kParallelMin)
      for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < q.N; j++) q.C[m * q.ldc + j] += q.bias[j];
    }
  }
}

SerialBlas::SerialBlas() : prev_(openblas_get_num_threads()) {
  // The OpenMP build of OpenBLAS already runs serially inside a parallel region.
  if (openblas_get_parallel() == 1 && prev_ != 1) openblas_set_num_threads(1);
}

SerialBlas::~SerialBlas() {
  if (openblas_get_parallel() == 1 && prev_ != 1) openblas_set_num_threads(prev_);
}

void sgemm_batched(int64_t batch, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C,
                   int64_t ldc, int64_t sc) {
  const double flops = 2.0 * M * N * K;
  const int nt = get_num_threads();
  // One matrix per thread pays when there are enough of them and each is too small for
  // OpenBLAS to split well.
  if (batch >= nt && flops < 4e6 && !omp_in_parallel()) {
    SerialBlas serial;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; b++)
      sgemm(ta, tb, M, N, K, alpha, A + b * sa, lda, B + b * sb, ldb, beta, C + b * sc, ldc);
  } else {
    for (int64_t b = 0; b < batch; b++)
      sgemm(ta, tb, M, N, K, alpha, A + b * sa, lda, B + b * sb, ldb, beta, C + b * sc, ldc);
  }
}

// ---- bf16 products -------------------------------------------------------------------------

std::string bf16_gemm_native_missing() {
  const CpuInfo& c = cpu_info();
  if (!c.avx512bf16) return "this CPU has no avx512_bf16 (it runs " + cpu_simd_level(c) + ")";
  if (!kHaveOneDnn) return "this build has no oneDNN (install libdnnl-dev and rebuild)";
#ifdef TAPELM_HAVE_ONEDNN
  if (dnnl_get_effective_cpu_isa() < dnnl_cpu_isa_avx512_core_bf16)
    return "oneDNN is held below avx512_core_bf16 (ONEDNN_MAX_CPU_ISA)";
#endif
  return "";
}

namespace {

#ifdef TAPELM_HAVE_ONEDNN
void check_dnnl(dnnl_status_t st, const char* what) {
  if (st != dnnl_success) fail(ErrorKind::internal, std::string("oneDNN bf16 matmul: ") + what + " failed with status " + std::to_string(int(st)));
}

// C = alpha·op(A)·op(B) + beta·C by oneDNN's matmul primitive: bf16 source and weights, f32
// destination; the transposes are strides, alpha an output scale, beta a sum post-op. oneDNN's
// primitive cache makes the creation for a shape seen before cheap.
void gemm_bf16_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                      const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    check_dnnl(dnnl_engine_create(&e, dnnl_cpu, 0), "engine");
    return e;
  }();
  static dnnl_stream_t stream = [] {
    dnnl_stream_t s = nullptr;
    check_dnnl(dnnl_stream_create(&s, engine, dnnl_stream_default_flags), "stream");
    return s;
  }();
  dnnl_memory_desc_t a_md, b_md, c_md;
  const dnnl_dims_t a_dims{M, K}, b_dims{K, N}, c_dims{M, N};
  const dnnl_dims_t a_str{ta ? 1 : lda, ta ? lda : 1}, b_str{tb ? 1 : ldb, tb ? ldb : 1}, c_str{ldc, 1};
  check_dnnl(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str), "source descriptor");
  check_dnnl(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str), "weights descriptor");
  check_dnnl(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str), "destination descriptor");
  dnnl_matmul_desc_t desc;
  check_dnnl(dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), "descriptor");
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t ops = nullptr;
  check_dnnl(dnnl_primitive_attr_create(&attr), "attributes");
  if (alpha != 1.f) check_dnnl(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "alpha");
  if (beta != 0.f) {
    check_dnnl(dnnl_post_ops_create(&ops), "post-ops");
    check_dnnl(dnnl_post_ops_append_sum(ops, beta), "beta");
    check_dnnl(dnnl_primitive_attr_set_post_ops(attr, ops), "post-ops");
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr);
  if (ops) dnnl_post_ops_destroy(ops);
  dnnl_primitive_attr_destroy(attr);
  check_dnnl(st, "primitive descriptor");
  dnnl_primitive_t prim = nullptr;
  check_dnnl(dnnl_primitive_create(&prim, pd), "primitive");
  dnnl_primitive_desc_destroy(pd);
  dnnl_memory_t am = nullptr, bm = nullptr, cm = nullptr;
  check_dnnl(dnnl_memory_create(&am, &a_md, engine, const_cast<uint16_t*>(A)), "source memory");
  check_dnnl(dnnl_memory_create(&bm, &b_md, engine, const_cast<uint16_t*>(B)), "weights memory");
  check_dnnl(dnnl_memory_create(&cm, &c_md, engine, C), "destination memory");
  const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  const dnnl_status_t run = dnnl_primitive_execute(prim, stream, 3, args);
  if (run == dnnl_success) dnnl_stream_wait(stream);
  dnnl_memory_destroy(am);
  dnnl_memory_destroy(bm);
  dnnl_memory_destroy(cm);
  dnnl_primitive_destroy(prim);
  check_dnnl(run, "execution");
}
#endif

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  static const std::string missing = bf16_gemm_native_missing();  // the CPU and the build do not change
  if (!missing.empty()) fail(ErrorKind::internal, "gemm_bf16: " + missing);
#ifdef TAPELM_HAVE_ONEDNN
  gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

}  // namespace kern
}  // namespace tapelm
