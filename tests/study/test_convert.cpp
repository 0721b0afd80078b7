// Conversion of K/V heads (mean, first, random, mean-norm, aligned, fit, aligned-fit; contiguous or similar
// groups), the small linear algebra under it, and uptraining.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <chrono>

#include "data/tokens.h"
#include "train/formats/checkpoint.h"
#include "autograd/float16.h"
#include "autograd/quant.h"
#include "train/formats/gguf.h"
#include "train/formats/hf.h"
#include "train/formats/model_source.h"
#include "train/study/convert_model.h"
#include "train/study/convert/convert.h"
#include "train/study/convert/align.h"
#include "train/study/convert/budget.h"
#include "train/eval.h"
#include "train/study/convert/linalg.h"
#include "train/study/uptrain.h"
#include "train/formats/registry.h"
#include "test_util.h"
#include "train/train_config.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

namespace {

/// Conversion options for a variant name ("fit", "mean+similar").
ConvertOptions by(const std::string& variant, const Calibration* c = nullptr, uint64_t seed = 0) {
  return {.variant = Variant::parse(variant), .seed = seed, .calib = c};
}

const std::vector<std::string> all_methods = {"mean", "first", "mean-norm", "aligned", "fit", "aligned-fit"};  // random: no identity

/// A small model with weights large enough that heads differ visibly (std 0.3).
/// rot: RoPE on that many of each head's dims (GPT-NeoX's partial rotary; 0 the whole head).
std::unique_ptr<GPT> busy_model(PosKind pos, bool bias, int64_t H = 4, int64_t KV = 4, uint64_t seed = 3, int64_t rot = 0) {
  GPTConfig c{.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = H, .n_kv_head = KV, .n_embd = 16,
              .mlp_hidden = 32, .pos = pos, .bias = bias};
  c.rotary_dims = rot;
  auto m = std::make_unique<GPT>(c, seed);
  uint64_t k = 100;
  for (auto& [name, p] : m->named_parameters())
    if (name.find(".attn.") != std::string::npos) p.val() = randn(p.val().shape(), k++ * 31 + seed, 0.3f);
  return m;
}

/// Two batches of ids for a model of vocab 13, T 8.
std::vector<Index> some_batches() {
  std::vector<Index> out;
  for (int b = 0; b < 2; b++) {
    Index x;
    x.shape = {3, 8};
    for (int i = 0; i < 24; i++) x.data.push_back((i * 7 + b * 5 + i * i) % 13);
    out.push_back(x);
  }
  return out;
}

/// Mean loss of next-token prediction on the batches (targets: the ids shifted by one, last -1).
double loss_on(const GPT& m, const std::vector<Index>& batches) {
  NoGrad ng;
  double s = 0;
  for (const Index& x : batches) {
    Index y = x;
    for (int64_t b = 0; b < x.shape[0]; b++) {
      for (int64_t t = 0; t + 1 < x.shape[1]; t++) y.data[b * x.shape[1] + t] = x.data[b * x.shape[1] + t + 1];
      y.data[b * x.shape[1] + x.shape[1] - 1] = -1;
    }
    s += m.loss(x, y).item();
  }
  return s / static_cast<double>(batches.size());
}

void expect_same_params(const GPT& a, const GPT& b, const std::string& what) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  BOOST_TEST_REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); i++)
    BOOST_TEST(pa[i].second.val().to_vector() == pb[i].second.val().to_vector(), what << ": " << pa[i].first);
}

la::Mat random_mat(int64_t r, int64_t c, uint64_t seed) {
  Rng rng(seed);
  la::Mat m(r, c);
  for (double& v : m.a) v = rng.normal();
  return m;
}

double max_abs_diff(const la::Mat& a, const la::Mat& b) {
  double w = 0;
  for (size_t i = 0; i < a.a.size(); i++) w = std::max(w, std::fabs(a.a[i] - b.a[i]));
  return w;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(convert)

BOOST_AUTO_TEST_CASE(linear_algebra) {
  // SVD: U diag(s) Vᵀ = A with U, V orthogonal, also for a rank-deficient A.
  for (int64_t n : {1, 2, 5, 17}) {
    for (bool deficient : {false, true}) {
      la::Mat A = random_mat(n, n, 10 + n);
      if (deficient && n > 1)
        for (int64_t i = 0; i < n; i++) A(i, n - 1) = A(i, 0) * 2;  // two dependent columns
      const la::SVD d = la::svd(A);
      la::Mat US = d.U;
      for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) US(i, j) *= d.s[j];
      BOOST_TEST(max_abs_diff(la::matmul_nt(US, d.V), A) < 1e-10, "n " << n);
      BOOST_TEST(max_abs_diff(la::matmul(la::transpose(d.U), d.U), la::Mat::identity(n)) < 1e-10, "n " << n);
      BOOST_TEST(max_abs_diff(la::matmul(la::transpose(d.V), d.V), la::Mat::identity(n)) < 1e-10, "n " << n);
    }
  }
  // Procrustes recovers a known rotation: B = A Ω.
  const la::Mat A = random_mat(40, 6, 3);
  const la::Mat Omega = la::svd(random_mat(6, 6, 4)).U;
  const la::Mat B = la::matmul(A, Omega);
  BOOST_TEST(max_abs_diff(la::procrustes(la::matmul(la::transpose(A), B)), Omega) < 1e-10);
  // nuclear norm of a diagonal matrix: the sum of |entries|
  la::Mat D(3, 3);
  D(0, 0) = 2, D(1, 1) = -3, D(2, 2) = 0.5;
  BOOST_TEST(la::nuclear_norm(D) == 5.5, tt::tolerance(1e-12));
  // Cholesky solve against a multiplication
  const la::Mat M = random_mat(7, 7, 5);
  la::Mat S = la::matmul_nt(M, M);
  for (int64_t i = 0; i < 7; i++) S(i, i) += 0.1;
  const la::Mat X = random_mat(7, 3, 6);
  BOOST_TEST(max_abs_diff(la::solve_spd(S, la::matmul(S, X)), X) < 1e-9);
  BOOST_CHECK_EXCEPTION(la::solve_spd(la::scale(S, -1), X), Error, is_kind(ErrorKind::internal));
}

BOOST_AUTO_TEST_CASE(names_and_calibration_windows) {
  for (const std::string& m : method_names()) {
    BOOST_TEST(method(m).name == m);
    BOOST_TEST(Variant::parse(m).name() == m);
    BOOST_TEST(Variant::parse(m + "+similar").name() == m + "+similar");
    BOOST_TEST((Variant::parse(m + "+similar") == Variant{&method(m), Grouping::Similar}));
  }
  BOOST_TEST(to_string(enum_from_name<Grouping>("similar", "grouping")) == "similar");
  expect_throw([] { enum_from_name<Grouping>("random", "grouping"); }, ErrorKind::usage, {"grouping \"random\" is not one of"});
  expect_throw([] { method("median"); }, ErrorKind::usage, {"median", "aligned, fit, aligned-fit"});
  expect_throw([] { Variant::parse("fit+sideways"); }, ErrorKind::usage, {"grouping \"sideways\" is not one of"});
  BOOST_TEST(Variant::parse("fit").needs_calibration());
  BOOST_TEST(Variant::parse("mean+similar").needs_calibration());
  BOOST_TEST(!Variant::parse("mean-norm").needs_calibration());
  // groups of one read nothing, whatever the variant; a count that does not divide is left to the conversion's own error
  BOOST_TEST(conversion_calibrates(4, 2, Variant::parse("aligned")));
  BOOST_TEST(!conversion_calibrates(4, 4, Variant::parse("aligned")));
  BOOST_TEST(!conversion_calibrates(4, 3, Variant::parse("fit")));
  std::vector<int32_t> ids(400);
  for (int i = 0; i < 400; i++) ids[i] = i;
  const auto a = calibration_batches(ids, 8, 300, 5, "x"), b = calibration_batches(ids, 8, 300, 5, "x");
  BOOST_TEST(a.size() == 2u);  // 38 windows of 8: 32 + 6
  BOOST_TEST(a[0].shape == (Shape{32, 8}), tt::per_element());
  BOOST_TEST(a[1].shape == (Shape{6, 8}), tt::per_element());
  BOOST_TEST(a[1].data == b[1].data, tt::per_element());  // seeded
  BOOST_TEST(calibration_batches(ids, 8, 300, 6, "x")[0].data != a[0].data);
  for (int64_t w = 0; w < 6; w++)  // windows of consecutive ids
    for (int64_t t = 1; t < 8; t++) BOOST_TEST(a[1].data[w * 8 + t] == a[1].data[w * 8 + t - 1] + 1);
  expect_throw([&] { calibration_batches(ids, 8, 401, 5, "calib.txt"); }, ErrorKind::data,
               {"calib.txt", "400 tokens", "401"});
  expect_throw([&] { calibration_batches(std::vector<int32_t>(5, 1), 8, 4, 5, "short.txt"); }, ErrorKind::data,
               {"short.txt", "one calibration window of 8"});
  // the calibration's Σ: the mean of x̃ x̃ᵀ, x̃ = [ln1(x); 1], checked on the hook's own output
  auto m = busy_model(PosKind::Learned, true);
  const Calibration c = calibrate(*m, some_batches());
  BOOST_TEST(c.tokens == 48);
  NoGrad ng;
  m->eval();
  double s01 = 0, s0 = 0;
  for (const Index& x : some_batches()) {
    const Tensor a1 = m->attention_inputs(x)[1];
    for (int64_t t = 0; t < x.numel(); t++) s01 += double(a1[t * 16 + 0]) * a1[t * 16 + 1], s0 += a1[t * 16 + 0];
  }
  BOOST_TEST(c.gram[1](0, 1) == s01 / 48, tt::tolerance(1e-5));
  BOOST_TEST(c.gram[1](16, 0) == s0 / 48, tt::tolerance(1e-5));
  BOOST_TEST(c.gram[1](16, 16) == 1.0);
}

