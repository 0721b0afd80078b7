#include "autograd/kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "autograd/kernels/blas.h"
#include "autograd/kernels/common.h"
#include "autograd/error.h"
#include "autograd/float16.h"

namespace tapelm {

namespace {
// How far ahead of a batch-1 decoding product's reads the weight rows are prefetched. 8 blocks of
// a q8_0 row (272 bytes), as before, left one Zen 3 core reading 7.3 GB/s of q8_0 rows from DRAM
// and the 6-layer model of bench/decode_ab.sh (20 MB, about L3's size) at 3.5 ms a pass; 8 KB
// ahead, 8.6 GB/s and 2.4 ms (a micro-benchmark of the products alone, 4 repetitions' medians;
// 2 threads: 12.4 -> 14.2 GB/s, 1.67 -> 0.88 ms with four W rows at a time). bf16 rows of a 7B
// model from DRAM, 2 threads: 14.3-14.7 GB/s 512 bytes ahead, 15.2-16.0 at 8 KB. A prefetch
// never faults, so the distance may run past a matrix's end.
constexpr int64_t kPrefetchBytes = 8192;

inline float scale_of(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

#if defined(__AVX2__)
// The sums of each 4-byte group of u·s (u unsigned, s signed bytes) in 8 int32 lanes, as floats:
// VPDPBUSD in one instruction where the build has VNNI (AVX512-VNNI with VL, or AVX-VNNI), else
// byte pairs summed to int16 (at most 2 · 128 · 127: no saturation for q8_0's -127..127 weights)
// and a multiply-add with ones. Exact integer sums either way, so the same floats.
inline __m256 dot_u8s8_ps(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#elif defined(__AVXVNNI__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s));
#else
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
#endif
}  // namespace

int64_t quantize_q8_0(uint8_t* out, const float* x, int64_t n) {
  int64_t bad = -1;
  for (int64_t blk = 0; blk < n / kQ8Block; blk++) {
    const float* v = x + blk * kQ8Block;
    float amax = 0;
    for (int64_t j = 0; j < kQ8Block; j++) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    const uint16_t dh = f32_to_f16(d);
    if ((dh & 0x7c00u) == 0x7c00u && bad < 0) bad = blk;
    uint8_t* o = out + blk * kQ8BlockBytes;
    std::memcpy(o, &dh, 2);
    for (int64_t j = 0; j < kQ8Block; j++) o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id)));
  }
  return bad;
}

void dequantize_q8_0(float* out, const uint8_t* q, int64_t n) {
  for (int64_t blk = 0; blk < n / kQ8Block; blk++) {
    const uint8_t* b = q + blk * kQ8BlockBytes;
    const float d = scale_of(b);
    float* o = out + blk * kQ8Block;
#if defined(__AVX2__)
    const __m256 vd = _mm256_set1_ps(d);
    for (int j = 0; j < kQ8Block; j += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + j));
      _mm256_storeu_ps(o + j, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
    }
#else
    for (int j = 0; j < kQ8Block; j++) o[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
#endif
  }
}

int64_t quantize_q8_0_rows(uint8_t* out, const float* x, int64_t rows, int64_t cols) {
  const int64_t rb = q8_0_bytes(cols);
  int64_t bad = -1;
#pragma omp parallel for schedule(static) if (rows * cols > kern::kParallelMin)
  for (int64_t r = 0; r < rows; r++)
    if (quantize_q8_0(out + r * rb, x + r * cols, cols) >= 0) {
#pragma omp critical(tapelm_q8_bad)
      bad = r;
    }
  return bad;
}

namespace kern {

float dot_q8_0(const uint8_t* a, const uint8_t* b, int64_t n) {
  const int64_t nb = n / kQ8Block;
#if defined(__AVX2__) && defined(__FMA__)
  // |a| · (b · sign a) as unsigned × signed bytes, summed to int32 (dot_u8s8_ps); one f32
  // multiply-add per block. a (a weight row, streamed from memory in decoding, the next rows after
  // it) is prefetched kPrefetchBytes ahead.
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *pa = a + i * kQ8BlockBytes, *pb = b + i * kQ8BlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(pa + kPrefetchBytes), _MM_HINT_T0);
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2));
    const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2));
    const __m256 p = dot_u8s8_ps(_mm256_sign_epi8(qa, qa), _mm256_sign_epi8(qb, qa));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale_of(pa) * scale_of(pb)), p, acc);
  }
  return hsum8(acc);
