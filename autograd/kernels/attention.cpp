#include "autograd/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "autograd/kernels/blas.h"

namespace tapelm::kern {

namespace {
// Dropout mask index of probability (b, h, i, j): unique per element of one call.
inline uint64_t prob_index(const AttnShape& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  return ((static_cast<uint64_t>(b) * s.H + h) * s.Tq + i) * s.Tk + j;
}
// Query rows per block of the causal products: small enough to skip most of the masked triangle
// (at T = 256, 56 % of the full products remain), large enough for efficient GEMMs.
constexpr int64_t kQueryBlock = 32;
// dst = src with attention dropout applied, on rows [i0, i0 + nb) and keys [0, kl) of head (b, h):
// the same mask in forward and backward, drawn from the element's index.
void dropout_rows(float* dst, const float* src, const AttnShape& s, int64_t b, int64_t h, int64_t i0, int64_t nb,
                  int64_t kl, float p_drop, float keep_scale, uint64_t seed) {
  for (int64_t i = i0; i < i0 + nb; i++)
    for (int64_t j = 0; j < kl; j++)
      dst[i * s.Tk + j] = hash_uniform(seed, prob_index(s, b, h, i, j)) >= p_drop ? src[i * s.Tk + j] * keep_scale : 0.f;
}
// Keys visible to query row i: [0, limit).
inline int64_t key_limit(const AttnShape& s, int64_t i) {
  return s.causal ? std::min(s.Tk, s.q_pos0 + i + 1) : s.Tk;
}

// Keys per work item of a decoding step: kDecodeChunk, or fewer where that would leave fewer than
// kDecodeItems work items, down to kDecodeMinChunk (so at least kDecodeItems items wherever the
// context holds that many chunks of kDecodeMinChunk). With 256 keys a chunk, MQA at batch 1 over a
// context of up to 256 keys was one work item, on one thread, where two KV heads gave every core
// one. A function of the shape alone (batch, KV heads, context), never of the thread count, so
// that the result is bit-identical on any number of threads (the chunks are combined in order).
constexpr int64_t kDecodeChunk = 256, kDecodeMinChunk = 32, kDecodeItems = 8;
inline int64_t decode_chunk_keys(int64_t seq_heads, int64_t len) {
  const int64_t per = (kDecodeItems + seq_heads - 1) / seq_heads;  // chunks wanted per (sequence, KV head)
  return std::clamp(len / per, kDecodeMinChunk, kDecodeChunk);   // rounded down: ceil(len / keys) >= per
}

// a · b over n floats: vector partial sums, then one fixed shuffle tree. A head's dot product is
// only 64 floats (4 AVX-512 multiply-adds), so the sum across lanes is most of its cost: the
// compiler's own `omp simd` reduction summed the 16 lanes one after another through memory, and
// the scores of an MQA step at 4096 keys took 2 of its 7.6 ms.
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  float s = 0;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  s = hsum8(acc);
#endif
  for (; d < n; d++) s += a[d] * b[d];
  return s;
}

// Asks for the cache lines of n bytes from address a. The address is an integer, so a row past a
// cache's end is never formed as a pointer; a prefetch never faults.
inline void prefetch_bytes(uintptr_t a, int64_t n) {
  for (int64_t b = 0; b < n; b += 64) __builtin_prefetch(reinterpret_cast<const void*>(a + static_cast<uintptr_t>(b)));
}

// Rows of keys or values as a decoding step reads them: f32 rows `rs` floats apart, or rows of a
// 16-bit cache (`rb` bytes apart) converted eight values at a time as they are read — the step
// streams the cache once, with no widened copy.
struct F32Rows {
  const float* p;
  int64_t rs;
  float dot_row(const float* q, int64_t j, int64_t hd) const { return dot(q, p + j * rs, hd); }
  void axpy_row(float* o, float e, int64_t j, int64_t hd) const {
    const float* v = p + j * rs;
#pragma omp simd
    for (int64_t d = 0; d < hd; d++) o[d] += e * v[d];
  }
#if defined(__AVX2__) && defined(__FMA__)
  __m256 load8(int64_t j, int64_t d) const { return _mm256_loadu_ps(p + j * rs + d); }
#endif
  void prefetch(int64_t j, int64_t hd) const {
    prefetch_bytes(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(j * rs) * sizeof(float), hd * sizeof(float));
  }
};
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
template <KvType T>
struct HalfRows {  // T: f16 or bf16; hd a multiple of 8; read only by the register blocks
  const uint8_t* p;
  int64_t rb;
  static __m256 load8(const uint16_t* h) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
    if constexpr (T == KvType::f16) return _mm256_cvtph_ps(x);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
  }
  const uint16_t* row(int64_t j) const { return reinterpret_cast<const uint16_t*>(p + j * rb); }
  __m256 load8(int64_t j, int64_t d) const { return load8(row(j) + d); }
  void prefetch(int64_t j, int64_t hd) const { prefetch_bytes(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(j * rb), hd * 2); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The two products of a decoding chunk in register blocks (hd a multiple of 8). A key or value row
// is read (and, stored in 16 bits, converted) once for RB query heads of the group, where one head
// at a time converted it rep times and summed each score across lanes alone: the MQA step at 4096
// keys spent most of its time there. A group of 8 heads (MQA over 8 query heads) is one block of 8,
// each row converted once for the group: its attention at 4096 keys ran 6–9 % faster than in two
// blocks of 4 (bench_attention_decode, alternated runs).
//
// Scores of RB heads (r0 ..) against JB = 8 / RB keys (j0 ..; keys from jn on read as zero): eight
// independent sums over the head dimension, summed across lanes together by one shuffle tree:
// sc[r·kDecodeChunk + j] = scale · q_r · k_j.
template <int RB, class Rows>
[[gnu::always_inline]] inline void score_block(float* sc, const float* q, const Rows& k, int64_t hd, int64_t r0, int64_t j0, int jn, float scale) {
  constexpr int JB = 8 / RB;
  __m256 a[8];  // a[r·JB + i]: head r0 + r, key j0 + i
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    __m256 kv[JB];
#pragma GCC unroll 8
    for (int i = 0; i < JB; i++) kv[i] = i < jn ? k.load8(j0 + i, d) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++) {
      const __m256 qv = _mm256_loadu_ps(q + (r0 + r) * hd + d);
#pragma GCC unroll 8
      for (int i = 0; i < JB; i++) a[r * JB + i] = _mm256_fmadd_ps(qv, kv[i], a[r * JB + i]);
    }
  }
  // each 128-bit half holds a0..a3 (a4..a7) summed over its four lanes; the halves are then added
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]), h45 = _mm256_hadd_ps(a[4], a[5]),
               h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
  const __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20), hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
  alignas(32) float sums[8];
  _mm256_store_ps(sums, _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale)));
  if (jn == JB) {
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++) std::memcpy(sc + (r0 + r) * kDecodeChunk + j0, sums + r * JB, sizeof(float) * JB);
  } else {
    for (int r = 0; r < RB; r++)
      for (int i = 0; i < jn; i++) sc[(r0 + r) * kDecodeChunk + j0 + i] = sums[r * JB + i];
  }
}