// With partial RoPE (2 of 4 dims) the key rotations are a turn of the one RoPE plane and any
// rotation of the two dims RoPE leaves alone: a rotation mixing them would change the scores.
BOOST_AUTO_TEST_CASE(alignment_and_similar_permutation_leave_the_mha_model_unchanged) {
  for (auto [pos, rot] : {std::pair{PosKind::Learned, int64_t(0)}, {PosKind::Rope, int64_t(0)}, {PosKind::Rope, int64_t(2)}})
    for (auto [H, KV] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}}) {
      auto m = busy_model(pos, true, H, KV, 3, rot);
      const std::vector<Index> data = some_batches();
      const double before = loss_on(*m, data);
      const Calibration c = calibrate(*m, data);
      for (int64_t rep : {int64_t(2), KV}) {
        auto a = convert_kv_heads(*m, KV, by("mean"));  // a copy
        align_kv_heads(*a, rep, c);
        BOOST_TEST(std::fabs(loss_on(*a, data) - before) < 1e-5, "aligned, rep " << rep);
        // the weights did move (the test is not vacuous)
        BOOST_TEST(a->blocks[0]->attn->wk->weight.val().to_vector() != m->blocks[0]->attn->wk->weight.val().to_vector());
      }
      auto p = convert_kv_heads(*m, KV, by("mean"));
      for (int64_t l = 0; l < 2; l++) {
        std::vector<int64_t> perm(KV);
        for (int64_t i = 0; i < KV; i++) perm[i] = (i * 3 + l + 1) % KV;  // an arbitrary permutation
        permute_kv_heads(*p, l, perm);
        const std::vector<int64_t> sim = similar_order(*p, l, 2, c);
        BOOST_TEST(sim.size() == size_t(KV));
        permute_kv_heads(*p, l, sim);
      }
      BOOST_TEST(std::fabs(loss_on(*p, data) - before) < 1e-5, "permuted");
      BOOST_CHECK_EXCEPTION(permute_kv_heads(*p, 0, std::vector<int64_t>(KV, 0)), Error, is_kind(ErrorKind::internal));
    }
}

BOOST_AUTO_TEST_CASE(every_method_with_G_equal_to_KV_returns_the_model) {
  auto m = busy_model(PosKind::Learned, true);
  const Calibration c = calibrate(*m, some_batches());
  for (const std::string& method : all_methods)
    for (Grouping g : {Grouping::Contiguous, Grouping::Similar}) {
      auto out = convert_kv_heads(*m, 4, {.variant = {&tapelm::method(method), g}, .calib = &c});
      expect_same_params(*m, *out, method + " " + to_string(g));
    }
}

BOOST_AUTO_TEST_CASE(equal_heads_convert_with_unchanged_loss_under_every_method) {
  for (PosKind pos : {PosKind::Learned, PosKind::Rope})
    for (int64_t G : {2, 1}) {
      auto m = busy_model(pos, true);
      const int64_t rep = 4 / G;
      for (auto& [name, p] : m->named_parameters()) {
        if (name.find(".attn.wk.") == std::string::npos && name.find(".attn.wv.") == std::string::npos) continue;
        Tensor& t = p.val();
        const int64_t block = t.numel() / 4;  // one head's rows
        for (int64_t h = 0; h < 4; h++)
          std::copy(t.data() + (h / rep) * rep * block, t.data() + ((h / rep) * rep + 1) * block, t.data() + h * block);
      }
      const std::vector<Index> data = some_batches();
      const double before = loss_on(*m, data);
      const Calibration c = calibrate(*m, data);
      for (const std::string& method : all_methods)
        for (Grouping g : {Grouping::Contiguous, Grouping::Similar}) {
          auto out = convert_kv_heads(*m, G, {.variant = {&tapelm::method(method), g}, .calib = &c});
          const double after = loss_on(*out, data);
          BOOST_TEST(std::fabs(after - before) < 1e-5,
                     method << " " << to_string(g) << " G=" << G << (pos == PosKind::Rope ? " rope" : "") << ": "
                            << after << " vs " << before);
        }
    }
}

// OLMo-2's k_norm spans the whole key projection: its weight has a slice per key head, pooled with
// the heads. Where a group's heads and slices are equal, the mean-square over G heads is that over
// KV (each head repeated KV / G times), so mean and first convert without changing the loss; a
// fresh init's slices are ones. Per-head q/k norms (Qwen3's) pass through unchanged.
BOOST_AUTO_TEST_CASE(k_norm_over_the_projection_is_pooled_with_its_heads) {
  for (QkNorm qk : {QkNorm::all, QkNorm::head}) {
    GPTConfig c{.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 4, .n_kv_head = 4, .n_embd = 16, .mlp_hidden = 32};
    c.norm = NormKind::RMSNorm, c.pos = PosKind::Rope, c.mlp = MlpKind::SwiGLU, c.qk_norm = qk;
    if (qk == QkNorm::all) c.norm_position = NormPosition::post;
    GPT m(c, 3);
    uint64_t k = 7;
    for (auto& [name, p] : m.named_parameters()) p.val() = randn(p.val().shape(), k++, 0.3f);
    for (auto& [name, p] : m.named_parameters()) {
      if (name.ends_with("norm.weight"))
        for (int64_t i = 0; i < p.numel(); i++) p.val()[i] = 1.f + p.val()[i];  // around one
      const bool kv = name.find(".attn.wk.") != std::string::npos || name.find(".attn.wv.") != std::string::npos ||
                      (qk == QkNorm::all && name.find(".attn.k_norm.") != std::string::npos);
      if (!kv) continue;
      Tensor& t = p.val();
      const int64_t block = t.numel() / 4;  // one head's rows (or slice)
      for (int64_t h = 0; h < 4; h++) std::copy(t.data() + (h / 2) * 2 * block, t.data() + ((h / 2) * 2 + 1) * block, t.data() + h * block);
    }
    const std::vector<Index> data = some_batches();
    const double before = loss_on(m, data);
    for (const char* meth : {"mean", "first"}) {
      auto out = convert_kv_heads(m, 2, by(meth));
      BOOST_TEST(std::fabs(loss_on(*out, data) - before) < 1e-5, meth << " " << to_string(qk));
      const Tensor& kn = out->blocks[1]->attn->k_norm->weight.val();
      BOOST_TEST(kn.numel() == (qk == QkNorm::all ? 2 * 4 : 4));
    }
    auto fresh = convert_kv_heads(m, 2, by("random"));
    const Tensor& kn = fresh->blocks[0]->attn->k_norm->weight.val();
    if (qk == QkNorm::all)
      for (int64_t i = 0; i < kn.numel(); i++) BOOST_TEST(kn[i] == 1.f);
    else  // shared by the heads: kept
      BOOST_TEST(kn.to_vector() == m.blocks[0]->attn->k_norm->weight.val().to_vector(), tt::per_element());
  }
}

BOOST_AUTO_TEST_CASE(aligned_recovers_heads_that_are_rotations_of_each_other) {
  // Within each group every head is head 0 of the group turned by its own rotation: keys and the
  // query rows by R_h (so the scores are head 0's), values by U_h with wo's columns turned back
  // (so the outputs are head 0's). Mean pooling averages the turned copies into something else;
  // aligned turns them back first. With RoPE the key rotations are 2×2 turns on RoPE's planes.
  for (PosKind pos : {PosKind::Learned, PosKind::Rope})
    for (int64_t G : {2, 1}) {
      auto m = busy_model(pos, false);
      const int64_t hd = 4, rep = 4 / G, d = 16;
      for (const auto& b : m->blocks) {
        Attention& at = *b->attn;
        Tensor &wq = at.wq->weight.val(), &wk = at.wk->weight.val(), &wv = at.wv->weight.val(), &wo = at.wo->weight.val();
        for (int64_t h = 0; h < 4; h++) {
          const int64_t h0 = (h / rep) * rep;
          if (h == h0) continue;
          la::Mat R;
          if (pos == PosKind::Rope) {
            R = la::Mat(hd, hd);
            for (int64_t p = 0; p < hd / 2; p++) {
              const double th = 0.7 * double(h + 1) + p, c = std::cos(th), s = std::sin(th);
              R(p, p) = c, R(p, p + 2) = -s, R(p + 2, p) = s, R(p + 2, p + 2) = c;
            }
          } else {
            R = la::svd(random_mat(hd, hd, 40 + h)).U;
          }
          const la::Mat U = la::svd(random_mat(hd, hd, 80 + h)).U;
          for (int64_t i = 0; i < hd; i++)
            for (int64_t j = 0; j < d; j++) {
              double q = 0, k = 0, v = 0;
              for (int64_t r = 0; r < hd; r++) {
                q += R(i, r) * wq[(h0 * hd + r) * d + j];
                k += R(i, r) * wk[(h0 * hd + r) * d + j];
                v += U(i, r) * wv[(h0 * hd + r) * d + j];
              }
              wq[(h * hd + i) * d + j] = float(q), wk[(h * hd + i) * d + j] = float(k), wv[(h * hd + i) * d + j] = float(v);
            }
          for (int64_t j = 0; j < d; j++)
            for (int64_t i = 0; i < hd; i++) {
              double o = 0;  // Wo_h = Wo_h0 Uᵀ
              for (int64_t r = 0; r < hd; r++) o += wo[j * 16 + h0 * hd + r] * U(i, r);
              wo[j * 16 + h * hd + i] = float(o);
            }
        }
      }
      const std::vector<Index> data = some_batches();
      const double before = loss_on(*m, data);
      const Calibration c = calibrate(*m, data);
      const double aligned = loss_on(*convert_kv_heads(*m, G, by("aligned", &c)), data);
      const double aligned_fit =
          loss_on(*convert_kv_heads(*m, G, by("aligned-fit", &c)), data);
      const double mean = loss_on(*convert_kv_heads(*m, G, by("mean")), data);
      const std::string what = std::string(pos == PosKind::Rope ? "rope" : "learned") + " G=" + std::to_string(G);
      BOOST_TEST(std::fabs(aligned - before) < 1e-5, what << ": aligned " << aligned << " vs MHA " << before);
      // aligned, the members are equal, and the weighted mean of equal heads is that head
      BOOST_TEST(std::fabs(aligned_fit - before) < 1e-5, what << ": aligned-fit " << aligned_fit << " vs MHA " << before);
      BOOST_TEST(std::fabs(mean - before) > 1e-3, what << ": mean " << mean << " vs MHA " << before);
    }
}