#else
  float s = 0;
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *pa = a + i * kQ8BlockBytes, *pb = b + i * kQ8BlockBytes;
    int32_t sum = 0;
    for (int j = 0; j < kQ8Block; j++)
      sum += static_cast<int32_t>(static_cast<int8_t>(pa[2 + j])) * static_cast<int32_t>(static_cast<int8_t>(pb[2 + j]));
    s += scale_of(pa) * scale_of(pb) * static_cast<float>(sum);
  }
  return s;
#endif
}

namespace {
// out[m] = dot_q8_0(w, x + m·rb, K) for four rows of x whose block scales are xs [4, K/32]: each W
// block is loaded, its signs taken and its scale widened once for the four (at batch 16 the
// products, not the memory, bound a step). Sums in the order of dot_q8_0.
void dot4x_q8_0(float* out, const uint8_t* w, const uint8_t* x, int64_t rb, const float* xs, int64_t K) {
  const int64_t nb = K / kQ8Block;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t* pw = w + i * kQ8BlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(pw + 8 * kQ8BlockBytes), _MM_HINT_T0);
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + 2));
    const __m256i aw = _mm256_sign_epi8(qw, qw);
    const float dw = scale_of(pw);
    for (int m = 0; m < 4; m++) {
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * rb + i * kQ8BlockBytes + 2));
      const __m256 p = dot_u8s8_ps(aw, _mm256_sign_epi8(qx, qw));
      acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xs[m * nb + i]), p, acc[m]);
    }
  }
  for (int m = 0; m < 4; m++) out[m] = hsum8(acc[m]);
#else
  (void)xs;
  for (int m = 0; m < 4; m++) out[m] = dot_q8_0(w, x + m * rb, K);
#endif
}

// out[j] = dot_q8_0(w + j·rb, x, K) for four adjacent W rows (rb bytes apart) and one activation
// row x whose block scales are xs [K/32]: x's block is loaded once for the four, and the four rows'
// sums are independent chains. The four rows are one stretch of memory read in four places at once,
// which the hardware prefetcher does not follow: the stretch is prefetched kPrefetchBytes ahead of
// the point the block loop has reached in it. Each row's sum is in the order of dot_q8_0.
void dotw4_q8_0(float* out, const uint8_t* w, int64_t rb, const uint8_t* x, const float* xs, int64_t K) {
  const int64_t nb = K / kQ8Block;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  constexpr int64_t step = 4 * kQ8BlockBytes;  // the stretch's bytes a block step (4 rb / nb)
  for (int64_t i = 0; i < nb; i++) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(w) + kPrefetchBytes + i * step;
    for (uintptr_t line = ahead & ~uintptr_t(63); line < ahead + step; line += 64)  // every line once
      _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * kQ8BlockBytes + 2));
    for (int j = 0; j < 4; j++) {
      const uint8_t* pw = w + j * rb + i * kQ8BlockBytes;
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + 2));
      const __m256 p = dot_u8s8_ps(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(scale_of(pw) * xs[i]), p, acc[j]);
    }
  }
  for (int j = 0; j < 4; j++) out[j] = hsum8(acc[j]);
#else
  (void)xs;
  for (int j = 0; j < 4; j++) out[j] = dot_q8_0(w + j * rb, x, K);
#endif
}

// y [M, N] = x W^T + bias for a decoding step's few rows, 16 W rows a work item on the threads:
// tile(n0, n1) puts the products of W's rows n0..n1-1 with all M activation rows in y's columns
// n0..n1-1 (each W row read once for all M rows), and the bias is added to the tile after it.
template <class Tile>
void by_weight_tiles(float* y, int64_t M, int64_t K, int64_t N, const float* bias, const Tile& tile) {
  constexpr int64_t kRows = 16;
#pragma omp parallel for schedule(static) if (N * K * M > kParallelMin)
  for (int64_t n0 = 0; n0 < N; n0 += kRows) {
    const int64_t n1 = std::min(N, n0 + kRows);
    tile(n0, n1);
    if (bias)
      for (int64_t m = 0; m < M; m++)
        for (int64_t n = n0; n < n1; n++) y[m * N + n] += bias[n];
  }
}
}  // namespace

