#pragma once
// Raw-pointer kernels: forward and backward side by side. Every backward ADDS into its gradient
// outputs, so fan-out and weight tying need no special case. Threads split the axis whose output
// each one owns; nothing here allocates per element.
#include <cstdint>

namespace tapelm::kern {

/// Below this many elements a kernel runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelMin = 1 << 14;

// ---- reductions and layout -------------------------------------------------------------
/// out[o,i] (+)= sum_j x[o,j,i]   x: [O,N,I]  out: [O,I]
void sum_axis_fwd(float* out, const float* x, int64_t O, int64_t N, int64_t I, float scale);
/// dx[o,j,i] += dout[o,i] * scale
void sum_axis_bwd(float* dx, const float* dout, int64_t O, int64_t N, int64_t I, float scale);
/// dst[c] += sum_r src[r,c]   src: [R,C]; deterministic whatever the thread count.
void colsum_add(float* dst, const float* src, int64_t R, int64_t C);
/// Sum of all elements in double, in an order that does not depend on the thread count.
double sum_all(const float* x, int64_t n);
/// Sum of squares, likewise.
double sumsq_all(const float* x, int64_t n);

/// out = x permuted: out.shape[k] = shape[perm[k]]; add=true accumulates into out.
void permute(float* out, const float* x, const int64_t* shape, const int* perm, int ndim, bool add);
/// [O, N, I] -> [O, M, I] taking j in [start, start+M) of the middle axis; add accumulates.
void slice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add);
/// The inverse: writes (or adds) x [O,M,I] into out [O,N,I] at offset start of the middle axis.
void unslice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add);

// ---- embedding ---------------------------------------------------------------------------
/// out[t,:] = w[idx[t],:]   w: [V,C]  out: [N,C]
void embedding_fwd(float* out, const float* w, const int32_t* idx, int64_t N, int64_t C);
/// dw[idx[t],:] += dout[t,:]   (threads own column blocks, so repeated ids never race)
void embedding_bwd(float* dw, const float* dout, const int32_t* idx, int64_t N, int64_t C);

// ---- norms, softmax, loss ------------------------------------------------------------------
/// x: [N,C]; saves mean and rstd [N] for backward (b may be null).
void layernorm_fwd(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                   int64_t N, int64_t C, float eps);
/// Any of dx, dw, db may be null.
void layernorm_bwd(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C);
void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps);
void rmsnorm_bwd(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                 int64_t N, int64_t C);
/// Row softmax over the last axis; y may alias x.
void softmax_fwd(float* y, const float* x, int64_t N, int64_t C);
void softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C);
void log_softmax_fwd(float* y, const float* x, int64_t N, int64_t C);
void log_softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C);
/// Per-row loss (0 where target == -1) and log-sum-exp; returns the number of counted rows.
int64_t cross_entropy_fwd(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V);
/// dlogits += scale * (softmax - onehot) on counted rows.
void cross_entropy_bwd(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int64_t N,
                       int64_t V, float scale);

// ---- elementwise -----------------------------------------------------------------------------
void gelu_fwd(float* y, const float* x, int64_t n, bool tanh_approx);
void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);
void silu_fwd(float* y, const float* x, int64_t n);
void silu_bwd(float* dx, const float* dy, const float* x, int64_t n);

/// exp(x) for float, within 2 ulp, written so loops over it vectorise (glibc's expf does not
/// without -ffast-math). Inputs are clamped to [-87.3, 88.3].
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // Round to nearest by adding and removing 1.5·2^23 (floorf would not vectorise).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 in two parts (Cephes)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), the form PyTorch's
/// vectorised CPU kernels use; vectorises.
inline float erf_approx(float x) {
  const float a = x < 0 ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  const float y = 1.0f - poly * exp_approx(-a * a);
  return x < 0 ? -y : y;
}

/// A uniform [0,1) float per (seed, i), the same on every thread count and in backward.
inline float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}
/// y = x * keep / (1-p), keep = hash_uniform(seed, offset + i) >= p.
void dropout_fwd(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t offset);
void dropout_bwd(float* dx, const float* dy, int64_t n, float p, uint64_t seed, uint64_t offset);

}  // namespace tapelm::kern