/// A one-layer model (d 8, four heads of 2) whose attention weights are drawn with std 0.4, the
/// i-th attention tensor from seed weight_seed + i: heads differ enough that no merge is exact.
std::unique_ptr<GPT> one_layer_random_attention(bool bias, uint64_t model_seed, uint64_t weight_seed) {
  GPTConfig cfg{.vocab_size = 13, .block_size = 8, .n_layer = 1, .n_head = 4, .n_kv_head = 4, .n_embd = 8,
                .mlp_hidden = 16, .bias = bias};
  auto m = std::make_unique<GPT>(cfg, model_seed);
  uint64_t k = 1;
  for (auto& [name, p] : m->named_parameters())
    if (name.find(".attn.") != std::string::npos) p.val() = randn(p.val().shape(), weight_seed + k++, 0.4f);
  return m;
}

/// X̃ = [x, 1] for every token of the batches, x the first layer's attention input, in double.
std::vector<std::vector<double>> augmented_inputs(GPT& m, const std::vector<Index>& data) {
  const int64_t d = m.config().n_embd;
  std::vector<std::vector<double>> X;
  NoGrad ng;
  m.eval();
  for (const Index& b : data) {
    const Tensor x = m.attention_inputs(b)[0];
    for (int64_t t = 0; t < b.numel(); t++) {
      std::vector<double> row(x.data() + t * d, x.data() + (t + 1) * d);
      row.push_back(1.0);
      X.push_back(row);
    }
  }
  return X;
}

BOOST_AUTO_TEST_CASE(fit_is_the_least_squares_merge) {
  // fit's closed form against the objectives written out on the activations and minimised by a
  // derivative-free conjugate-gradient search (central differences are exact for a quadratic).
  for (bool bias : {false, true}) {
    const auto model = one_layer_random_attention(bias, 9, 500);
    GPT& m = *model;
    const std::vector<Index> data = some_batches();
    const Calibration c = calibrate(m, data);
    auto out = convert_kv_heads(m, 1, by("fit", &c));
    const std::vector<std::vector<double>> X = augmented_inputs(m, data);
    const Attention& at = *m.blocks[0]->attn;
    auto w = [&](const Linear& l, int64_t r, int64_t col) {  // W̃ entry: weight, or the bias in column 8
      return col < 8 ? double(l.weight.val()[r * 8 + col]) : (l.bias.defined() ? double(l.bias.val()[r]) : 0.0);
    };
    const Tensor& wo = at.wo->weight.val();
    const int64_t hd = 2, n = static_cast<int64_t>(X.size());
    // Σ_h ‖Q̃_h (W̃_Kh − W) X̃ᵀ‖² (keys) or Σ_h ‖X̃ (W̃_Vh − W)ᵀ Wo_hᵀ‖² (values), W = hd × 9.
    auto objective = [&](bool keys, const std::vector<double>& W) {
      double f = 0;
      for (int64_t h = 0; h < 4; h++) {
        const Linear& l = keys ? *at.wk : *at.wv;
        std::vector<double> A(n * hd);  // X̃ (W̃_h − W)ᵀ: n × hd
        for (int64_t t = 0; t < n; t++)
          for (int64_t i = 0; i < hd; i++) {
            double s = 0;
            for (int64_t j = 0; j < 9; j++) s += X[t][j] * (w(l, h * hd + i, j) - W[i * 9 + j]);
            A[t * hd + i] = s;
          }
        if (keys) {
          for (int64_t t = 0; t < n; t++) {
            double q[2];
            for (int64_t i = 0; i < hd; i++) {
              q[i] = 0;
              for (int64_t j = 0; j < 9; j++) q[i] += X[t][j] * w(*at.wq, h * hd + i, j);
            }
            for (int64_t u = 0; u < n; u++) {
              const double sc = q[0] * A[u * hd] + q[1] * A[u * hd + 1];
              f += sc * sc;
            }
          }
        } else {
          for (int64_t t = 0; t < n; t++)
            for (int64_t o = 0; o < 8; o++) {
              const double y = wo[o * 8 + h * hd] * A[t * hd] + wo[o * 8 + h * hd + 1] * A[t * hd + 1];
              f += y * y;
            }
        }
      }
      return f;
    };
    for (bool keys : {true, false}) {
      const int64_t P = hd * 9;
      auto f = [&](const std::vector<double>& W) { return objective(keys, W); };
      auto grad = [&](const std::vector<double>& W) {
        std::vector<double> g(P);
        for (int64_t i = 0; i < P; i++) {
          std::vector<double> a = W, b = W;
          a[i] += 1e-3, b[i] -= 1e-3;
          g[i] = (f(a) - f(b)) / 2e-3;
        }
        return g;
      };
      std::vector<double> W(P, 0.0), g = grad(W), dir(P);
      for (int64_t i = 0; i < P; i++) dir[i] = -g[i];
      for (int it = 0; it < 4 * P; it++) {
        // exact line search on the quadratic φ(s) = f(W + s·dir) from three values
        auto at_s = [&](double s) {
          std::vector<double> x = W;
          for (int64_t i = 0; i < P; i++) x[i] += s * dir[i];
          return f(x);
        };
        const double f0 = at_s(0), fp = at_s(1), fm = at_s(-1), curv = fp + fm - 2 * f0;
        if (!(curv > 0)) break;
        const double s = (fm - fp) / (2 * curv);
        for (int64_t i = 0; i < P; i++) W[i] += s * dir[i];
        const std::vector<double> g2 = grad(W);
        double num = 0, den = 0;
        for (int64_t i = 0; i < P; i++) num += g2[i] * (g2[i] - g[i]), den += g[i] * g[i];
        if (den == 0) break;
        const double beta = std::max(0.0, num / den);  // Polak-Ribière
        for (int64_t i = 0; i < P; i++) dir[i] = -g2[i] + beta * dir[i];
        g = g2;
      }
      const Linear& merged = keys ? *out->blocks[0]->attn->wk : *out->blocks[0]->attn->wv;
      std::vector<double> fitted(P), mean(P, 0.0);
      for (int64_t i = 0; i < hd; i++)
        for (int64_t j = 0; j < 9; j++) {
          fitted[i * 9 + j] = bias || j < 8 ? w(merged, i, j) : 0.0;
          for (int64_t h = 0; h < 4; h++) mean[i * 9 + j] += w(keys ? *at.wk : *at.wv, h * hd + i, j) / 4;
        }
      const std::string what = std::string(keys ? "keys" : "values") + (bias ? ", bias" : "");
      if (!bias)  // without biases the optimiser's bias column is free; fix it at 0 as the model does
        for (int64_t i = 0; i < hd; i++) W[i * 9 + 8] = 0;
      const double f_fit = f(fitted), f_opt = f(W), f_mean = f(mean);
      BOOST_TEST(f_fit <= f_opt * (1 + 1e-4) + 1e-9, what << ": fit " << f_fit << " vs optimiser " << f_opt);
      BOOST_TEST(f_opt <= f_fit * (1 + 1e-2), what << ": optimiser " << f_opt << " vs fit " << f_fit);
      BOOST_TEST(f_fit < f_mean, what << ": fit " << f_fit << " vs mean " << f_mean);
      // f is a convex quadratic: fit is its minimum iff the gradient vanishes there (the bias
      // column is left out without biases: the model has none to set)
      const std::vector<double> g_fit = grad(fitted), g_mean = grad(mean);
      double gf = 0, gm = 0;
      for (int64_t i = 0; i < P; i++)
        if (bias || i % 9 != 8) gf += g_fit[i] * g_fit[i], gm += g_mean[i] * g_mean[i];
      BOOST_TEST(std::sqrt(gf) < 1e-4 * std::sqrt(gm), what << ": |∇f| at fit " << std::sqrt(gf) << ", at mean " << std::sqrt(gm));
    }
  }
}

BOOST_AUTO_TEST_CASE(aligned_fit_changes_scores_and_outputs_no_more_than_aligned) {
  // On the model's own terms: how far a converted one-layer model's attention scores
  // X̃ W̃_Qhᵀ W̃_K,kv(h) X̃ᵀ and head outputs X̃ W̃_V,kv(h)ᵀ Wo_hᵀ move from the MHA model's, summed
  // over query heads h and calibration tokens. aligned-fit folds the same rotations as aligned into
  // the query heads and output slices, and then picks the merged K/V that minimise exactly these
  // sums; aligned's mean is one candidate, so aligned-fit can only be lower or equal (rounding aside).
  for (bool bias : {false, true})
    for (int64_t G : {2, 1}) {
      const auto model = one_layer_random_attention(bias, 11, 700);
      GPT& m = *model;
      const std::vector<Index> data = some_batches();
      const Calibration c = calibrate(m, data);
      const std::vector<std::vector<double>> X = augmented_inputs(m, data);
      const int64_t hd = 2, n = static_cast<int64_t>(X.size());
      // per token, query head h: q (hd), the K and V of h's kv head (hd each), and Wo_h v (8)
      struct Acts {
        std::vector<double> q, k, o;
      };
      auto acts = [&](const GPT& g) {
        const Attention& at = *g.blocks[0]->attn;
        const int64_t rep = 4 / g.config().n_kv_head;
        auto row = [&](const Linear& l, int64_t r, const std::vector<double>& x) {
          double s = l.bias.defined() ? double(l.bias.val()[r]) : 0.0;
          for (int64_t j = 0; j < 8; j++) s += double(l.weight.val()[r * 8 + j]) * x[j];
          return s;
        };
        const Tensor& wo = at.wo->weight.val();
        Acts a{std::vector<double>(n * 4 * hd), std::vector<double>(n * 4 * hd), std::vector<double>(n * 4 * 8)};
        for (int64_t t = 0; t < n; t++)
          for (int64_t h = 0; h < 4; h++) {
            const int64_t kv = h / rep;
            double v[2];
            for (int64_t i = 0; i < hd; i++) {
              a.q[(t * 4 + h) * hd + i] = row(*at.wq, h * hd + i, X[t]);
              a.k[(t * 4 + h) * hd + i] = row(*at.wk, kv * hd + i, X[t]);
              v[i] = row(*at.wv, kv * hd + i, X[t]);
            }
            for (int64_t o = 0; o < 8; o++) a.o[(t * 4 + h) * 8 + o] = wo[o * 8 + h * hd] * v[0] + wo[o * 8 + h * hd + 1] * v[1];
          }
        return a;
      };
      const Acts ref = acts(m);
      auto change = [&](const GPT& g, double& scores, double& outputs) {
        const Acts a = acts(g);
        scores = outputs = 0;
        for (int64_t h = 0; h < 4; h++)
          for (int64_t t = 0; t < n; t++)
            for (int64_t u = 0; u < n; u++) {
              double s0 = 0, s1 = 0;
              for (int64_t i = 0; i < hd; i++)
                s0 += ref.q[(t * 4 + h) * hd + i] * ref.k[(u * 4 + h) * hd + i],
                    s1 += a.q[(t * 4 + h) * hd + i] * a.k[(u * 4 + h) * hd + i];
              scores += (s1 - s0) * (s1 - s0);
            }
        for (size_t e = 0; e < ref.o.size(); e++) outputs += (a.o[e] - ref.o[e]) * (a.o[e] - ref.o[e]);
      };
      double s_al, o_al, s_af, o_af, s_mean, o_mean;
      change(*convert_kv_heads(m, G, by("aligned", &c)), s_al, o_al);
      change(*convert_kv_heads(m, G, by("aligned-fit", &c)), s_af, o_af);
      change(*convert_kv_heads(m, G, by("mean")), s_mean, o_mean);
      const std::string what = std::string(bias ? "bias" : "no bias") + " G=" + std::to_string(G);
      BOOST_TEST(s_af <= s_al * (1 + 1e-5), what << ": score change, aligned-fit " << s_af << " vs aligned " << s_al);
      BOOST_TEST(o_af <= o_al * (1 + 1e-5), what << ": output change, aligned-fit " << o_af << " vs aligned " << o_al);
      BOOST_TEST(s_af < s_mean, what << ": score change, aligned-fit " << s_af << " vs mean " << s_mean);
      BOOST_TEST(o_af < o_mean, what << ": output change, aligned-fit " << o_af << " vs mean " << o_mean);
      BOOST_TEST(s_af > 0.0);  // random heads cannot be merged exactly: the comparison means something
    }
}