// o[r] += Σ_j e[r][j] v_j over keys j0 .. j1-1 for RB heads (r0 ..) and DB vectors of the head
// dimension (d0 ..): RB·DB accumulators held in registers across the keys, each a sum in key order.
template <int RB, int DB, class Rows>
[[gnu::always_inline]] inline void value_block(float* o, const float* sc, const Rows& v, int64_t hd, int64_t r0, int64_t d0,
                                               int64_t j0, int64_t j1) {
  static_assert(RB * DB <= 8);
  __m256 acc[RB][DB];
#pragma GCC unroll 8
  for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
    for (int c = 0; c < DB; c++) acc[r][c] = _mm256_loadu_ps(o + (r0 + r) * hd + d0 + 8 * c);
  for (int64_t j = j0; j < j1; j++) {
    __m256 vv[DB];
#pragma GCC unroll 8
    for (int c = 0; c < DB; c++) vv[c] = v.load8(j, d0 + 8 * c);
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++) {
      const __m256 e = _mm256_broadcast_ss(sc + (r0 + r) * kDecodeChunk + j);
#pragma GCC unroll 8
      for (int c = 0; c < DB; c++) acc[r][c] = _mm256_fmadd_ps(e, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
    for (int c = 0; c < DB; c++) _mm256_storeu_ps(o + (r0 + r) * hd + d0 + 8 * c, acc[r][c]);
}

// A chunk's scores with RB heads a block (rep a multiple of RB), 8 / RB keys at a time. On the first
// block of heads each key row is asked for kKeysAhead rows before it is read: at 4096 tokens (the
// MHA cache in DRAM, MQA's in the third-level cache) the attention alone ran 2-9 % faster at every
// KV count, and the MHA step 5 % (bench/LLAMA_CPP_DECODE.md). The value rows asked for as well, for
// the second-level cache, sped up 4 KV heads but slowed MHA.
template <int RB, class Rows>
[[gnu::noinline]] void scores_blocked(int64_t rep, int64_t hd, int64_t n, const float* q, const Rows& k, float scale, float* sc) {
  constexpr int JB = 8 / RB;
  constexpr int64_t kKeysAhead = 16;
  for (int64_t r0 = 0; r0 < rep; r0 += RB)
    for (int64_t j0 = 0; j0 < n; j0 += JB) {
      if (r0 == 0)
        for (int i = 0; i < JB; i++) k.prefetch(j0 + i + kKeysAhead, hd);
      score_block<RB>(sc, q, k, hd, r0, j0, static_cast<int>(std::min<int64_t>(JB, n - j0)), scale);
    }
}

// A chunk's outputs o = Σ_j e_j v_j with RB heads a block, 8 / RB vectors of the head dimension at a
// time where it allows, else one; keys kValueTile at a time, so that the tile's value rows, read
// once for each block of heads and of the head dimension, stay in the first-level cache.
template <int RB, class Rows>
[[gnu::noinline]] void values_blocked(int64_t rep, int64_t hd, int64_t n, const float* sc, const Rows& v, float* o) {
  constexpr int DB = 8 / RB;
  constexpr int64_t kValueTile = 32;
  std::fill(o, o + rep * hd, 0.f);
  for (int64_t j0 = 0; j0 < n; j0 += kValueTile) {
    const int64_t j1 = std::min(n, j0 + kValueTile);
    for (int64_t r0 = 0; r0 < rep; r0 += RB) {
      int64_t d0 = 0;
      for (; d0 + 8 * DB <= hd; d0 += 8 * DB) value_block<RB, DB>(o, sc, v, hd, r0, d0, j0, j1);
      for (; d0 < hd; d0 += 8) value_block<RB, 1>(o, sc, v, hd, r0, d0, j0, j1);
    }
  }
}
#endif

// Query heads a register block for a group of rep heads: 8, 4, 2 or 1 as rep allows; 0 (the plain
// loops, f32 rows only) without AVX2 or where the head dimension is not a multiple of 8.
inline int heads_a_block(int64_t rep, int64_t hd) {
#if defined(__AVX2__) && defined(__FMA__)
  if (hd % 8 == 0) return rep % 8 == 0 ? 8 : rep % 4 == 0 ? 4 : rep % 2 == 0 ? 2 : 1;
#endif
  (void)rep, (void)hd;
  return 0;
}

// sc [rep, kDecodeChunk] = scale · q kᵀ over the chunk's n keys.
template <class Rows>
void decode_scores(int rb, int64_t rep, int64_t hd, int64_t n, const float* q, const Rows& k, float scale, float* sc) {
#if defined(__AVX2__) && defined(__FMA__)
  if (rb == 8) return scores_blocked<8>(rep, hd, n, q, k, scale, sc);
  if (rb == 4) return scores_blocked<4>(rep, hd, n, q, k, scale, sc);
  if (rb == 2) return scores_blocked<2>(rep, hd, n, q, k, scale, sc);
  if (rb == 1) return scores_blocked<1>(rep, hd, n, q, k, scale, sc);
#endif
  if constexpr (std::is_same_v<Rows, F32Rows>)  // 16-bit rows exist only where rb > 0
    for (int64_t j = 0; j < n; j++)
      for (int64_t r = 0; r < rep; r++) sc[r * kDecodeChunk + j] = k.dot_row(q + r * hd, j, hd) * scale;
}

// o [rep, hd] = Σ_j e_j v_j over the chunk's n keys, e the exponentiated scores in sc.
template <class Rows>
void decode_values(int rb, int64_t rep, int64_t hd, int64_t n, const float* sc, const Rows& v, float* o) {
#if defined(__AVX2__) && defined(__FMA__)
  if (rb == 8) return values_blocked<8>(rep, hd, n, sc, v, o);
  if (rb == 4) return values_blocked<4>(rep, hd, n, sc, v, o);
  if (rb == 2) return values_blocked<2>(rep, hd, n, sc, v, o);
  if (rb == 1) return values_blocked<1>(rep, hd, n, sc, v, o);
#endif
  if constexpr (std::is_same_v<Rows, F32Rows>) {
    std::fill(o, o + rep * hd, 0.f);
    for (int64_t j = 0; j < n; j++)
      for (int64_t r = 0; r < rep; r++) v.axpy_row(o + r * hd, sc[r * kDecodeChunk + j], j, hd);
  }
}

// One work item of a decoding step: the group's rep query heads (q: [rep, hd]) against n ≤
// kDecodeChunk keys and values. Each K row and each V row is read once, for all rep heads: scores
// into sc [rep, kDecodeChunk], their max m [rep] and exp-sum l [rep], and the unnormalised output
// o = Σ_j e_j v_j [rep, hd]. Our own loops rather than two BLAS calls: the products are 1-16 rows
// by 256 keys, where a library call costs more than the arithmetic.
template <class Rows>
void decode_chunk(int64_t rep, int64_t hd, int64_t n, const float* q, const Rows& k, const Rows& v, float scale, float* sc,
                  float* m, float* l, float* o) {
  const int rb = heads_a_block(rep, hd);
  decode_scores(rb, rep, hd, n, q, k, scale, sc);
  for (int64_t r = 0; r < rep; r++) {
    float* row = sc + r * kDecodeChunk;
    float mx = -INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) row[j] = exp_approx(row[j] - mx);
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) sum += row[j];
    m[r] = mx;
    l[r] = sum;
  }
  decode_values(rb, rep, hd, n, sc, v, o);
}

