#include "train/study/convert/merge.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "train/study/convert/head_blocks.h"

namespace tapelm {

using la::Mat;
using namespace head_blocks;

namespace {

/// mean-norm's factor for group g of a [KV·hd, cols] weight: the average Frobenius norm of the
/// members' row blocks over the norm of their (float) mean. The mean of r unrelated heads is
/// about √r times shorter than they are, which flattens attention (keys) and shrinks the output
/// (values): the factor gives back their average norm.
double mean_norm_scale(const Tensor& w, int64_t g, int64_t rep, int64_t hd) {
  const int64_t block = hd * w.dim(1);
  const float* first = w.data() + g * rep * block;
  double members = 0, pooled = 0;
  for (int64_t r = 0; r < rep; r++) {
    double s = 0;
    for (int64_t e = 0; e < block; e++) s += double(first[r * block + e]) * first[r * block + e];
    members += std::sqrt(s);
  }
  for (int64_t e = 0; e < block; e++) {
    float acc = first[e];
    for (int64_t r = 1; r < rep; r++) acc += first[r * block + e];
    const double m = acc / static_cast<float>(rep);
    pooled += m * m;
  }
  pooled = std::sqrt(pooled);
  return pooled > 0 ? members / static_cast<double>(rep) / pooled : 1.0;
}

/// Pools one head-major tensor (a weight [KV·hd, cols] or a bias [KV·hd]) into dst; `weight` is
/// the projection's weight, whose factor a rescaled bias takes.
void pool_tensor(const Tensor& s, Tensor& d, const Tensor& weight, const MethodRow& m, int64_t rep, int64_t hd, Rng& rng) {
  const bool is_weight = s.ndim() == 2;
  const int64_t cols = is_weight ? s.dim(1) : 1, block = hd * cols, G = d.dim(0) / hd;
  for (int64_t g = 0; g < G; g++) {
    float* out = d.data() + g * block;
    m.pool(s.data() + g * rep * block, rep, block, out, is_weight, rng);
    if (m.rescales) {
      const float f = static_cast<float>(mean_norm_scale(weight, g, rep, hd));
      for (int64_t e = 0; e < block; e++) out[e] *= f;
    }
  }
}

/// The weighted mean W̃ = (Σ P_i + λI)⁻¹ (Σ P_i W̃_i + λ W̄) with a tiny ridge λ toward the plain
/// mean W̄, so that a group whose P_i are singular (a dead head) still has one answer.
Mat weighted_mean(const std::vector<Mat>& P, const std::vector<Mat>& W) {
  const int64_t hd = W[0].rows;
  Mat A(hd, hd), B(W[0].rows, W[0].cols), mean(W[0].rows, W[0].cols);
  for (size_t i = 0; i < W.size(); i++) {
    A = la::add(A, P[i]);
    B = la::add(B, la::matmul(P[i], W[i]));
    mean = la::add(mean, la::scale(W[i], 1.0 / static_cast<double>(W.size())));
  }
  const double lambda = 1e-7 * la::trace(A) / static_cast<double>(hd) + 1e-30;
  for (int64_t i = 0; i < hd; i++) A(i, i) += lambda;
  return la::solve_spd(A, la::add(B, la::scale(mean, lambda)));
}

}  // namespace

void pool_kv(const Attention& src, const Attention& dst, const MethodRow& m, int64_t rep, int64_t hd, Rng& rng) {
  for (const auto& [s, d] : {std::pair{src.wk, dst.wk}, std::pair{src.wv, dst.wv}}) {
    const Tensor& w = s->weight.val();
    pool_tensor(w, d->weight.val(), w, m, rep, hd, rng);
    if (s->bias.defined()) pool_tensor(s->bias.val(), d->bias.val(), w, m, rep, hd, rng);
  }
  // k_norm over the whole key projection (OLMo-2's): its weight has a slice per key head, pooled as
  // the heads are (the mean, the first; a fresh init's ones), never rescaled. Its statistic then
  // runs over G heads instead of KV: a change no choice of weight undoes.
  const Tensor* kn = src.k_norm ? &src.k_norm->weight.val() : nullptr;
  if (kn && kn->numel() != dst.k_norm->weight.val().numel()) {
    Tensor& out = dst.k_norm->weight.val();
    for (int64_t g = 0; g < out.numel() / hd; g++) {
      if (m.fresh) std::fill(out.data() + g * hd, out.data() + (g + 1) * hd, 1.f);
      else m.pool(kn->data() + g * rep * hd, rep, hd, out.data() + g * hd, false, rng);
    }
  }
}

// Keys: query head h of the group reads its kv head i through scores Q̃_h W̃_Kᵢ X̃ᵀ (Q̃_h = X̃ W̃_Qhᵀ,
// X̃ = [X, 1] the calibration inputs stacked, N × (d+1); the biases ride in the last column).
// Replacing W̃_Kᵢ by a shared W̃ changes them by Q̃_h (W̃_Kᵢ − W̃) X̃ᵀ, and
//   f(W̃) = Σ_i Σ_h ‖Q̃_h (W̃_Kᵢ − W̃) X̃ᵀ‖² = Σ_i tr((W̃_Kᵢ − W̃)ᵀ P_i (W̃_Kᵢ − W̃) Σ)
// with P_i = Σ_h Q̃_hᵀ Q̃_h = Σ_h W̃_Qh Σ W̃_Qhᵀ (hd × hd) and Σ = X̃ᵀ X̃. Its gradient
// −2 Σ_i P_i (W̃_Kᵢ − W̃) Σ vanishes at W̃ = (Σ_i P_i)⁻¹ Σ_i P_i W̃_Kᵢ whatever Σ is: a weighted
// mean with hd × hd weights (f is convex, so that is its minimum).
// Values: head h's output through its slice Wo_h (d × hd) of wo changes by X̃ (W̃_Vᵢ − W̃)ᵀ Wo_hᵀ
// (before attention mixes positions), and the same algebra with P_i = Σ_h Wo_hᵀ Wo_h gives
// W̃ = (Σ_i P_i)⁻¹ Σ_i P_i W̃_Vᵢ: independent of the calibration data.
// RoPE rotates q and k by position, which this bilinear form leaves out: for RoPE models the
// key fit is that of the unrotated scores.
// aligned-fit does this on the aligned model (`src` is then the copy with the rotations folded
// into wq/wk and wv/wo): its query heads and output slices are the rotated ones, so the fit
// minimises the same change of the MHA model's scores and outputs as before, over a larger
// family — the aligned mean is one W̃ it can choose, so it never changes them more than aligned.
void fit_kv(const Attention& src, const Attention& dst, int64_t rep, int64_t hd, const Mat& S) {
  const int64_t KV = src.wk->weight.val().dim(0) / hd, rq = src.wq->weight.val().dim(0) / hd / KV;
  const Tensor& wo = src.wo->weight.val();
  for (int64_t g = 0; g < KV / rep; g++) {
    std::vector<Mat> K, V, PK, PV;
    for (int64_t m = 0; m < rep; m++) {
      const int64_t i = g * rep + m;
      K.push_back(rows_of(proj(*src.wk), i, hd));
      V.push_back(rows_of(proj(*src.wv), i, hd));
      Mat pk(hd, hd), pv(hd, hd);
      for (int64_t h = i * rq; h < (i + 1) * rq; h++) {
        const Mat q = rows_of(proj(*src.wq), h, hd), wo_h = cols_of(wo, h, hd);
        pk = la::add(pk, cross_gram(q, S, q));
        pv = la::add(pv, la::matmul(la::transpose(wo_h), wo_h));
      }
      PK.push_back(pk);
      PV.push_back(pv);
    }
    set_rows(proj(*dst.wk), g, hd, weighted_mean(PK, K));
    set_rows(proj(*dst.wv), g, hd, weighted_mean(PV, V));
  }
}

}  // namespace tapelm