BOOST_AUTO_TEST_CASE(fit_beats_mean_at_alpha_0_on_a_trained_model) {
  TempDir d;
  TrainOptions quiet;
  quiet.quiet = true;
  quiet.final_eval = false;
  TrainConfig pre = tiny_train(150);  // past the unigram plateau, where heads start to matter
  pre.model.n_kv_head = 4;
  pre.model.dropout = 0;
  pre.batch_size = 16;
  pre.lr_decay_iters = 150;
  pre.eval_interval = 150;
  pre.log_interval = 150;
  tapelm::train(pre, shakespeare(), d / "mha", quiet);
  std::unique_ptr<GPT> m = load_model(d / "mha/checkpoint.h5").model;
  // evaluation windows = calibration windows
  const TokenSeq& val = shakespeare().val;
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + 17 <= 64 * 16; s += 16) starts.push_back(s);
  EvalBatches eb(val, starts, 16, 32);
  std::vector<Index> calib_batches;
  for (size_t i = 0; i < eb.size(); i++) {
    Index x, y;
    eb.fill(i, x, y);
    calib_batches.push_back(x);
  }
  const Calibration c = calibrate(*m, calib_batches);
  const double mha = evaluate(*m, eb).loss;
  for (int64_t G : {2, 1}) {
    std::map<std::string, double> loss;
    for (const std::string& method : all_methods)
      loss[method] = evaluate(*convert_kv_heads(*m, G, by(method, &c)), eb).loss;
    BOOST_TEST_MESSAGE("G=" << G << ": MHA " << mha << ", fit " << loss["fit"] << ", mean " << loss["mean"]
                            << ", mean-norm " << loss["mean-norm"] << ", aligned " << loss["aligned"] << ", first "
                            << loss["first"]);
    BOOST_TEST(loss["fit"] <= loss["mean"], "G=" << G << ": MHA " << mha << ", fit " << loss["fit"] << ", mean "
                                                 << loss["mean"] << ", mean-norm " << loss["mean-norm"] << ", aligned "
                                                 << loss["aligned"] << ", first " << loss["first"]);
  }
}

BOOST_AUTO_TEST_CASE(conversion_reproduces_the_reference) {
  H5File f = H5File::open_read(parity_fixture("convert_mha.h5"));
  GPT src(read_model_config(f));
  read_model_weights(f, src);
  Index x, y;
  Shape s;
  std::vector<int32_t> tok = f.read_ints("/tokens", &s);
  x.shape = y.shape = {s[0], s[1] - 1};
  for (int64_t b = 0; b < s[0]; b++)
    for (int64_t t = 0; t + 1 < s[1]; t++) x.data.push_back(tok[b * s[1] + t]), y.data.push_back(tok[b * s[1] + t + 1]);
  for (auto [method, G] : {std::pair{"mean", 2}, std::pair{"mean", 1}, std::pair{"first", 2}}) {
    const std::string g = std::string("/expected/convert/") + method + "_kv" + std::to_string(G);
    auto out = convert_kv_heads(src, G, by(method));
    BOOST_TEST(out->config().n_kv_head == G);
    for (const auto& [name, p] : out->named_parameters())
      BOOST_TEST(p.val().to_vector() == f.read_tensor(g + "/model/" + name).to_vector(), tt::per_element());
    NoGrad ng;
    const double loss = out->loss(x, y).item(), want = f.read_attr_double(g, "loss");
    BOOST_TEST(std::fabs(loss - want) / want < 1e-5, method << " kv" << G << ": loss " << loss << " vs " << want);
  }
}

BOOST_AUTO_TEST_CASE(equal_heads_convert_with_unchanged_outputs) {
  for (int64_t G : {2, 1}) {
    GPTConfig c{.vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 4, .n_kv_head = 4, .n_embd = 16,
                .mlp_hidden = 32, .bias = true};
    GPT m(c, 3);
    const int64_t rep = 4 / G;
    for (auto& [name, p] : m.named_parameters()) {
      if (name.find(".attn.wk.") == std::string::npos && name.find(".attn.wv.") == std::string::npos) continue;
      Tensor& t = p.val();
      t = randn(t.shape(), 77 + t.numel(), 0.3f);
      const int64_t block = t.numel() / 4;  // one head's rows
      for (int64_t h = 0; h < 4; h++) std::copy(t.data() + (h / rep) * rep * block, t.data() + ((h / rep) * rep + 1) * block, t.data() + h * block);
    }
    Index ids({1, 5, 2, 7, 3, 3, 9, 12, 0, 4, 6, 8, 10, 11, 2, 1}, {2, 8});
    NoGrad ng;
    Tensor before = m.forward(ids).val();
    for (const char* method : {"mean", "first"}) {
      auto out = convert_kv_heads(m, G, by(method));
      Tensor after = out->forward(ids).val();
      double worst = 0;
      for (int64_t i = 0; i < after.numel(); i++) worst = std::max(worst, double(std::fabs(after[i] - before[i])));
      BOOST_TEST(worst < 1e-6, method << " G=" << G << ": max |diff| " << worst);
    }
  }
}

BOOST_AUTO_TEST_CASE(conversion_identity_random_and_errors) {
  std::unique_ptr<GPT> m = load_model(parity_fixture("gqa.h5")).model;
  auto same = convert_kv_heads(*m, 2, by("mean"));
  auto a = m->named_parameters(), b = same->named_parameters();
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(a[i].second.val().to_vector() == b[i].second.val().to_vector());
  auto r = convert_kv_heads(*m, 1, by("random", nullptr, 5));
  const Tensor& wk = r->blocks[0]->attn->wk->weight.val();
  double s2 = 0;
  for (int64_t i = 0; i < wk.numel(); i++) s2 += double(wk[i]) * wk[i];
  BOOST_TEST(std::sqrt(s2 / wk.numel()) == 0.02, tt::tolerance(0.15));
  BOOST_CHECK_EXCEPTION(convert_kv_heads(*m, 3, by("mean")), Error, is_kind(ErrorKind::config));
  BOOST_CHECK_EXCEPTION(convert_kv_heads(*m, 4, by("mean")), Error, is_kind(ErrorKind::config));  // 2 -> 4 is not a pooling
  BOOST_CHECK_EXCEPTION(method("median"), Error, is_kind(ErrorKind::usage));
  BOOST_CHECK_EXCEPTION(convert_kv_heads(*m, 1, by("fit")), Error, is_kind(ErrorKind::usage));
  TempDir d;
  const std::string from = "convert --from " + parity_fixture("gqa.h5");
  for (const auto& [args, part] : std::vector<std::pair<std::string, std::string>>{
           {" --kv-heads 3", "cannot convert 2 kv heads to 3"},
           {" --kv-heads 1 --method median", "--method: median not in {mean,first,random"},
           {" --kv-heads 1 --grouping best", "--grouping: best not in {contiguous,similar,per-layer}"},
           {" --kv-heads 2,x", "--kv-heads: \"x\" is not a positive count of key/value heads"},
           {" --kv-budget 1 --calib " + fixture_path("tiny.txt") + " --calib-tokens 64", "a KV budget of 1 heads: the layers take between"},
           {"", "convert: give --kv-heads or --kv-budget"},
           {" --kv-heads 1 --method aligned", "--calib: converting by"},
           {" --kv-heads 1 --grouping similar", "--calib: converting by"},
           {" --kv-heads 1 --method fit --calib " + fixture_path("tiny.txt") + " --calib-tokens 100000",
            "fewer than the 100000 calibration tokens"},
           {" --kv-heads 1 --method fit --calib " + (d / "missing.txt"), "missing.txt"}}) {
    Run bad = run_cli(from + args + " --out " + (d / "never.h5"));
    expect_error(bad, part);
    BOOST_TEST(!fs::exists(d / "never.h5"), args);
  }
  BOOST_TEST(d.listing().empty());
  // with calibration: written, and the loss stays finite
  Run ok = run_cli(from + " --kv-heads 1 --method fit --grouping similar --calib " + fixture_path("tiny.txt") +
                   " --calib-tokens 64 --out " + (d / "fit.h5"));
  BOOST_TEST(ok.code == 0, ok.err);
  BOOST_TEST(ok.out.find("by fit (similar groups, calibrated on 64 tokens)") != std::string::npos, ok.out);
  BOOST_TEST(load_model(d / "fit.h5").model->config().n_kv_head == 1);
}