// One query row per sequence (a decoding step): split-K attention ("flash decoding"). The keys
// 0 .. q_pos0 are cut into chunks (decode_chunk_keys); each (sequence, KV head, chunk) is a work item
// that reads its K and V rows once for all H/KV query heads of the group — scores, their max m,
// exp-sum l and the unnormalised output o = Σ_j e_j v_j — and the chunks are then combined in
// order: y = Σ_c e^(m_c − M) o_c / Σ_c e^(m_c − M) l_c with M = max_c m_c. The work items spread
// over the threads, so MQA at batch 1 (one KV head) decodes long contexts on every core.
// Keys and values stored in 16 or 8 bits (type != f32; k and v then point to bytes) are converted
// as they are read (f16, bf16), or widened chunk by chunk into per-thread buffers (q8).
void attention_decode(float* y, const float* q, const void* k, const void* v, KvType type, const AttnShape& s) {
  const int64_t rep = s.H / s.KV, C = s.H * s.hd, RS = s.row_stride(), hd = s.hd;
  const int64_t len = key_limit(s, 0), chunk = decode_chunk_keys(s.B * s.KV, len);
  const int64_t nc = std::max<int64_t>(1, (len + chunk - 1) / chunk);
  const int64_t items = s.B * s.KV * nc;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Reused across calls (every layer of every decoding step comes here): no allocation per step.
  // The calling thread's buffers, shared with the team through these pointers.
  static thread_local std::vector<float> m_buf, l_buf, o_buf;
  m_buf.resize(items * rep);
  l_buf.resize(items * rep);
  o_buf.resize(items * rep * hd);
  float *m = m_buf.data(), *l = l_buf.data(), *o = o_buf.data();
  const bool par = items > 1 && s.B * s.KV * len * rep * hd > (1 << 15);
#pragma omp parallel if (par)
  {
    static thread_local std::vector<float> sc, kw, vw;
    sc.resize(rep * kDecodeChunk);
    if (type != KvType::f32) {
      kw.resize(kDecodeChunk * hd);
      vw.resize(kDecodeChunk * hd);
    }
    const int64_t rb = kv_row_bytes(type, hd);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < items; t++) {
      const int64_t c = t % nc, bg = t / nc, b = bg / s.KV, g = bg % s.KV;
      const int64_t j0 = c * chunk, n = std::max<int64_t>(0, std::min(len, j0 + chunk) - j0);
      const float* qg = q + b * C + g * rep * hd;  // the group's query heads are adjacent
      const int64_t at = b * s.kv_batch_stride + g * s.head_stride() + j0 * RS;  // in values
      float* ot = o + t * rep * hd;
      float *mt = m + t * rep, *lt = l + t * rep;
      const uint8_t *kb = static_cast<const uint8_t*>(k) + at / hd * rb, *vb = static_cast<const uint8_t*>(v) + at / hd * rb;
      if (type == KvType::f32) {
        decode_chunk(rep, hd, n, qg, F32Rows{static_cast<const float*>(k) + at, RS}, F32Rows{static_cast<const float*>(v) + at, RS},
                     scale, sc.data(), mt, lt, ot);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
      } else if (type == KvType::f16 && hd % 8 == 0) {  // rows are contiguous (RS == hd): row at / hd
        decode_chunk(rep, hd, n, qg, HalfRows<KvType::f16>{kb, rb}, HalfRows<KvType::f16>{vb, rb}, scale, sc.data(), mt, lt, ot);
      } else if (type == KvType::bf16 && hd % 8 == 0) {
        decode_chunk(rep, hd, n, qg, HalfRows<KvType::bf16>{kb, rb}, HalfRows<KvType::bf16>{vb, rb}, scale, sc.data(), mt, lt, ot);
#endif
      } else {  // q8 (and 16 bits without the vector conversions): the chunk widened first
        kv_decode_rows(type, kw.data(), kb, n, hd);
        kv_decode_rows(type, vw.data(), vb, n, hd);
        decode_chunk(rep, hd, n, qg, F32Rows{kw.data(), hd}, F32Rows{vw.data(), hd}, scale, sc.data(), mt, lt, ot);
      }
    }
    // One query head a work item: under MQA at batch 1 a (sequence, KV head) a work item left the
    // combine to one thread while the other went to sleep in the barrier.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.H; bh++) {
      const int64_t b = bh / s.H, h = bh % s.H, bg = b * s.KV + h / rep, r = h % rep;
      float* yr = y + b * C + h * hd;
      float M = -INFINITY;
      for (int64_t c = 0; c < nc; c++) M = std::max(M, m[(bg * nc + c) * rep + r]);
      if (M == -INFINITY) {  // no visible key
        std::fill(yr, yr + hd, 0.f);
        continue;
      }
      float den = 0;
      std::fill(yr, yr + hd, 0.f);
      for (int64_t c = 0; c < nc; c++) {
        const int64_t t = bg * nc + c;
        const float w = std::exp(m[t * rep + r] - M);
        den += w * l[t * rep + r];
        const float* ot = o + (t * rep + r) * hd;
        for (int64_t d = 0; d < hd; d++) yr[d] += w * ot[d];
      }
      const float inv = 1.0f / den;
      for (int64_t d = 0; d < hd; d++) yr[d] *= inv;
    }
  }
}

