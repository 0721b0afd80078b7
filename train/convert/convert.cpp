#include "train/convert/convert.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/ops.h"
#include "autograd/tape.h"

namespace tapelm {

using la::Mat;

ConvertMethod parse_convert_method(const std::string& s) {
  if (s == "mean") return ConvertMethod::Mean;
  if (s == "first") return ConvertMethod::First;
  if (s == "random") return ConvertMethod::Random;
  if (s == "mean-norm") return ConvertMethod::MeanNorm;
  if (s == "aligned") return ConvertMethod::Aligned;
  if (s == "fit") return ConvertMethod::Fit;
  if (s == "aligned-fit") return ConvertMethod::AlignedFit;
  throw Error(ErrorKind::usage, "unknown conversion method \"" + s.substr(0, 80) +
                                    "\" (expected mean, first, random, mean-norm, aligned, fit or aligned-fit)");
}

std::string to_string(ConvertMethod m) {
  switch (m) {
    case ConvertMethod::Mean: return "mean";
    case ConvertMethod::First: return "first";
    case ConvertMethod::Random: return "random";
    case ConvertMethod::MeanNorm: return "mean-norm";
    case ConvertMethod::Aligned: return "aligned";
    case ConvertMethod::Fit: return "fit";
    case ConvertMethod::AlignedFit: return "aligned-fit";
  }
  return "?";
}

std::vector<std::string> convert_method_names() { return {"mean", "first", "random", "mean-norm", "aligned", "fit", "aligned-fit"}; }

Grouping parse_grouping(const std::string& s) {
  if (s == "contiguous") return Grouping::Contiguous;
  if (s == "similar") return Grouping::Similar;
  throw Error(ErrorKind::usage, "unknown grouping \"" + s.substr(0, 80) + "\" (expected contiguous or similar)");
}

std::string to_string(Grouping g) { return g == Grouping::Contiguous ? "contiguous" : "similar"; }

bool needs_calibration(ConvertMethod m, Grouping g) {
  return g == Grouping::Similar || m == ConvertMethod::Aligned || m == ConvertMethod::Fit ||
         m == ConvertMethod::AlignedFit;
}

// ---- calibration -------------------------------------------------------------------------------

Calibration calibrate(GPT& model, const std::vector<Index>& batches) {
  NoGrad ng;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t d = model.config().n_embd, L = model.config().n_layer;
  Calibration c;
  c.gram.assign(static_cast<size_t>(L), Mat(d + 1, d + 1));
  for (const Index& idx : batches) {
    const std::vector<Tensor> xs = model.attention_inputs(idx);
    const int64_t N = idx.numel();
    for (int64_t l = 0; l < L; l++) {
      const Tensor x = xs[l].reshape({N, d});
      // Xᵀ X of this batch in float (at most a few thousand terms per entry), summed in double.
      const Tensor xtx = matmul(Var(x), Var(x), true, false).val();
      Mat& g = c.gram[l];
      for (int64_t i = 0; i < d; i++)
        for (int64_t j = 0; j < d; j++) g(i, j) += xtx[i * d + j];
      for (int64_t t = 0; t < N; t++)
        for (int64_t i = 0; i < d; i++) g(i, d) += x[t * d + i];
      g(d, d) += static_cast<double>(N);
    }
    c.tokens += N;
  }
  model.train(was_training);
  if (c.tokens == 0) throw Error(ErrorKind::data, "calibration: no tokens");
  for (Mat& g : c.gram) {
    for (int64_t i = 0; i < d; i++) g(d, i) = g(i, d);
    g = la::scale(g, 1.0 / static_cast<double>(c.tokens));
  }
  return c;
}

std::vector<Index> calibration_batches(const TokenSeq& ids, int64_t T, int64_t tokens, uint64_t seed,
                                       const std::string& what) {
  if (tokens <= 0) throw Error(ErrorKind::usage, "calibration tokens must be positive, got " + std::to_string(tokens));
  const int64_t n = ids.size();
  if (n < T)
    throw Error(ErrorKind::data, what + ": " + std::to_string(n) + " tokens, fewer than one calibration window of " +
                                     std::to_string(T));
  if (n < tokens)
    throw Error(ErrorKind::data, what + ": " + std::to_string(n) + " tokens, fewer than the " + std::to_string(tokens) +
                                     " calibration tokens asked for");
  const int64_t windows = (tokens + T - 1) / T, per_batch = 32;
  Rng rng(seed ^ 0xCA1B0u);
  std::vector<Index> out;
  for (int64_t w0 = 0; w0 < windows; w0 += per_batch) {
    const int64_t b = std::min(per_batch, windows - w0);
    Index x;
    x.shape = {b, T};
    for (int64_t w = 0; w < b; w++) {
      const int64_t s = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - T + 1)));
      const size_t at = x.data.size();
      x.data.resize(at + static_cast<size_t>(T));
      ids.copy(s, T, x.data.data() + at);
    }
    out.push_back(std::move(x));
  }
  return out;
}