// convert holds one block at a time; the in-memory conversion (what the sweep and a distilling
// uptrain run) holds the whole model; uptrain otherwise streams the blocks into a model in memory. Same source, same calibration windows and seed: the same bits, for every
// method and grouping, from every format (a Llama with RoPE read from an HF directory and a
// checkpoint; GPT-2s with learned positions, biases and fused q|k|v from a GGUF file and an HF
// directory), to 2 and 1 kv heads.
BOOST_AUTO_TEST_CASE(streamed_conversion_equals_the_in_memory_one_bit_for_bit) {
  TempDir d;
  tapelm::hf::import_model(fixture_path("hf/llama_mha_f32"), d / "llama.h5");
  tapelm::gguf::export_model(formats::open_model(fixture_path("gguf/gpt2_gpt2mini.h5")), d / "gpt2.gguf", WeightType::f32);
  const std::vector<std::string> sources{fixture_path("hf/llama_mha_f32"), d / "llama.h5", d / "gpt2.gguf",
                                         fixture_path("hf/gpt2_hub_layout")};
  std::vector<int32_t> ids(600);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>((i * 37 + i / 7) % 300);
  write_token_file(d / "calib.bin", ids);
  for (const std::string& from : sources) {
    const formats::OpenedModel opened = formats::open_model(from);
    const std::unique_ptr<GPT> whole = opened.load();
    for (const char* m : {"mean", "first", "random", "mean-norm", "aligned", "fit", "aligned-fit"})
      for (const char* g : {"contiguous", "similar"})
        for (const int64_t G : {int64_t{2}, int64_t{1}}) {
          BOOST_TEST_CONTEXT(from << ", " << m << ", " << g << ", " << G << " kv heads") {
            const ConvertRequest r{.from = from, .out = d / "streamed.h5", .kv_heads = {G},
                                   .variant = {&tapelm::method(m), enum_from_name<Grouping>(g, "grouping")},
                                   .calib = d / "calib.bin", .calib_tokens = 64, .seed = 3};
            const ConvertModelResult res = convert_model(r);
            const Variant v{&tapelm::method(m), enum_from_name<Grouping>(g, "grouping")};
            CalibrationSource cs{.tokens = 64, .seed = 3, .what = r.calib};
            const EvalData data = load_eval_data(r.calib, "train", whole->config(), nullptr);
            cs.ids = data.ids;
            for (const auto& b : data.ready) cs.batches.push_back(b.first);
            const Converted in_memory = calibrate_and_convert(*whole, G, v, 3, cs);
            BOOST_TEST(res.calib_tokens == in_memory.calib_tokens);
            const LoadedModel streamed = load_model(d / "streamed.h5");
            BOOST_TEST((streamed.model->config() == in_memory.model->config()));
            const auto a = streamed.model->named_parameters(), b = in_memory.model->named_parameters();
            BOOST_TEST_REQUIRE(a.size() == b.size());
            for (size_t i = 0; i < a.size(); i++) BOOST_TEST(same_bits(a[i].second.val(), b[i].second.val()), a[i].first);
            // streamed into memory (what uptrain converts with when the source teaches nothing)
            const Converted kept = convert_streamed_in_memory(from, G, v, 3, cs);
            BOOST_TEST(kept.calib_tokens == in_memory.calib_tokens);
            BOOST_TEST((kept.model->config() == in_memory.model->config()));
            BOOST_TEST(kept.model->dropout_rng().state() == in_memory.model->dropout_rng().state());
            const auto k = kept.model->named_parameters();
            BOOST_TEST_REQUIRE(k.size() == b.size());
            for (size_t i = 0; i < k.size(); i++) BOOST_TEST(same_bits(k[i].second.val(), b[i].second.val()), k[i].first);
            // each block narrowed as it is filled (uptrain's frozen weights, here every block
            // matrix in bf16): the same values rounded to bf16, and the narrowed ones hold no float32
            if (std::string(m) == "mean" || std::string(m) == "aligned-fit") {
              const Converted narrow = convert_streamed_in_memory(from, G, v, 3, cs, [](const std::string&, const Tensor& t) {
                return t.ndim() == 2 ? WeightType::bf16 : WeightType::f32;
              });
              const auto held = std::dynamic_pointer_cast<NarrowedBlocks>(narrow.model->residency);
              BOOST_TEST_REQUIRE(held != nullptr);
              const auto n = narrow.model->named_parameters();
              int64_t narrowed = 0;
              for (size_t i = 0; i < n.size(); i++) {
                const bool matrix = n[i].first.rfind("blocks.", 0) == 0 && b[i].second.shape().size() == 2;
                BOOST_TEST(held->holds(n[i].second) == matrix, n[i].first);
                BOOST_TEST(n[i].second.val().defined() == !matrix, n[i].first);
                Tensor want = b[i].second.val().clone();
                if (matrix) {  // round to nearest even through bf16, as a narrowing does
                  std::vector<uint16_t> bits(static_cast<size_t>(want.numel()));
                  narrow_values(WeightType::bf16, bits.data(), want.data(), want.numel());
                  widen_values(WeightType::bf16, want.data(), bits.data(), want.numel());
                  narrowed += want.numel();
                }
                BOOST_TEST(same_bits(held->value(n[i].second), want), n[i].first);
              }
              BOOST_TEST(held->values() == narrowed);
            }
            // with windows drawn from the ids by the seed (as uptrain calibrates on its train split)
            const CalibrationSource drawn{.ids = data.ids, .tokens = 64, .seed = 5, .what = r.calib};
            const Converted drawn_mem = calibrate_and_convert(*whole, G, v, 3, drawn), drawn_kept = convert_streamed_in_memory(from, G, v, 3, drawn);
            BOOST_TEST(drawn_kept.calib_tokens == drawn_mem.calib_tokens);
            const auto dm = drawn_mem.model->named_parameters(), dk = drawn_kept.model->named_parameters();
            BOOST_TEST_REQUIRE(dk.size() == dm.size());
            for (size_t i = 0; i < dk.size(); i++) BOOST_TEST(same_bits(dk[i].second.val(), dm[i].second.val()), dk[i].first);
          }
        }
  }
}

// ---- KV heads per layer ---------------------------------------------------------------------------

// A per-layer target converts each layer as the uniform conversion to its count converts it, in
// memory and streamed (bit for bit), and a budget's allocation is what it says.
BOOST_AUTO_TEST_CASE(per_layer_targets_convert_each_layer_as_the_uniform_conversion_does) {
  const auto m = busy_model(PosKind::Rope, true);  // 2 layers, 4 kv heads
  const Calibration c = calibrate(*m, some_batches());
  for (const char* v : {"mean", "fit", "aligned-fit", "mean+similar"}) {
    BOOST_TEST_CONTEXT(v) {
      const auto both = convert_kv_heads(*m, std::vector<int64_t>{2, 1}, by(v, &c));
      BOOST_TEST(both->config().kv_heads_str() == "2,1");
      const auto two = convert_kv_heads(*m, 2, by(v, &c)), one = convert_kv_heads(*m, 1, by(v, &c));
      const auto pb = both->named_parameters(), p2 = two->named_parameters(), p1 = one->named_parameters();
      for (size_t i = 0; i < pb.size(); i++) {
        const std::string& n = pb[i].first;
        const auto& want = n.rfind("blocks.1.", 0) == 0 ? p1[i] : p2[i];  // names match: same order
        BOOST_TEST(n == want.first);
        BOOST_TEST(same_bits(pb[i].second.val(), want.second.val()), n);
      }
    }
  }
  expect_throw([&] { convert_kv_heads(*m, std::vector<int64_t>{3, 1}, by("mean")); }, ErrorKind::config,
               {"cannot convert 4 kv heads to 3 in layer 0"});
  expect_throw([&] { convert_kv_heads(*m, std::vector<int64_t>{2, 2, 2}, by("mean")); }, ErrorKind::config, {"the model has 2 layers"});
  // a per-layer model converts on: layer 0's 2 heads to 1, layer 1 keeps its 1
  const auto again = convert_kv_heads(*convert_kv_heads(*m, std::vector<int64_t>{2, 1}, by("mean")), 1, by("mean"));
  BOOST_TEST(!again->config().per_layer_kv());
  BOOST_TEST(again->config().n_kv_head == 1);

  // a layer's cost is its definition: the windows' loss with that layer alone converted, less the source's
  const std::vector<Index> windows = some_batches();
  const ModelLoss on_windows = [&](GPT& g) { return next_token_loss(g, windows); };
  const std::vector<std::map<int64_t, double>> costs = layer_costs(*m, Variant::parse("fit"), &c, on_windows);
  BOOST_TEST_REQUIRE(costs.size() == 2u);
  m->eval();
  const double base = loss_on(*m, windows);
  for (int64_t l = 0; l < 2; l++) {
    BOOST_TEST(costs[l].size() == 3u);  // 1, 2 and its own 4
    BOOST_TEST(costs[l].at(4) == 0.0);
    for (int64_t g : {1, 2}) {
      std::vector<int64_t> heads{4, 4};
      heads[l] = g;
      const auto one = convert_kv_heads(*m, heads, by("fit", &c));
      one->eval();
      const double want = loss_on(*one, windows) - base;
      BOOST_TEST(std::fabs(costs[l].at(g) - want) < 1e-6, "layer " << l << ", " << g << " heads: " << costs[l].at(g) << " vs " << want);
    }
  }
  // and the allocation is the least summed cost under the budget (checked against every choice below)
  BOOST_TEST(kv_budget_heads(*m, 5, Variant::parse("fit"), &c, on_windows) == allocate_kv_heads(costs, 5), tt::per_element());
  expect_throw([&] { kv_budget_heads(*m, 9, Variant::parse("mean"), &c, on_windows); }, ErrorKind::usage,
               {"a KV budget of 9 heads: the layers take between 2 (the fewest each allows) and 8 (all they have)"});
  expect_throw([&] { kv_budget_heads(*m, 4, Variant::parse("random"), &c, on_windows); }, ErrorKind::usage, {"fresh init"});

  // streamed equals in memory: a list, a budget, and per-layer grouping (its one count's budget)
  TempDir d;
  save_model(d / "m.h5", *m);
  std::vector<int32_t> ids(200);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>((i * 7 + i * i) % 13);
  write_token_file(d / "calib.bin", ids);
  for (const auto& [target, grouping] : std::vector<std::pair<KvTarget, std::string>>{
           {{.heads = {2, 1}}, "contiguous"}, {{.budget = 5}, "contiguous"}, {{.heads = {2}}, "per-layer"}}) {
    BOOST_TEST_CONTEXT(grouping << ", budget " << target.budget) {
      const ConvertRequest r{.from = d / "m.h5", .out = d / "s.h5", .kv_heads = target.heads, .kv_budget = target.budget,
                             .variant = {&method("aligned-fit"), enum_from_name<Grouping>(grouping, "grouping")}, .calib = d / "calib.bin", .calib_tokens = 64, .seed = 3};
      const ConvertModelResult res = convert_model(r);
      CalibrationSource cs{.tokens = 64, .seed = 3, .what = r.calib};
      cs.ids = load_eval_data(r.calib, "train", m->config(), nullptr).ids;
      const Converted in_memory = calibrate_and_convert(*m, target, Variant{&method("aligned-fit"), enum_from_name<Grouping>(grouping, "grouping")}, 3, cs);
      const LoadedModel streamed = load_model(d / "s.h5");
      BOOST_TEST((streamed.model->config() == in_memory.model->config()));
      BOOST_TEST(res.kv_heads.size() == (in_memory.model->config().per_layer_kv() ? 2u : 1u));
      int64_t total = 0;
      for (int64_t l = 0; l < 2; l++) total += in_memory.model->config().kv_heads(l);
      BOOST_TEST(total <= (target.budget ? target.budget : 4));
      const auto a = streamed.model->named_parameters(), b = in_memory.model->named_parameters();
      BOOST_TEST_REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); i++) BOOST_TEST(same_bits(a[i].second.val(), b[i].second.val()), a[i].first);
    }
  }
}