// Runs body on a team of threads when par, else on this thread alone, outside any parallel
// region. body's worksharing loops (`omp for`) bind to whichever. Not `#pragma omp parallel if
// (par)`: a region whose if is false is still a (one-thread) parallel region, and each BLAS call
// inside it opens a nested region, for which libgomp starts and ends new threads every time
// (2,700 thread creations in one 1000-token MQA prefill at batch 1).
template <class F>
void parallel_if(bool par, F&& body) {
  if (par) {
#pragma omp parallel
    body();
  } else {
    body();
  }
}

}  // namespace

void attention_fwd(float* y, float* probs, const float* q, const float* k, const float* v, const AttnShape& s,
                   const int32_t* key_keep, float p_drop, uint64_t seed) {
  if (s.Tq == 1 && !probs && !key_keep && p_drop == 0 && s.causal) {
    attention_decode(y, q, k, v, KvType::f32, s);
    return;
  }
  const int64_t rep = s.H / s.KV, C = s.H * s.hd, RS = s.row_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const float keep_scale = p_drop > 0 ? 1.0f / (1.0f - p_drop) : 1.0f;
  // Without kept probabilities or dropout (inference), a query block's rows are all that is ever
  // live: the scratch is one block, kQueryBlock × Tk per thread, not Tq × Tk (80,000² floats in a
  // long prefill). prefill_bytes (nn/accounting.h) counts it.
  const bool block_scratch = !probs && p_drop == 0;
  const int64_t qb = s.causal || block_scratch ? kQueryBlock : std::max<int64_t>(s.Tq, 1);
  const bool big = s.B * s.KV > 1 || s.Tq * s.Tk * s.hd * s.H > (1 << 16);
  SerialBlas serial;
  // One query head a work item: a group's heads, adjacent, mostly fall to one thread and read its K
  // and V one after another. A (sequence, KV head) a work item left MQA's prefill at batch 1 on one
  // thread while the other slept (13,700 context switches against 1,000 with 2 KV heads).
  parallel_if(big && s.B * s.H > 1, [&] {
    // Per-thread buffers: the probabilities when the caller keeps none, and their dropped copy.
    std::vector<float> scratch(probs ? 0 : (block_scratch ? std::min(qb, s.Tq) : s.Tq) * s.Tk),
        pd(p_drop > 0 ? s.Tq * s.Tk : 0);
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.B; b++)
      for (int64_t h = 0; h < s.H; h++) {
        const int64_t g = h / rep;
        const float* kg = k + b * s.kv_batch_stride + g * s.head_stride();
        const float* vg = v + b * s.kv_batch_stride + g * s.head_stride();
        const int32_t* keep = key_keep ? key_keep + b * s.Tk : nullptr;
        const float* qh = q + b * s.Tq * C + h * s.hd;
        float* P = probs ? probs + ((b * s.H + h) * s.Tq) * s.Tk : scratch.data();
        float* yh = y + b * s.Tq * C + h * s.hd;
        // Causal: query rows in blocks, each against only the keys its last row sees, so the
        // masked upper triangle is neither multiplied nor exponentiated (about half of QKᵀ
        // and P·V at T = 256). Entries past a row's limit are zero, as the backward expects.
        for (int64_t i0 = 0; i0 < s.Tq; i0 += qb) {
          const int64_t nb = std::min(qb, s.Tq - i0), kl = key_limit(s, i0 + nb - 1);
          float* Pb = block_scratch ? P : P + i0 * s.Tk;  // the block's first row
          if (kl > 0) sgemm(false, true, nb, kl, s.hd, scale, qh + i0 * C, C, kg, RS, 0.f, Pb, s.Tk);
          for (int64_t i = i0; i < i0 + nb; i++) {
            float* row = Pb + (i - i0) * s.Tk;
            const int64_t lim = key_limit(s, i);
            float mx = -INFINITY;
            for (int64_t j = 0; j < lim; j++)
              if (!keep || keep[j]) mx = std::max(mx, row[j]);
            if (mx == -INFINITY) {  // nothing visible
              std::fill(row, row + s.Tk, 0.f);
              continue;
            }
            float sum = 0;
            for (int64_t j = 0; j < lim; j++) {
              const float e = (!keep || keep[j]) ? exp_approx(row[j] - mx) : 0.f;
              row[j] = e;
              sum += e;
            }
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < lim; j++) row[j] *= inv;
            std::fill(row + lim, row + s.Tk, 0.f);
          }
          const float* Pv = Pb;
          if (p_drop > 0) {
            // y uses the dropped probabilities; probs keeps the softmax for backward.
            dropout_rows(pd.data(), P, s, b, h, i0, nb, kl, p_drop, keep_scale, seed);
            Pv = pd.data() + i0 * s.Tk;
          }
          if (kl > 0) {
            sgemm(false, false, nb, s.hd, kl, 1.f, Pv, s.Tk, vg, RS, 0.f, yh + i0 * C, C);
          } else {
            for (int64_t i = i0; i < i0 + nb; i++) std::fill(yh + i * C, yh + i * C + s.hd, 0.f);
          }
        }
      }
  });
}