void matmul_q8_0(float* y, const float* x, int64_t M, int64_t K, const uint8_t* W, int64_t N, const float* bias) {
  const int64_t rb = q8_0_bytes(K), nb = K / kQ8Block;
  if (M <= kQ8RowsDirect) {
    static thread_local std::vector<uint8_t> xq;
    static thread_local std::vector<float> xs;
    xq.resize(static_cast<size_t>(M * rb));
    xs.resize(static_cast<size_t>(M * nb));
    for (int64_t m = 0; m < M; m++) {
      quantize_q8_0(xq.data() + m * rb, x + m * K, K);
      for (int64_t i = 0; i < nb; i++) xs[m * nb + i] = scale_of(xq.data() + m * rb + i * kQ8BlockBytes);
    }
    const uint8_t* xqp = xq.data();
    const float* xsp = xs.data();
    // Activation rows in fours against one W row at a time (dot4x_q8_0); the rows left over (all of
    // them at batch 1) one at a time against four W rows (dotw4_q8_0).
    const int64_t M4 = M / 4 * 4;
    by_weight_tiles(y, M, K, N, bias, [&](int64_t n0, int64_t n1) {
      float d[4];
      for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < M4; m += 4) {
          dot4x_q8_0(d, W + n * rb, xqp + m * rb, rb, xsp + m * nb, K);
          for (int i = 0; i < 4; i++) y[(m + i) * N + n] = d[i];
        }
      for (int64_t m = M4; m < M; m++) {
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) {
          dotw4_q8_0(d, W + n * rb, rb, xqp + m * rb, xsp + m * nb, K);
          for (int j = 0; j < 4; j++) y[m * N + n + j] = d[j];
        }
        for (; n < n1; n++) y[m * N + n] = dot_q8_0(W + n * rb, xqp + m * rb, K);
      }
    });
    return;
  }
  // A prefill: x rounded to q8_0 as above (the same products, summed in another order), W widened
  // about 4 MB at a time, and sgemm multiplies.
  std::vector<float> xr(static_cast<size_t>(M * K));
  kv_round_rows(KvType::q8, xr.data(), x, M, K);  // each row's q8_0 blocks, widened back
  const int64_t P = std::min(N, std::max<int64_t>(64, (int64_t(1) << 20) / K));
  std::vector<float> panel(static_cast<size_t>(P * K));
  for (int64_t n0 = 0; n0 < N; n0 += P) {
    const int64_t p = std::min(P, N - n0);
#pragma omp parallel for schedule(static) if (p * K > kParallelMin)
    for (int64_t r = 0; r < p; r++) dequantize_q8_0(panel.data() + r * K, W + (n0 + r) * rb, K);
    sgemm(false, true, M, p, K, 1.f, xr.data(), K, panel.data(), K, 0.f, y + n0, N);
  }
  if (bias)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) y[m * N + n] += bias[n];
}

int64_t to_f16(uint16_t* dst, const float* src, int64_t n) {
  int64_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    dst[i] = f32_to_f16(src[i]);
    if ((dst[i] & 0x7c00u) == 0x7c00u && std::isfinite(src[i])) bad = std::min(bad, i);
  }
  return bad == n ? -1 : bad;
}

int64_t first_non_finite_w16(const uint16_t* h, int64_t n, bool bf16) {
  const uint16_t e = bf16 ? 0x7f80u : 0x7c00u;  // the exponent's bits, all set: infinite or NaN
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int64_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    unsigned any = 0;  // a branch-free pass first: the common case, every value finite
    for (int64_t i = begin; i < end; i++) any |= static_cast<unsigned>((h[i] & e) == e);
    if (any)
      for (int64_t i = begin; i < end; i++)
        if ((h[i] & e) == e) {
          bad = std::min(bad, i);
          break;
        }
  }
  return bad == n ? -1 : bad;
}