// The allocation is the exact minimum: against every choice of counts, on random costs.
BOOST_AUTO_TEST_CASE(kv_budget_allocation_is_the_least_cost_choice) {
  Rng rng(11);
  for (int trial = 0; trial < 20; trial++) {
    std::vector<std::map<int64_t, double>> costs(4);
    for (auto& layer : costs)
      for (int64_t g : {1, 2, 4}) layer[g] = rng.uniform() * (5.0 - static_cast<double>(g));
    for (int64_t B = 4; B <= 16; B++) {
      const std::vector<int64_t> got = allocate_kv_heads(costs, B);
      double got_cost = 0, best = INFINITY;
      int64_t used = 0;
      for (size_t l = 0; l < 4; l++) got_cost += costs[l].at(got[l]), used += got[l];
      const int64_t choice[] = {1, 2, 4};
      for (int code = 0; code < 81; code++) {  // every assignment of {1, 2, 4} to the 4 layers
        double cost = 0;
        int64_t heads = 0;
        for (int l = 0, k = code; l < 4; l++, k /= 3) cost += costs[l].at(choice[k % 3]), heads += choice[k % 3];
        if (heads <= B) best = std::min(best, cost);
      }
      BOOST_TEST(used <= B);
      BOOST_TEST(got_cost == best, tt::tolerance(1e-12));
    }
  }
  expect_throw([&] { allocate_kv_heads(std::vector<std::map<int64_t, double>>(4, {{1, 0.0}, {2, 0.0}}), 9); }, ErrorKind::usage,
               {"a KV budget of 9 heads: the layers take between 4 (the fewest each allows) and 8 (all they have)"});
}

// A BF16 source converts to a BF16 checkpoint (stored as 16-bit bits with an encoding attribute,
// widened when read): each weight is the in-memory conversion's rounded to bf16 (round to nearest
// even, as float16.h's f32_to_bf16 and PyTorch's .to(torch.bfloat16)); --dtype f32 keeps them all.
BOOST_AUTO_TEST_CASE(a_16_bit_source_converts_to_a_16_bit_checkpoint) {
  TempDir d;
  const std::string from = fixture_path("hf/llama_gqa_bf16_spm");
  const formats::OpenedModel opened = formats::open_model(from);
  BOOST_TEST(opened.dtypes == "BF16");
  const std::unique_ptr<GPT> whole = opened.load();
  const Converted mem = calibrate_and_convert(*whole, 1, {&tapelm::method("mean"), Grouping::Contiguous}, 0, {});
  for (const char* dtype : {"", "f32", "f16"}) {
    BOOST_TEST_CONTEXT("--dtype " << dtype) {
      const ConvertModelResult r =
          convert_model({.from = from, .out = d / "c.h5", .kv_heads = {1}, .dtype = *dtype ? std::optional(wt(dtype)) : std::nullopt});
      BOOST_TEST(to_string(r.dtype) == (*dtype ? dtype : "bf16"));
      const LoadedModel back = load_model(d / "c.h5");
      BOOST_TEST(back.tok.has_value());
      const auto a = back.model->named_parameters(), b = mem.model->named_parameters();
      BOOST_TEST_REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); i++) {
        const Tensor& x = a[i].second.val();
        const Tensor& y = b[i].second.val();
        bool same = x.numel() == y.numel();
        for (int64_t j = 0; same && j < x.numel(); j++) {
          const float want = r.dtype == WeightType::bf16 ? bf16_to_f32(f32_to_bf16(y[j])) : r.dtype == WeightType::f16 ? f16_to_f32(f32_to_f16(y[j])) : y[j];
          same = std::memcmp(x.data() + j, &want, 4) == 0;
        }
        BOOST_TEST(same, a[i].first);
      }
    }
  }
  // f16 cannot hold 1e5: refused naming the tensor, nothing written
  LoadedModel big = load_model(d / "c.h5");
  big.model->named_parameters().back().second.val()[0] = 1e5f;
  write_converted(d / "big.h5", *big.model, big.tok ? &*big.tok : nullptr, "{}");
  fs::remove(d / "c.h5");
  // named by --out, not by the temporary file it was written as
  const Run f16 = run_cli("convert --from " + (d / "big.h5") + " --kv-heads 1 --dtype f16 --out " + (d / "c.h5"));
  expect_error(f16, (d / "c.h5") + ": /model/");
  expect_error(f16, "beyond f16's range");
  BOOST_TEST(f16.err.find(".tmp.") == std::string::npos, f16.err);
  // a finite weight of 3e38 overflows the calibration forward: the calibrating methods refuse it
  // naming the file, the layer and the method (was "la::svd: LAPACK failed (info -5), NaN in the
  // matrix?"); uptrain's in-memory conversion runs the same convert_attention
  for (auto& [n, q] : whole->named_parameters())
    if (n == "blocks.0.ln1.weight") q.val().fill(3e38f);  // x·3e38 at the attention's input: its Gram matrix overflows
  write_converted(d / "big.h5", *whole, opened.tok ? &*opened.tok : nullptr, "{}");
  for (const char* m : {"aligned-fit", "fit", "aligned"}) {
    const Run r = run_cli("convert --from " + (d / "big.h5") + " --kv-heads 1 --method " + m + " --calib " + fixture_path("tiny.txt") +
                          " --calib-tokens 64 --out " + (d / "c.h5"));
    expect_error(r, (d / "big.h5") + ": layer 0: converting by " + m);
    expect_error(r, "calibration activations at the attention's input are not finite");
    BOOST_TEST(!fs::exists(d / "c.h5"));
  }
  BOOST_TEST(!fs::exists(d / "c.h5"));
}

namespace {
// Every file of directory a (ignoring dot-files: the lock) equals b's, and neither has another.
void expect_same_directory(const std::string& a, const std::string& b, const std::string& what) {
  std::set<std::string> na, nb;
  for (const auto& e : fs::directory_iterator(a))
    if (e.path().filename().string()[0] != '.') na.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b))
    if (e.path().filename().string()[0] != '.') nb.insert(e.path().filename().string());
  BOOST_TEST((na == nb), what << ": the directories hold other files");
  for (const std::string& n : na)
    if (nb.count(n)) BOOST_TEST((file_bytes(a + "/" + n) == file_bytes(b + "/" + n)), what << ": " << n << " differs");
}
}  // namespace