void attention_bwd(float* dq, float* dk, float* dv, const float* dy, const float* probs, const float* q,
                   const float* k, const float* v, const AttnShape& s, float p_drop, uint64_t seed) {
  const int64_t rep = s.H / s.KV, C = s.H * s.hd, CK = s.row_stride(), HS = s.head_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const float keep_scale = p_drop > 0 ? 1.0f / (1.0f - p_drop) : 1.0f;
  const int64_t qb = s.causal ? kQueryBlock : std::max<int64_t>(s.Tq, 1);
  // One head h of sequence b: its rows of dq, and its share of its group's dK and dV added into
  // dkh and dvh (rows ld floats apart; null: not wanted). dP and Pd: the thread's Tq × Tk buffers.
  auto head = [&](int64_t b, int64_t h, float* dkh, float* dvh, int64_t ld, float* dP, float* Pd) {
    const int64_t g = h / rep;
    const float* kg = k + b * s.kv_batch_stride + g * HS;
    const float* vg = v + b * s.kv_batch_stride + g * HS;
    const float* P = probs + ((b * s.H + h) * s.Tq) * s.Tk;
    const float* dyh = dy + b * s.Tq * C + h * s.hd;
    const float* qh = q + b * s.Tq * C + h * s.hd;
    float* dqh = dq ? dq + b * s.Tq * C + h * s.hd : nullptr;
    // Query rows in blocks against the keys they see (see attention_fwd): probabilities past a
    // row's limit are zero, so every product below skips the upper triangle.
    for (int64_t i0 = 0; i0 < s.Tq; i0 += qb) {
      const int64_t nb = std::min(qb, s.Tq - i0), kl = key_limit(s, i0 + nb - 1);
      if (kl == 0) continue;
      const float* Pb = P + i0 * s.Tk;
      const float* Pused = Pb;
      if (p_drop > 0) {
        dropout_rows(Pd, P, s, b, h, i0, nb, kl, p_drop, keep_scale, seed);
        Pused = Pd + i0 * s.Tk;
      }
      // dV_g += P_usedᵀ · dY_h ;  dP_used = dY_h · V_gᵀ
      if (dvh) sgemm(true, false, kl, s.hd, nb, 1.f, Pused, s.Tk, dyh + i0 * C, C, 1.f, dvh, ld);
      if (!dqh && !dkh) continue;
      float* dPb = dP + i0 * s.Tk;
      sgemm(false, true, nb, kl, s.hd, 1.f, dyh + i0 * C, C, vg, CK, 0.f, dPb, s.Tk);
      // d loss / d P = the dropout mask applied to d loss / d P_used
      if (p_drop > 0) dropout_rows(dP, dP, s, b, h, i0, nb, kl, p_drop, keep_scale, seed);
      for (int64_t i = i0; i < i0 + nb; i++) {
        float* d = dP + i * s.Tk;
        const float* p = P + i * s.Tk;
        float dot = 0;
        for (int64_t j = 0; j < kl; j++) dot += d[j] * p[j];
        // softmax backward, with the 1/√hd of the scores folded in
        for (int64_t j = 0; j < kl; j++) d[j] = p[j] * (d[j] - dot) * scale;
      }
      if (dqh) sgemm(false, false, nb, s.hd, kl, 1.f, dPb, s.Tk, kg, CK, 1.f, dqh + i0 * C, C);
      if (dkh) sgemm(true, false, kl, s.hd, nb, 1.f, dPb, s.Tk, qh + i0 * C, C, 1.f, dkh, ld);
    }
  };
  float* const dkv[2] = {dk, dv};
  const auto add_row = [&](float* o, const float* x) {
    for (int64_t d = 0; d < s.hd; d++) o[d] += x[d];
  };
  const int64_t rows = key_limit(s, s.Tq - 1), part = s.Tk * s.hd;  // rows of dK, dV a head touches
  SerialBlas serial;
  // A group's heads share its dK and dV. With one head a group, or neither wanted, each head adds
  // into them directly. Otherwise a head's share is summed alone, from zero, and added to the
  // group's in head order: one (sequence, group) a work item where they are enough to share out,
  // else one head a work item (MQA at batch 1 ran its whole backward on one thread), its share kept
  // until all are done. Both add the same shares in the same order: the same bits on any number of
  // threads.
  if (rep == 1 || (!dk && !dv)) {
    parallel_if(s.B * s.H > 1, [&] {
      std::vector<float> dP(s.Tq * s.Tk), Pd(p_drop > 0 ? s.Tq * s.Tk : 0);
#pragma omp for schedule(static) collapse(2)
      for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.H; h++) {
          const int64_t at = b * s.kv_batch_stride + h / rep * HS;
          head(b, h, dk ? dk + at : nullptr, dv ? dv + at : nullptr, CK, dP.data(), Pd.data());
        }
    });
    return;
  }
  if (s.B * s.KV >= omp_get_max_threads()) {
    parallel_if(s.B * s.KV > 1, [&] {
      std::vector<float> dP(s.Tq * s.Tk), Pd(p_drop > 0 ? s.Tq * s.Tk : 0), share(2 * part);
      float* const sh[2] = {dk ? share.data() : nullptr, dv ? share.data() + part : nullptr};
#pragma omp for schedule(static) collapse(2)
      for (int64_t b = 0; b < s.B; b++)
        for (int64_t g = 0; g < s.KV; g++)
          for (int64_t r = 0; r < rep; r++) {
            std::fill(share.begin(), share.end(), 0.f);
            head(b, g * rep + r, sh[0], sh[1], s.hd, dP.data(), Pd.data());
            for (int w = 0; w < 2; w++)
              if (dkv[w])
                for (int64_t j = 0; j < rows; j++) add_row(dkv[w] + b * s.kv_batch_stride + g * HS + j * CK, sh[w] + j * s.hd);
          }
    });
    return;
  }
  // every head's shares of dK and dV, [B, H, Tk, hd] each; each work item zeroes its own
  std::unique_ptr<float[]> shares(new float[static_cast<size_t>(2 * s.B * s.H * part)]);
  // no more threads than heads: each thread holds a Tq × Tk buffer
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(omp_get_max_threads(), s.B * s.H)))
  {
    std::vector<float> dP(s.Tq * s.Tk), Pd(p_drop > 0 ? s.Tq * s.Tk : 0);
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.B; b++)
      for (int64_t h = 0; h < s.H; h++) {
        float* sk = shares.get() + 2 * (b * s.H + h) * part;
        std::fill(sk, sk + 2 * part, 0.f);
        head(b, h, dk ? sk : nullptr, dv ? sk + part : nullptr, s.hd, dP.data(), Pd.data());
      }
    // then each row of dK and dV, its heads' shares in head order