int64_t first_non_finite_q8_0(const uint8_t* q, int64_t blocks) {
  int64_t bad = blocks;
#pragma omp parallel for schedule(static) reduction(min : bad) if (blocks * kQ8Block > kParallelMin)
  for (int64_t b = 0; b < blocks; b++) {
    uint16_t d;
    std::memcpy(&d, q + b * kQ8BlockBytes, 2);
    if ((d & 0x7c00u) == 0x7c00u) bad = std::min(bad, b);
  }
  return bad == blocks ? -1 : bad;
}

namespace {
template <bool BF16>
inline float widen1(uint16_t h) {
  return BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
template <bool BF16>
inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}
#endif

// out[r] = Σ_k w[k] · x[r·K + k] for R rows of x: each 16 values of the W row widened once for
// the R rows, two accumulators a row; the tail of K past a multiple of 16 added in order after.
template <bool BF16, int R>
void dot_w16(float* out, const uint16_t* w, const float* x, int64_t K) {
  int64_t k = 0;
  float s[R];
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 w0 = widen8<BF16>(w + k), w1 = widen8<BF16>(w + k + 8);
    for (int r = 0; r < R; r++) {
      acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + 8), acc[r][1]);
    }
  }
  for (int r = 0; r < R; r++) s[r] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
#else
  for (int r = 0; r < R; r++) s[r] = 0;
#endif
  for (; k < K; k++)
    for (int r = 0; r < R; r++) s[r] += widen1<BF16>(w[k]) * x[r * K + k];
  for (int r = 0; r < R; r++) out[r] = s[r];
}

template <bool BF16>
void matmul_w16_direct(float* y, const float* x, int64_t M, int64_t K, const uint16_t* W, int64_t N, const float* bias) {
  by_weight_tiles(y, M, K, N, bias, [&](int64_t n0, int64_t n1) {
    float d[4];
    for (int64_t n = n0; n < n1; n++) {
      const uint16_t* w = W + n * K;
      for (int64_t m = 0; m < M; m += 4) {
        const float* xm = x + m * K;
        const int r = static_cast<int>(std::min<int64_t>(4, M - m));
        switch (r) {
          case 4: dot_w16<BF16, 4>(d, w, xm, K); break;
          case 3: dot_w16<BF16, 3>(d, w, xm, K); break;
          case 2: dot_w16<BF16, 2>(d, w, xm, K); break;
          default: dot_w16<BF16, 1>(d, w, xm, K);
        }
        for (int i = 0; i < r; i++) y[(m + i) * N + n] = d[i];
      }
    }
  });
}
}  // namespace

void matmul_w16(float* y, const float* x, int64_t M, int64_t K, const uint16_t* W, int64_t N, const float* bias, bool bf16) {
  if (M <= kW16RowsDirect) {
    if (bf16)
      matmul_w16_direct<true>(y, x, M, K, W, N, bias);
    else
      matmul_w16_direct<false>(y, x, M, K, W, N, bias);
    return;
  }
  // A prefill: W widened about 4 MB at a time, and sgemm multiplies.
  const KvType t = bf16 ? KvType::bf16 : KvType::f16;
  const int64_t P = std::min(N, std::max<int64_t>(64, (int64_t(1) << 20) / K));
  std::vector<float> panel(static_cast<size_t>(P * K));
  for (int64_t n0 = 0; n0 < N; n0 += P) {
    const int64_t p = std::min(P, N - n0);
#pragma omp parallel for schedule(static) if (p * K > kParallelMin)
    for (int64_t r = 0; r < p; r++)
      kv_decode_rows(t, panel.data() + r * K, reinterpret_cast<const uint8_t*>(W + (n0 + r) * K), 1, K);
    sgemm(false, true, M, p, K, 1.f, x, K, panel.data(), K, 0.f, y + n0, N);
  }
  if (bias)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) y[m * N + n] += bias[n];
}

}  // namespace kern

int64_t kv_row_bytes(KvType t, int64_t hd) {
  switch (t) {
    case KvType::f32: return 4 * hd;
    case KvType::f16:
    case KvType::bf16: return 2 * hd;
    case KvType::q8: return q8_0_bytes(hd);
  }
  return 0;
}