// convert --format hf|gguf streams the converted blocks into the shards and the GGUF file: the
// same bytes `export` writes from the converted checkpoint, for every dtype each format holds.
// What a format cannot hold is refused before any work, and nothing is written.
BOOST_AUTO_TEST_CASE(converting_to_hf_and_gguf_writes_what_exporting_the_converted_checkpoint_writes) {
  TempDir d;
  std::vector<int32_t> ids(600);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>((i * 37 + i / 7) % 300);
  write_token_file(d / "calib.bin", ids);
  fs::create_directories(d / "ckpt");
  fs::create_directories(d / "conv");
  fs::create_directories(d / "exp");
  for (const std::string from : {fixture_path("hf/llama_mha_f32"), fixture_path("gguf/llama_spm.h5"), fixture_path("gguf/qwen2_qwen2mini.h5"),
                                 fixture_path("hf/phi3_gqa_f32"), fixture_path("hf/gptneox_mha_f32"), fixture_path("hf/qwen3_gqa_f32"),
                                 fixture_path("hf/olmo2_mha_f32"), fixture_path("hf/gemma_mha_f32")})
    for (const char* m : {"mean", "aligned-fit"}) {
      if ((from.ends_with("qwen3_gqa_f32") || from.ends_with("olmo2_mha_f32")) && std::string(m) != "mean") {
        // q/k norms: the rotations and merges act before k_norm's weight, which neither commutes with
        expect_throw([&] { convert_model({.from = from, .out = d / "ckpt/q3.h5", .kv_heads = {1}, .variant = {&method(m)}, .calib = d / "calib.bin",
                                          .calib_tokens = 64, .seed = 3, .dtype = WeightType::f32}); },
                     ErrorKind::usage, {"conversion aligned-fit with qk_norm", "convert by mean"});
        BOOST_TEST(!fs::exists(d / "ckpt/q3.h5"));
        continue;
      }
      const ConvertRequest base{.from = from, .out = d / "ckpt/m.h5", .kv_heads = {1}, .variant = {&method(m)}, .calib = d / "calib.bin", .calib_tokens = 64,
                                .seed = 3, .dtype = WeightType::f32};
      convert_model(base);
      // GPT-NeoX's HF config has one K/V head per query head: its conversions go to GGUF (llama.cpp's
      // gptneox sizes attn_qkv by head_count_kv) or stay checkpoints
      const bool neox = from.ends_with("gptneox_mha_f32");
      if (neox) {
        ConvertRequest r = base;
        r.out = d / "hf_neox", r.format = "hf";
        expect_throw([&] { convert_model(r); }, ErrorKind::config, {"1 key/value heads for 4 query heads: GPTNeoXForCausalLM has no HF config"});
        BOOST_TEST(!fs::exists(d / "hf_neox"));
      }
      for (const char* dtype : neox ? std::vector<const char*>{} : std::vector<const char*>{"f32", "bf16", "f16"}) {
        BOOST_TEST_CONTEXT(from << ", " << m << ", hf " << dtype) {
          ConvertRequest r = base;
          r.out = d / "hf_conv", r.dtype = wt(dtype), r.format = "hf";
          convert_model(r);
          tapelm::hf::export_model(formats::open_model(d / "ckpt/m.h5"), d / "hf_exp", wt(dtype));
          expect_same_directory(d / "hf_conv", d / "hf_exp", "hf " + std::string(dtype));
          // a converted Phi-3 is still written as Phi-3 (its config keeps the family)
          BOOST_TEST(tapelm::hf::read_config(d / "hf_conv/config.json").architecture ==
                     (from.ends_with("phi3_gqa_f32") ? "Phi3ForCausalLM" : from.ends_with("qwen2mini.h5") ? "Qwen2ForCausalLM"
                      : from.ends_with("qwen3_gqa_f32") ? "Qwen3ForCausalLM" : from.ends_with("olmo2_mha_f32") ? "Olmo2ForCausalLM"
                      : from.ends_with("gemma_mha_f32") ? "GemmaForCausalLM" : "LlamaForCausalLM"));
        }
      }
      if (!formats::open_model(from).tok) continue;  // llama.cpp needs the vocabulary (refused below)
      for (const char* dtype : {"f32", "f16", "bf16", "q8_0"}) {
        BOOST_TEST_CONTEXT(from << ", " << m << ", gguf " << dtype) {
          ConvertRequest r = base;
          r.out = d / "conv/m.gguf", r.dtype = wt(dtype), r.format = "gguf";  // general.name is the stem: "m" in both
          convert_model(r);
          tapelm::gguf::export_model(formats::open_model(d / "ckpt/m.h5"), d / "exp/m.gguf", wt(dtype));
          BOOST_TEST((file_bytes(d / "conv/m.gguf") == file_bytes(d / "exp/m.gguf")));
        }
      }
    }
  const std::string cmd = "convert --kv-heads 2 --method aligned-fit --calib " + (d / "calib.bin") + " --out " + (d / "refused");
  expect_error(run_cli(cmd + " --from " + fixture_path("hf/llama_mha_f32") + " --format gguf"), "has no tokenizer");
  expect_error(run_cli(cmd + " --from " + fixture_path("gguf/gpt2_gpt2mini.h5") + " --format hf"), "has no HF config with fewer KV heads");
  expect_error(run_cli(cmd + " --from " + fixture_path("gguf/llama_spm.h5") + " --dtype q8_0"), "only --format gguf holds q8_0");
  BOOST_TEST(!fs::exists(d / "refused"));
}

// SIGKILL at seeded moments of a streamed conversion into an HF directory (and a GGUF file)
// that already holds an earlier conversion: what is left is the old output or the new, byte
// for byte, never a mixture or a partial file.
BOOST_AUTO_TEST_CASE(a_killed_streamed_conversion_leaves_the_old_output_or_the_new,
                     *boost::unit_test::precondition(test::release_binary)) {
  TempDir d;
  LoadedModel spm = load_model(fixture_path("gguf/llama_spm.h5"));
  GPTConfig c = spm.model->config();
  c.n_layer = 6, c.n_embd = 256, c.n_head = 4, c.n_kv_head = 4, c.mlp_hidden = 768;
  GPT big(c);
  write_converted(d / "big.h5", big, &*spm.tok, "{}");
  std::vector<int32_t> ids(20000);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>((i * 37 + i / 7) % 500);
  write_token_file(d / "calib.bin", ids);
  auto cmd = [&](int kv, const std::string& format, const std::string& out) {
    return std::string(TAPELM_BINARY) + " convert --from " + (d / "big.h5") + " --kv-heads " + std::to_string(kv) +
           " --method aligned-fit --calib " + (d / "calib.bin") + " --calib-tokens 2048 --format " + format + " --out " + out;
  };
  for (const std::string format : {"hf", "gguf"}) {
    // in directories of their own: a GGUF file's general.name is its stem
    const std::string name = format == "hf" ? "/m" : "/m.gguf", old_out = d / ("old" + name), new_out = d / ("new" + name),
                      out = d / ("out" + name);
    for (const char* dir : {"old", "new", "out"}) fs::create_directories(d / dir);
    BOOST_TEST_REQUIRE(run_shell(cmd(1, format, old_out)).code == 0);
    const auto t0 = std::chrono::steady_clock::now();
    const Run ref = run_shell(cmd(2, format, new_out));
    const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST_REQUIRE(ref.code == 0, ref.err);
    BOOST_TEST_MESSAGE(format << ": the conversion takes " << ref_s << " s");
    std::mt19937_64 rng(format == "hf" ? 7 : 8);
    int killed = 0, old_left = 0;
    for (int k = 0; k < 5; k++) {
      fs::remove_all(out);
      if (format == "hf") link_tree(old_out, out);  // the earlier output as tapelm wrote it (its manifest's files)
      else fs::copy(old_out, out);
      char delay[32];
      std::snprintf(delay, sizeof delay, "%.3f", ref_s * 1.1 * static_cast<double>(rng() % 1000) / 1000.0);  // some after the end
      const Run kill = run_shell("{ " + cmd(2, format, out) + " >/dev/null 2>&1 & p=$!; sleep " + delay + "; kill -9 $p; wait $p; echo $?; }");
      killed += kill.out == "137\n";
      const std::string& like = format == "hf" ? (fs::exists(out + "/config.json") && slurp(out + "/config.json") == slurp(old_out + "/config.json") ? old_out : new_out)
                                               : (file_bytes(out) == file_bytes(old_out) ? old_out : new_out);
      old_left += like == old_out;
      BOOST_TEST_CONTEXT(format << ", kill " << k << " after " << delay << " s") {
        if (format == "hf") expect_same_directory(out, like, "the output");
        else BOOST_TEST((file_bytes(out) == file_bytes(like)));
      }
    }
    BOOST_TEST_MESSAGE(format << ": 5 kills, " << killed << " while running, " << old_left << " left the old output");
    BOOST_TEST(killed >= 3, "most kills must hit a running conversion");
    BOOST_TEST(old_left >= 1, "some kills must land before the commit");
  }
}

namespace {
// The MHA source of the uptraining tests: 40 steps of a 4-head tiny model, in d/mha.
TrainConfig pretrain_mha(const TempDir& d) {
  TrainOptions quiet;
  quiet.quiet = true;
  TrainConfig pre = tiny_train(40);
  pre.model.n_kv_head = 4;
  pre.model.dropout = 0;
  pre.lr_decay_iters = 40;
  tapelm::train(pre, shakespeare(), d / "mha", quiet);
  return pre;
}

UptrainOptions to_mqa() {
  UptrainOptions o;
  o.kv_heads = 1;
  o.fraction = 0.25;
  o.quiet = true;
  return o;
}

// Uptraining as o into d/<run>2, interrupted after its first step (a signal) and resumed, ends
// with the loss and the weights of d/<run> (`one_go`), uptrained in one go. Returns the resumed run's result.
UptrainResult expect_resume_equals_one_go(const TempDir& d, UptrainOptions o, const std::string& run, const UptrainResult& one_go) {
  const std::string again = run + "2";
  o.known_loss_before = 0;  // the conversion's loss is the one-go run's: not evaluated again
  o.stop = signal_stop_token();
  std::raise(SIGINT);
  uptrain(d / "mha/checkpoint.h5", shakespeare(), d / again, o);
  BOOST_TEST(H5File::open_read(d / (again + "/checkpoint.h5")).read_attr_int("/train", "step") == 1);
  o.stop.clear();
  o.resume = true;
  const UptrainResult resumed = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / again, o);
  BOOST_TEST(resumed.val_loss == one_go.val_loss);
  H5File a = H5File::open_read(d / (run + "/checkpoint.h5")), b = H5File::open_read(d / (again + "/checkpoint.h5"));
  for (const std::string& n : a.list_datasets_recursive("/model"))
    BOOST_TEST(a.read_tensor("/model/" + n).to_vector() == b.read_tensor("/model/" + n).to_vector(), n);
  return resumed;
}
}  // namespace

BOOST_AUTO_TEST_CASE(uptraining_lowers_the_loss_counts_steps_and_resumes) {
  TempDir d;
  const TrainConfig pre = pretrain_mha(d);
  UptrainOptions o = to_mqa();
  UptrainResult r = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "mqa", o);
  BOOST_TEST(r.steps == 10);  // 0.25 × 40
  BOOST_TEST(H5File::open_read(d / "mqa/checkpoint.h5").read_attr_int("/train", "step") == 10);
  BOOST_TEST(r.val_loss < r.loss_before, "uptrained " << r.val_loss << " vs converted " << r.loss_before);
  BOOST_TEST(r.config.model.n_kv_head == 1);
  // continue: the original run's final learning rate, constant
  TrainConfig cont = uptrain_config(pre, {.kv_heads = 2, .fraction = 0.1, .schedule = UptrainSchedule::Continue});
  BOOST_TEST(cont.max_iters == 4);
  BOOST_TEST(cont.learning_rate == lr_at(40, pre.schedule()));
  BOOST_TEST(!cont.decay_lr);
  // a given peak must be one: 0, -1 and NaN were taken silently as "not given" (5e-4 here)
  BOOST_TEST(uptrain_config(pre, {.kv_heads = 2, .lr = 2e-4}).learning_rate == 2e-4);
  BOOST_TEST(uptrain_config(pre, {.kv_heads = 2}).learning_rate == pre.learning_rate * 0.5);
  for (double bad : {0.0, -1.0, std::nan(""), double(INFINITY)})
    expect_throw([&] { uptrain_config(pre, {.kv_heads = 2, .lr = bad}); }, ErrorKind::usage, {"uptraining learning rate"});
  // interrupted after its first step (a signal), then resumed: the same weights as in one go
  expect_resume_equals_one_go(d, o, "mqa", r);
  // α = 0: convert and evaluate only
  o.fraction = 0;
  UptrainResult z = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "zero", o);
  BOOST_TEST(z.steps == 0);
  BOOST_TEST(z.val_loss == z.loss_before);
}