#pragma omp for schedule(static) collapse(3)
    for (int64_t b = 0; b < s.B; b++)
      for (int64_t g = 0; g < s.KV; g++)
        for (int64_t j = 0; j < rows; j++)
          for (int w = 0; w < 2; w++) {
            if (!dkv[w]) continue;
            for (int64_t r = 0; r < rep; r++)
              add_row(dkv[w] + b * s.kv_batch_stride + g * HS + j * CK,
                      shares.get() + (2 * (b * s.H + g * rep + r) + w) * part + j * s.hd);
          }
  }
}

void rope_tables(float* cos_t, float* sin_t, int64_t n_pos, int64_t rot, double theta) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; i++) {
    const double inv = std::pow(theta, -(2.0 * static_cast<double>(i)) / static_cast<double>(rot));
    for (int64_t p = 0; p < n_pos; p++) {
      const double a = static_cast<double>(p) * inv;
      cos_t[p * half + i] = static_cast<float>(std::cos(a));
      sin_t[p * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void rope_apply(float* out, const float* x, int64_t B, int64_t T, int64_t nh, int64_t hd, int64_t rot, int64_t pos0,
                const float* cos_t, const float* sin_t, bool inverse, bool add) {
  const int64_t half = rot / 2;
  const float sgn = inverse ? -1.f : 1.f;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * nh * hd >= kParallelMin)
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const float* c = cos_t + (pos0 + t) * half;
      const float* sn = sin_t + (pos0 + t) * half;
      for (int64_t h = 0; h < nh; h++) {
        const int64_t off = ((b * T + t) * nh + h) * hd;
        const float* xi = x + off;
        float* o = out + off;
        for (int64_t i = 0; i < half; i++) {
          const float x1 = xi[i], x2 = xi[i + half], si = sgn * sn[i];
          const float r1 = x1 * c[i] - x2 * si, r2 = x2 * c[i] + x1 * si;
          if (add) {
            o[i] += r1;
            o[i + half] += r2;
          } else {
            o[i] = r1;
            o[i + half] = r2;
          }
        }
        for (int64_t i = rot; i < hd; i++) o[i] = add ? o[i] + xi[i] : xi[i];
      }
    }
}

void kv_cache_write(uint8_t* cache_k, uint8_t* cache_v, KvType type, const float* k_new, const float* v_new,
                    int64_t B, int64_t t, int64_t KV, int64_t hd, int64_t max_len, int64_t pos) {
  const int64_t row = KV * hd, rb = kv_row_bytes(type, hd);
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < KV; g++)
      for (int64_t i = 0; i < t; i++) {
        const int64_t at = ((b * KV + g) * max_len + pos + i) * rb, from = (b * t + i) * row + g * hd;
        kv_encode_rows(type, cache_k + at, k_new + from, 1, hd);
        kv_encode_rows(type, cache_v + at, v_new + from, 1, hd);
      }
}