void kv_encode_rows(KvType t, uint8_t* dst, const float* src, int64_t n, int64_t hd) {
  if (t == KvType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n * hd) * sizeof(float));
  } else if (t == KvType::q8) {
    for (int64_t r = 0; r < n; r++) quantize_q8_0(dst + r * q8_0_bytes(hd), src + r * hd, hd);
  } else {
    uint16_t* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n * hd; i++) o[i] = t == KvType::f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  }
}

void kv_decode_rows(KvType t, float* dst, const uint8_t* src, int64_t n, int64_t hd) {
  const int64_t total = n * hd;
  if (t == KvType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(total) * sizeof(float));
    return;
  }
  if (t == KvType::q8) {
    for (int64_t r = 0; r < n; r++) dequantize_q8_0(dst + r * hd, src + r * q8_0_bytes(hd), hd);
    return;
  }
  const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__AVX2__)
  if (t == KvType::bf16) {
    for (; i + 8 <= total; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
  }
#endif
#if defined(__F16C__)
  if (t == KvType::f16)
    for (; i + 8 <= total; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
  for (; i < total; i++) dst[i] = t == KvType::f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
}

void kv_round_rows(KvType t, float* dst, const float* src, int64_t n, int64_t hd) {
#pragma omp parallel if (n * hd > kern::kParallelMin)
  {
    std::vector<uint8_t> row(static_cast<size_t>(kv_row_bytes(t, hd)));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; r++) {
      kv_encode_rows(t, row.data(), src + r * hd, 1, hd);
      kv_decode_rows(t, dst + r * hd, row.data(), 1, hd);
    }
  }
}

}  // namespace tapelm

namespace tapelm {

namespace {
// 16-bit storage of float32 values in chunks a thread converts at a time (kv_encode_rows and
// kv_decode_rows' loops: vector conversions where the CPU has them).
constexpr int64_t kNarrowChunk = 1 << 14;
KvType as_kv(WeightType t) {
  if (t != WeightType::bf16 && t != WeightType::f16) throw Error(ErrorKind::internal, "narrow_values: type " + to_string(t) + " is not 16-bit");
  return t == WeightType::bf16 ? KvType::bf16 : KvType::f16;
}
}  // namespace

int64_t narrow_values(WeightType type, uint16_t* dst, const float* src, int64_t n, int64_t* first_overflow) {
  const KvType t = as_kv(type);
  const int64_t chunks = (n + kNarrowChunk - 1) / kNarrowChunk;
  int64_t inexact = 0, first = n;
#pragma omp parallel for schedule(static) reduction(+ : inexact) reduction(min : first) if (n > kern::kParallelMin)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t i0 = c * kNarrowChunk, len = std::min(kNarrowChunk, n - i0);
    uint16_t counted[kNarrowChunk];  // where the bits go when only counting
    uint16_t* bits = dst ? dst + i0 : counted;
    kv_encode_rows(t, reinterpret_cast<uint8_t*>(bits), src + i0, 1, len);
    float back[kNarrowChunk];
    kv_decode_rows(t, back, reinterpret_cast<const uint8_t*>(bits), 1, len);
    for (int64_t i = 0; i < len; i++) {
      inexact += std::memcmp(&back[i], src + i0 + i, sizeof(float)) != 0;
      if (std::isfinite(src[i0 + i]) && !std::isfinite(back[i])) first = std::min(first, i0 + i);
    }
  }
  if (first_overflow) *first_overflow = first < n ? first : -1;
  return inexact;
}

void widen_values(WeightType type, float* dst, const uint16_t* src, int64_t n) {
  const KvType t = as_kv(type);
  const int64_t chunks = (n + kNarrowChunk - 1) / kNarrowChunk;
#pragma omp parallel for schedule(static) if (n > kern::kParallelMin)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t i0 = c * kNarrowChunk;
    kv_decode_rows(t, dst + i0, reinterpret_cast<const uint8_t*>(src + i0), 1, std::min(kNarrowChunk, n - i0));
  }
}

}  // namespace tapelm