// ---- head blocks as matrices ---------------------------------------------------------------------

namespace {

/// A projection: weight [rows, cols] and optional bias [rows]; rows are head-major.
struct Proj {
  Tensor* w;
  Tensor* b;
};

Proj proj(const Linear& l) { return {&l.weight.val(), l.bias.defined() ? &l.bias.val() : nullptr}; }

/// Rows [h·hd, (h+1)·hd) as W̃ = [W | b] (hd × (cols+1)), a zero last column without bias.
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

/// Columns [h·hd, (h+1)·hd) of wo [d, H·hd] (d × hd).
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

/// W̃_a Σ W̃_bᵀ: the Gram matrix A_aᵀ A_b of the activations A = X̃ W̃ᵀ of two head blocks.
Mat cross_gram(const Mat& wa, const Mat& S, const Mat& wb) { return la::matmul_nt(la::matmul(wa, S), wb); }

/// The rotation maximising tr(Ωᵀ M) among those made of 2×2 rotations on the RoPE planes
/// (i, i + hd/2), which commute with RoPE. On one plane tr(Ωᵀ M) = c(m₀₀ + m₁₁) + s(m₁₀ − m₀₁),
/// largest at θ = atan2(m₁₀ − m₀₁, m₀₀ + m₁₁), where it equals the norm of that vector.
Mat plane_procrustes(const Mat& M, double* value = nullptr) {
  const int64_t hd = M.rows, h2 = hd / 2;
  Mat R(hd, hd);
  double v = 0;
  for (int64_t p = 0; p < h2; p++) {
    const int64_t i = p, j = p + h2;
    const double a = M(i, i) + M(j, j), b = M(j, i) - M(i, j);
    const double th = std::atan2(b, a), c = std::cos(th), s = std::sin(th);
    R(i, i) = c, R(i, j) = -s, R(j, i) = s, R(j, j) = c;
    v += std::hypot(a, b);
  }
  if (value) *value = v;
  return R;
}

/// Generalised Procrustes over one group's head blocks W̃_i: rotations Ω_i minimising
/// Σ_i ‖A_i Ω_i − Ā‖² with A_i = X̃ W̃_iᵀ and Ā the mean of the aligned A_i Ω_i, by alternating
/// (each Ω_i the Procrustes rotation onto the current reference, then the reference the new mean)
/// until the objective stops falling. Starts from the first member as reference.
std::vector<Mat> generalised_procrustes(const std::vector<Mat>& W, const Mat& S, bool rope_planes) {
  const size_t n = W.size();
  const int64_t hd = W[0].rows;
  std::vector<Mat> omega(n, Mat::identity(hd));
  Mat ref = W[0];
  double prev = INFINITY;
  for (int it = 0; it < 200; it++) {
    for (size_t i = 0; i < n; i++) {
      const Mat M = cross_gram(W[i], S, ref);  // A_iᵀ Ā
      omega[i] = rope_planes ? plane_procrustes(M) : la::procrustes(M);
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
double aligned_distance(const Mat& wa, const Mat& wb, const Mat& S, bool rope_planes) {
  const double na = la::trace(cross_gram(wa, S, wa)), nb = la::trace(cross_gram(wb, S, wb));
  const Mat M = cross_gram(wa, S, wb);
  double best = 0;
  if (rope_planes) plane_procrustes(M, &best);
  else best = la::nuclear_norm(M);
  const double tot = na + nb;
  return tot > 0 ? std::max(0.0, tot - 2 * best) / tot : 0.0;
}

void check_calibration(const GPT& m, const Calibration* c, ConvertMethod method, Grouping g) {
  if (!c)
    throw Error(ErrorKind::usage, "conversion " + to_string(method) + (g == Grouping::Similar ? " with grouping similar" : "") +
                                      " needs calibration data (--calib)");
  const int64_t d = m.config().n_embd;
  if (static_cast<int64_t>(c->gram.size()) != m.config().n_layer || c->gram[0].rows != d + 1)
    throw Error(ErrorKind::internal, "calibration statistics do not match the model's layers");
}

/// A copy of a model with the same config and weights.
std::unique_ptr<GPT> clone_model(const GPT& src) {
  auto out = std::make_unique<GPT>(src.config(), 0);
  auto d = out->named_parameters(), s = src.named_parameters();
  for (size_t i = 0; i < s.size(); i++) d[i].second.val() = s[i].second.val().clone();
  return out;
}

/// mean-norm's factor for group g of a [KV·hd, cols] weight: the average Frobenius norm of the
/// members' row blocks over the norm of their (float) mean.
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

// ---- the function-preserving steps ---------------------------------------------------------------

void align_kv_heads(GPT& model, int64_t rep, const Calibration& c) {
  const GPTConfig& cfg = model.config();
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim(), rq = cfg.n_head / KV;
  const bool rope = cfg.pos == PosKind::Rope;
  if (rep <= 1) return;
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    const Attention& at = *model.blocks[l]->attn;
    const Mat& S = c.gram[l];
    const Proj wq = proj(*at.wq), wk = proj(*at.wk), wv = proj(*at.wv);
    Tensor& wo = at.wo->weight.val();
    for (int64_t g = 0; g < KV / rep; g++) {
      std::vector<Mat> K, V;
      for (int64_t m = 0; m < rep; m++) {
        K.push_back(rows_of(wk, g * rep + m, hd));
        V.push_back(rows_of(wv, g * rep + m, hd));
      }
      // Keys: k' = Ωᵀ k and q' = Ωᵀ q for every query head reading the kv head: q'·k' = q·k.
      // With RoPE, Ω is made of rotations on RoPE's own planes, so RoPE(Ωᵀ q) = Ωᵀ RoPE(q).
      const std::vector<Mat> ok = generalised_procrustes(K, S, rope);
      // Values: v' = Ωᵀ v and wo's columns Wo_h' = Wo_h Ω: Wo_h' v' = Wo_h v.
      const std::vector<Mat> ov = generalised_procrustes(V, S, false);
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
}

std::vector<int64_t> similar_order(const GPT& model, int64_t layer, int64_t rep, const Calibration& c) {
  const GPTConfig& cfg = model.config();
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim();
  const Attention& at = *model.blocks[layer]->attn;
  const Mat& S = c.gram[layer];
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
      D[i][j] = D[j][i] = aligned_distance(K[i], K[j], S, cfg.pos == PosKind::Rope) + aligned_distance(V[i], V[j], S, false);
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
  const GPTConfig& cfg = model.config();
  const int64_t KV = cfg.n_kv_head, hd = cfg.head_dim(), rq = cfg.n_head / KV;
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(KV);
  std::iota(iota.begin(), iota.end(), 0);
  if (sorted != iota) throw Error(ErrorKind::internal, "permute_kv_heads: not a permutation of the kv heads");
  const Attention& at = *model.blocks[layer]->attn;
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

// ---- conversion ------------------------------------------------------------------------------------

std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, ConvertMethod method, uint64_t seed) {
  return convert_kv_heads(src, G, ConvertOptions{.method = method, .seed = seed});
}

std::unique_ptr<GPT> convert_kv_heads(const GPT& src_in, int64_t G, const ConvertOptions& o) {
  const GPTConfig& c = src_in.config();
  if (G <= 0 || c.n_kv_head % G != 0)
    throw Error(ErrorKind::config, "cannot convert " + std::to_string(c.n_kv_head) + " kv heads to " + std::to_string(G) +
                                ": the new count must divide the old");
  const ConvertMethod method = o.method;
  const int64_t rep = c.n_kv_head / G, hd = c.head_dim();
  GPTConfig nc = c;
  nc.n_kv_head = G;
  auto out = std::make_unique<GPT>(nc, o.seed);
  // Groups of one: every method but random init returns the model as it is.
  if (rep == 1 && method != ConvertMethod::Random) {
    auto d = out->named_parameters(), s = src_in.named_parameters();
    for (size_t i = 0; i < s.size(); i++) d[i].second.val() = s[i].second.val().clone();
    return out;
  }
  if (needs_calibration(method, o.grouping)) check_calibration(src_in, o.calib, method, o.grouping);
  // The function-preserving steps work on a copy of the source.
  std::unique_ptr<GPT> work;
  const bool align = method == ConvertMethod::Aligned || method == ConvertMethod::AlignedFit;
  if (o.grouping == Grouping::Similar || align) {
    work = clone_model(src_in);
    if (o.grouping == Grouping::Similar)
      for (int64_t l = 0; l < c.n_layer; l++) permute_kv_heads(*work, l, similar_order(*work, l, rep, *o.calib));
    if (align) align_kv_heads(*work, rep, *o.calib);
  }
  const GPT& src = work ? *work : src_in;

  Rng rng(o.seed ^ 0xC0DE);
  auto dst_params = out->named_parameters();
  auto src_params = src.named_parameters();
  for (size_t i = 0; i < src_params.size(); i++) {
    const std::string& name = src_params[i].first;
    const Tensor& s = src_params[i].second.val();
    Tensor& d = dst_params[i].second.val();
    const bool kv = name.find(".attn.wk.") != std::string::npos || name.find(".attn.wv.") != std::string::npos;
    if (!kv) {
      d = s.clone();
      continue;
    }
    // Rows are head-major: head h owns rows [h*hd, (h+1)*hd) of the weight (or bias).
    const int64_t cols = s.ndim() == 2 ? s.dim(1) : 1, block = hd * cols;
    // mean-norm scales a bias with its weight's factor.
    const Tensor* weight = &s;
    if (method == ConvertMethod::MeanNorm && s.ndim() == 1) {
      const std::string wname = name.substr(0, name.size() - 4) + "weight";
      for (const auto& [n2, p2] : src_params)
        if (n2 == wname) weight = &p2.val();
    }
    d = Tensor::empty(s.ndim() == 2 ? Shape{G * hd, cols} : Shape{G * hd});
    for (int64_t g = 0; g < G; g++) {
      float* o_ = d.data() + g * block;
      const float* first = s.data() + g * rep * block;
      switch (method) {
        case ConvertMethod::Mean:
        case ConvertMethod::MeanNorm:
        case ConvertMethod::Aligned:
        case ConvertMethod::Fit:
        case ConvertMethod::AlignedFit: {  // fit's wk/wv are overwritten below; the mean stands for the rest
          // Sum in head order, then divide: PyTorch's mean over the group axis, to the bit.
          for (int64_t e = 0; e < block; e++) {
            float acc = first[e];
            for (int64_t r = 1; r < rep; r++) acc += first[r * block + e];
            o_[e] = acc / static_cast<float>(rep);
          }
          if (method == ConvertMethod::MeanNorm) {
            // The mean of r unrelated heads is about √r times shorter than they are, which flattens
            // attention (keys) and shrinks the output (values): give it back their average norm.
            const float f = static_cast<float>(mean_norm_scale(*weight, g, rep, hd));
            for (int64_t e = 0; e < block; e++) o_[e] *= f;
          }
          break;
        }
        case ConvertMethod::First:
          std::copy(first, first + block, o_);
          break;
        case ConvertMethod::Random:
          for (int64_t e = 0; e < block; e++) o_[e] = s.ndim() == 2 ? static_cast<float>(rng.normal() * 0.02) : 0.f;
          break;
      }
    }
  }
  if (method != ConvertMethod::Fit && method != ConvertMethod::AlignedFit) return out;

  // fit. Keys: query head h of the group reads its kv head i through scores Q̃_h W̃_Kᵢ X̃ᵀ
  // (Q̃_h = X̃ W̃_Qhᵀ, X̃ = [X, 1] the calibration inputs stacked, N × (d+1); the biases ride in the
  // last column). Replacing W̃_Kᵢ by a shared W̃ changes them by Q̃_h (W̃_Kᵢ − W̃) X̃ᵀ, and
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
  const int64_t rq = c.n_head / c.n_kv_head;
  for (int64_t l = 0; l < c.n_layer; l++) {
    const Attention& sa = *src.blocks[l]->attn;
    const Attention& da = *out->blocks[l]->attn;
    const Mat& S = o.calib->gram[l];
    const Tensor& wo = sa.wo->weight.val();
    for (int64_t g = 0; g < G; g++) {
      std::vector<Mat> K, V, PK, PV;
      for (int64_t m = 0; m < rep; m++) {
        const int64_t i = g * rep + m;
        K.push_back(rows_of(proj(*sa.wk), i, hd));
        V.push_back(rows_of(proj(*sa.wv), i, hd));
        Mat pk(hd, hd), pv(hd, hd);
        for (int64_t h = i * rq; h < (i + 1) * rq; h++) {
          const Mat q = rows_of(proj(*sa.wq), h, hd), wo_h = cols_of(wo, h, hd);
          pk = la::add(pk, cross_gram(q, S, q));
          pv = la::add(pv, la::matmul(la::transpose(wo_h), wo_h));
        }
        PK.push_back(pk);
        PV.push_back(pv);
      }
      set_rows(proj(*da.wk), g, hd, weighted_mean(PK, K));
      set_rows(proj(*da.wv), g, hd, weighted_mean(PV, V));
    }
  }
  return out;
}

}  // namespace tapelm
