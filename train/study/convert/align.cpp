#include "train/study/convert/align.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "train/study/convert/head_blocks.h"

namespace tapelm {

using la::Mat;
using namespace head_blocks;

namespace {

/// The rotation maximising tr(Ωᵀ M) among those that commute with RoPE rotating a head's first
/// rot dims: 2×2 rotations on the RoPE planes (i, i + rot/2), and any rotation of the dims RoPE
/// leaves alone (rot .. hd-1: GPT-NeoX's partial rotary), by Procrustes on that block. On one
/// plane tr(Ωᵀ M) = c(m₀₀ + m₁₁) + s(m₁₀ − m₀₁), largest at θ = atan2(m₁₀ − m₀₁, m₀₀ + m₁₁), where
/// it equals the norm of that vector; on the free block the maximum is M's nuclear norm there.
Mat plane_procrustes(const Mat& M, int64_t rot, double* value = nullptr) {
  const int64_t hd = M.rows, h2 = rot / 2;
  Mat R(hd, hd);
  double v = 0;
  for (int64_t p = 0; p < h2; p++) {
    const int64_t i = p, j = p + h2;
    const double a = M(i, i) + M(j, j), b = M(j, i) - M(i, j);
    const double th = std::atan2(b, a), c = std::cos(th), s = std::sin(th);
    R(i, i) = c, R(i, j) = -s, R(j, i) = s, R(j, j) = c;
    v += std::hypot(a, b);
  }
  if (rot < hd) {
    const int64_t n = hd - rot;
    Mat F(n, n);
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) F(i, j) = M(rot + i, rot + j);
    const Mat Q = la::procrustes(F);
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) R(rot + i, rot + j) = Q(i, j);
    v += la::nuclear_norm(F);
  }
  if (value) *value = v;
  return R;
}

/// Generalised Procrustes over one group's head blocks W̃_i: rotations Ω_i minimising
/// Σ_i ‖A_i Ω_i − Ā‖² with A_i = X̃ W̃_iᵀ and Ā the mean of the aligned A_i Ω_i, by alternating
/// (each Ω_i the Procrustes rotation onto the current reference, then the reference the new mean)
/// until the objective stops falling. Starts from the first member as reference.
std::vector<Mat> generalised_procrustes(const std::vector<Mat>& W, const Mat& S, int64_t rot) {
  const size_t n = W.size();
  const int64_t hd = W[0].rows;
  std::vector<Mat> omega(n, Mat::identity(hd));
  Mat ref = W[0];
  double prev = INFINITY;
  for (int it = 0; it < 200; it++) {
    for (size_t i = 0; i < n; i++) {
      const Mat M = cross_gram(W[i], S, ref);  // A_iᵀ Ā
      omega[i] = rot > 0 ? plane_procrustes(M, rot) : la::procrustes(M);
    }
    Mat mean(W[0].rows, W[0].cols);
    std::vector<Mat> aligned;
    for (size_t i = 0; i < n; i++) {
      aligned.push_back(la::matmul(la::transpose(omega[i]), W[i]));  // Ω_iᵀ W̃_i: weights of A_i Ω_i
      mean = la::add(mean, aligned.back());
    }
    mean = la::scale(mean, 1.0 / static_cast<double>(n));
    double obj = 0;
    for (size_t i = 0; i < n; i++) {
      const Mat D = la::add(aligned[i], la::scale(mean, -1));
      obj += la::trace(cross_gram(D, S, D));
    }
    ref = mean;
    if (!(obj < prev - 1e-12 * std::max(prev, 1e-300))) break;
    prev = obj;
  }
  return omega;
}

/// max over the allowed rotations Ω of tr(Ωᵀ A_aᵀ A_b), and the squared Procrustes distance
/// min_Ω ‖A_a Ω − A_b‖² relative to ‖A_a‖² + ‖A_b‖² (0: equal up to rotation, 1: orthogonal).
double aligned_distance(const Mat& wa, const Mat& wb, const Mat& S, int64_t rot) {
  const double na = la::trace(cross_gram(wa, S, wa)), nb = la::trace(cross_gram(wb, S, wb));
  const Mat M = cross_gram(wa, S, wb);
  double best = 0;
  if (rot > 0) plane_procrustes(M, rot, &best);
  else best = la::nuclear_norm(M);
  const double tot = na + nb;
  return tot > 0 ? std::max(0.0, tot - 2 * best) / tot : 0.0;
}

}  // namespace

void align_kv_heads(GPT& model, int64_t rep, const Calibration& c) {
  for (int64_t l = 0; l < model.config().n_layer; l++) align_kv_heads(*model.blocks[l]->attn, model.config(), rep, c.gram[l]);
}