void attention_fwd_stored(float* y, const float* q, const uint8_t* k, const uint8_t* v, KvType type, const AttnShape& s) {
  if (type == KvType::f32) {
    attention_fwd(y, nullptr, q, reinterpret_cast<const float*>(k), reinterpret_cast<const float*>(v), s, nullptr, 0.f, 0);
    return;
  }
  if (s.Tq == 1 && s.causal) {
    attention_decode(y, q, k, v, type, s);
    return;
  }
  // A prefill: every head's keys and values 0 .. Tk-1 widened once, then the f32 path.
  const int64_t rb = kv_row_bytes(type, s.hd), per_head = s.Tk * s.hd;
  std::vector<float> kw(static_cast<size_t>(s.B * s.KV * per_head)), vw(kw.size());
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t g = 0; g < s.KV; g++) {
      const int64_t row0 = (b * s.kv_batch_stride + g * s.head_stride()) / s.hd, at = (b * s.KV + g) * per_head;
      kv_decode_rows(type, kw.data() + at, k + row0 * rb, s.Tk, s.hd);
      kv_decode_rows(type, vw.data() + at, v + row0 * rb, s.Tk, s.hd);
    }
  AttnShape w = s;
  w.kv_batch_stride = s.KV * per_head;
  w.kv_head_stride = per_head;
  w.kv_row_stride = s.hd;
  attention_fwd(y, nullptr, q, kw.data(), vw.data(), w, nullptr, 0.f, 0);
}

}  // namespace tapelm::kern