// uptrain --train kv|attention: only those parameters move. Every other weight of the result is
// the converted model's (uptrained for 0 steps) bit for bit, every trained one moved; the optimizer
// state is of the trained ones alone; an interrupted run resumes to one go's weights, and a resume
// that would train another set is refused in one line.
BOOST_AUTO_TEST_CASE(partial_uptraining_moves_only_its_parameters_and_resumes) {
  TempDir d;
  pretrain_mha(d);
  UptrainOptions o = to_mqa();
  o.known_loss_before = 0;
  o.fraction = 0;
  uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "converted", o);
  o.fraction = 0.25;
  const H5File converted = H5File::open_read(d / "converted/checkpoint.h5");
  for (const Trainable t : {Trainable::kv, Trainable::attention}) {
    o.trainable = t;
    const std::string run = to_string(t);
    const UptrainResult r = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / run, o);
    BOOST_TEST((r.config.trainable == t));
    const H5File f = H5File::open_read(d / (run + "/checkpoint.h5"));
    const std::vector<std::string> moments = f.list_datasets_recursive("/optim/exp_avg");
    auto has_moment = [&](const std::string& n) { return std::find(moments.begin(), moments.end(), n) != moments.end(); };
    int trained = 0, frozen = 0;
    for (const std::string& n : converted.list_datasets_recursive("/model")) {
      const bool same = f.read_tensor("/model/" + n).to_vector() == converted.read_tensor("/model/" + n).to_vector();
      if (is_trained(t, n)) {
        trained++;
        BOOST_TEST(!same, run << ": " << n << " is trained but did not move");
        BOOST_TEST(has_moment(n), n);
      } else {
        frozen++;
        BOOST_TEST(same, run << ": " << n << " is frozen but moved");
        BOOST_TEST(!has_moment(n), n);
      }
    }
    // 2 layers: k and v weights (no biases in this model); attention adds q and the output projection
    BOOST_TEST(trained == (t == Trainable::kv ? 4 : 8));
    BOOST_TEST(frozen > 0);
    BOOST_TEST(moments.size() == static_cast<size_t>(trained));
    if (t == Trainable::kv) expect_resume_equals_one_go(d, o, run, r);
  }
  o.resume = true;
  o.trainable = Trainable::all;
  test::expect_throw([&] { uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "kv", o); }, ErrorKind::checkpoint,
                     {"trained with trainable \"kv\", this run has \"all\""});
}

// One process, frozen_weights auto, a source whose weights are bf16 values (what a bf16 HF model
// reads as): uptrain's conversion narrows each block's frozen weights as it fills the block, the
// trainer takes them over as they are, and the final evaluation reads the checkpoint one block at
// a time narrowed again; the float32 model is never whole. Widening a bf16 value is exact and
// every block runs on its widened weights, so each --train kv | attention run is the frozen_weights
// f32 run bit for bit: the loss before and after, every weight and moment saved. So are α = 0 (its
// checkpoint written from the narrowed weights) and a run interrupted and resumed (the
// checkpoint's frozen weights read into the 16-bit ones a block at a time).
BOOST_AUTO_TEST_CASE(uptraining_from_16_bit_weights_holds_the_frozen_ones_narrowed_from_the_conversion_on) {
  TempDir d;
  TrainConfig pre = pretrain_mha(d);
  {  // the source's weights rounded to bf16 values, in place of the pretrained ones
    LoadedModel m = load_model(d / "mha/checkpoint.h5");
    for (auto& [name, p] : m.model->named_parameters()) {
      std::vector<uint16_t> bits(static_cast<size_t>(p.numel()));
      narrow_values(WeightType::bf16, bits.data(), p.val().data(), p.numel());
      widen_values(WeightType::bf16, p.val().data(), bits.data(), p.numel());
    }
    save_training_checkpoint(d / "mha/checkpoint.h5", *m.model, *pre.make_optimizer(m.model->named_parameters()), pre, TrainState{}, *m.tok);
  }
  // the loaded-back checkpoint, read narrowed: the float32 read's values, the frozen ones held in bf16
  {
    TrainConfig kv = pre;
    kv.trainable = Trainable::kv;
    const LoadedModel whole = load_model(d / "mha/checkpoint.h5"), held = load_model(d / "mha/checkpoint.h5", 4, frozen_weights_held_as(kv, 1));
    const auto narrowed = std::dynamic_pointer_cast<NarrowedBlocks>(held.model->residency);
    BOOST_TEST_REQUIRE(narrowed != nullptr);
    BOOST_TEST(narrowed->values() == frozen_block_params(kv).all);  // every frozen block weight: all are bf16 values
    BOOST_TEST(narrowed->inexact() == 0);
    const auto a = whole.model->named_parameters(), b = held.model->named_parameters();
    for (size_t i = 0; i < a.size(); i++) {
      BOOST_TEST(b[i].second.val().defined() == !is_frozen_block_parameter(kv, a[i].first), a[i].first);
      BOOST_TEST(same_bits(narrowed->value(b[i].second), a[i].second.val()), a[i].first);
    }
  }
  UptrainOptions o = to_mqa();
  TrainConfig in_f32 = pre;
  in_f32.frozen_weights = FrozenWeights::f32;
  const auto same_files = [&](const std::string& a, const std::string& b) {
    const H5File fa = H5File::open_read(d / (a + "/checkpoint.h5")), fb = H5File::open_read(d / (b + "/checkpoint.h5"));
    for (const char* group : {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"})
      for (const std::string& n : fa.list_datasets_recursive(group))
        BOOST_TEST(fa.read_tensor(std::string(group) + "/" + n).to_vector() == fb.read_tensor(std::string(group) + "/" + n).to_vector(),
                   a << " against " << b << ": " << group << "/" << n);
  };
  for (const double fraction : {0.0, 0.25})
    for (const Trainable t : {Trainable::kv, Trainable::attention}) {
      o.fraction = fraction;
      o.trainable = t;
      const std::string run = to_string(t) + (fraction == 0 ? "_zero" : "");
      o.original.reset();  // the source's config: frozen_weights auto
      const UptrainResult held = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / run, o);
      BOOST_TEST((held.config.frozen_weights == FrozenWeights::automatic));
      BOOST_TEST(held.narrowed_values == frozen_block_params(held.config).all, run);  // every frozen block weight, from the conversion on
      o.original = in_f32;
      const UptrainResult whole = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / (run + "_f32"), o);
      BOOST_TEST(whole.narrowed_values == 0, run);
      BOOST_TEST(held.loss_before == whole.loss_before, run);
      BOOST_TEST(held.val_loss == whole.val_loss, run);
      BOOST_TEST((held.val_loss != held.loss_before || fraction == 0), run);
      same_files(run, run + "_f32");
      if (t == Trainable::kv && fraction > 0) {  // resumed with the frozen weights narrowed, the checkpoint's read into them
        o.original.reset();
        BOOST_TEST(expect_resume_equals_one_go(d, o, run, held).narrowed_values == held.narrowed_values);
      }
    }
}

// uptrain --distill: the source model as teacher. Interrupted and resumed it gives the weights of
// one go (the teacher is deterministic), and with λ = 1 it ends closer to the teacher's
// distribution than plain uptraining does from the same start.
BOOST_AUTO_TEST_CASE(distilled_uptraining_resumes_and_moves_towards_the_teacher) {
  TempDir d;
  const TrainConfig pre = pretrain_mha(d);
  UptrainOptions o = to_mqa();
  o.known_loss_before = 0;  // what the conversion loses is not this test's: four whole val splits fewer
  const UptrainResult plain = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "plain", o);
  o.distill_lambda = 1;
  const UptrainResult r = uptrain(d / "mha/checkpoint.h5", shakespeare(), d / "kd", o);
  BOOST_TEST(r.config.distill_lambda == 1.0);
  BOOST_TEST(r.val_loss != plain.val_loss);
  expect_resume_equals_one_go(d, o, "kd", r);
  // the teacher is the model the run began from, by digest: another model under --from (here the
  // same shape with one weight changed) is refused on --resume (it was distilled from, exit 0)
  {
    LoadedModel other = load_model(d / "mha/checkpoint.h5");
    other.model->named_parameters().front().second.val()[0] += 1.0f;
    save_training_checkpoint(d / "other.h5", *other.model, *pre.make_optimizer(other.model->named_parameters()), pre, TrainState{}, *other.tok);
    UptrainOptions again = o;
    again.resume = true;
    test::expect_throw([&] { uptrain(d / "other.h5", shakespeare(), d / "kd", again); }, ErrorKind::usage,
                       {"uptrain --resume: " + (d / "kd/checkpoint.h5"), "was uptrained from a model of digest", "resume with the model the run began from"});
  }
  // KL(teacher ‖ model) on the first val windows: lower after distilling
  const auto teacher = load_model(d / "mha/checkpoint.h5").model;
  const int64_t T = pre.model.block_size, B = 8;
  Index x({}, {B, T}), y({}, {B, T});
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++) {
      x.data.push_back(shakespeare().val[b * T + i]);
      y.data.push_back(shakespeare().val[b * T + i + 1]);
    }
  NoGrad ng;
  const Tensor tl = teacher->forward(x).val();
  auto kl_of = [&](const std::string& run) {
    return distill_kl(load_model(d / (run + "/checkpoint.h5")).model->forward(x), tl, y, 1.f).item();
  };
  BOOST_TEST(kl_of("kd") < kl_of("plain"), "KL to the teacher: distilled " << kl_of("kd") << ", plain " << kl_of("plain"));
}

BOOST_AUTO_TEST_SUITE_END()