void align_kv_heads(const Attention& at, const GPTConfig& cfg, int64_t rep, const Mat& S) {
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim(), rq = cfg.n_head / KV;
  const int64_t rope = cfg.pos == PosKind::Rope ? cfg.rope_dims() : 0;  // the rotated dims a key rotation must commute with
  if (rep <= 1) return;
  const Proj wq = proj(*at.wq), wk = proj(*at.wk), wv = proj(*at.wv);
  Tensor& wo = at.wo->weight.val();
  for (int64_t g = 0; g < KV / rep; g++) {
    std::vector<Mat> K, V;
    for (int64_t m = 0; m < rep; m++) {
      K.push_back(rows_of(wk, g * rep + m, hd));
      V.push_back(rows_of(wv, g * rep + m, hd));
    }
    // Keys: k' = Ωᵀ k and q' = Ωᵀ q for every query head reading the kv head: q'·k' = q·k.
    // With RoPE, Ω is made of rotations on RoPE's own planes (and any on the dims it leaves
    // alone), so RoPE(Ωᵀ q) = Ωᵀ RoPE(q).
    const std::vector<Mat> ok = generalised_procrustes(K, S, rope);
    // Values: v' = Ωᵀ v and wo's columns Wo_h' = Wo_h Ω: Wo_h' v' = Wo_h v.
    const std::vector<Mat> ov = generalised_procrustes(V, S, 0);
    for (int64_t m = 0; m < rep; m++) {
      const int64_t i = g * rep + m;
      const Mat okt = la::transpose(ok[m]), ovt = la::transpose(ov[m]);
      set_rows(wk, i, hd, la::matmul(okt, K[m]));
      set_rows(wv, i, hd, la::matmul(ovt, V[m]));
      for (int64_t h = i * rq; h < (i + 1) * rq; h++) {
        set_rows(wq, h, hd, la::matmul(okt, rows_of(wq, h, hd)));
        set_cols(wo, h, hd, la::matmul(cols_of(wo, h, hd), ov[m]));
      }
    }
  }
}

std::vector<int64_t> similar_order(const GPT& model, int64_t layer, int64_t rep, const Calibration& c) {
  return similar_order(*model.blocks[layer]->attn, model.config(), rep, c.gram[layer]);
}

std::vector<int64_t> similar_order(const Attention& at, const GPTConfig& cfg, int64_t rep, const Mat& S) {
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim();
  std::vector<Mat> K, V;
  for (int64_t i = 0; i < KV; i++) {
    K.push_back(rows_of(proj(*at.wk), i, hd));
    V.push_back(rows_of(proj(*at.wv), i, hd));
  }
  // Distance of two heads: their relative Procrustes distances on K (RoPE planes only with RoPE)
  // and on V, added.
  std::vector<std::vector<double>> D(KV, std::vector<double>(KV, 0.0));
  for (int64_t i = 0; i < KV; i++)
    for (int64_t j = i + 1; j < KV; j++)
      D[i][j] = D[j][i] = aligned_distance(K[i], K[j], S, cfg.pos == PosKind::Rope ? cfg.rope_dims() : 0) + aligned_distance(V[i], V[j], S, 0);
  // Swap search from the contiguous grouping: exchange two heads of different groups whenever
  // that lowers the sum of within-group distances; stop when no swap does.
  std::vector<int64_t> group(KV);
  for (int64_t i = 0; i < KV; i++) group[i] = i / rep;
  for (int pass = 0; pass < 1000; pass++) {
    bool improved = false;
    for (int64_t a = 0; a < KV; a++)
      for (int64_t b = a + 1; b < KV; b++) {
        if (group[a] == group[b]) continue;
        double delta = 0;
        for (int64_t x = 0; x < KV; x++) {
          if (x == a || x == b) continue;
          if (group[x] == group[a]) delta += D[b][x] - D[a][x];
          if (group[x] == group[b]) delta += D[a][x] - D[b][x];
        }
        if (delta < -1e-12) {
          std::swap(group[a], group[b]);
          improved = true;
        }
      }
    if (!improved) break;
  }
  // Groups in the order of their lowest head, heads ascending within a group.
  std::vector<int64_t> perm;
  std::vector<bool> seen(KV / rep, false);
  for (int64_t i = 0; i < KV; i++)
    if (!seen[group[i]]) {
      seen[group[i]] = true;
      for (int64_t j = 0; j < KV; j++)
        if (group[j] == group[i]) perm.push_back(j);
    }
  return perm;
}

void permute_kv_heads(GPT& model, int64_t layer, const std::vector<int64_t>& perm) {
  permute_kv_heads(*model.blocks[layer]->attn, model.config(), perm);
}

void permute_kv_heads(const Attention& at, const GPTConfig& cfg, const std::vector<int64_t>& perm) {
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim(), rq = cfg.n_head / KV;
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(KV);
  std::iota(iota.begin(), iota.end(), 0);
  if (sorted != iota) throw Error(ErrorKind::internal, "permute_kv_heads: not a permutation of the kv heads");
  // Rows of a head-major projection (weight or bias), `unit` heads per kv head.
  auto permute_rows = [&](Tensor& t, int64_t unit) {
    const int64_t row = t.ndim() == 2 ? t.dim(1) : 1, block = unit * hd * row;
    const Tensor old = t.clone();
    for (int64_t j = 0; j < KV; j++)
      std::copy(old.data() + perm[j] * block, old.data() + (perm[j] + 1) * block, t.data() + j * block);
  };
  for (const auto& lin : {at.wq, at.wk, at.wv}) {
    const int64_t unit = lin == at.wq ? rq : 1;
    permute_rows(lin->weight.val(), unit);
    if (lin->bias.defined()) permute_rows(lin->bias.val(), unit);
  }
  Tensor& wo = at.wo->weight.val();
  const Tensor old = wo.clone();
  const int64_t d = wo.dim(0), n = wo.dim(1), w = rq * hd;
  for (int64_t i = 0; i < d; i++)
    for (int64_t j = 0; j < KV; j++)
      std::copy(old.data() + i * n + perm[j] * w, old.data() + i * n + (perm[j] + 1) * w, wo.data() + i * n + j * w);
}

}  // namespace tapelm
