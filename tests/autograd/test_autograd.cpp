// Every op gradient-checked against central differences of <w, f(x)> for a random cotangent w,
// forward values against closed forms, the tape's bookkeeping and the shape errors.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/autocast.h"
#include "autograd/float16.h"
#include "autograd/kernels/kernels.h"
#include "autograd/record.h"
#include "autograd/runtime.h"
#include "test_util.h"

using namespace tapelm;
using tapelm::test::check_grad;
namespace tt = boost::test_tools;

namespace {
using Fn = std::function<Var(const std::vector<Var>&)>;
uint64_t g_seed = 100;
Tensor rnd(const Shape& s, float std = 1.f) { return randn(s, g_seed++, std); }
Tensor pos(const Shape& s) { return rand_uniform(s, g_seed++, 0.5f, 2.f); }
// Values kept away from 0, where relu has its kink.
Tensor away_from_zero(const Shape& s) {
  Tensor t = rnd(s);
  for (int64_t i = 0; i < t.numel(); i++) t[i] += t[i] >= 0 ? 0.1f : -0.1f;
  return t;
}
Index ids(const Shape& s, int32_t V, uint64_t seed, bool with_ignored = false) {
  Tensor u = rand_uniform(s, seed, 0.f, static_cast<float>(V));
  Index r;
  r.shape = s;
  for (int64_t i = 0; i < u.numel(); i++) r.data.push_back(std::min<int32_t>(V - 1, static_cast<int32_t>(u[i])));
  if (with_ignored)
    for (size_t i = 0; i < r.data.size(); i += 3) r.data[i] = -1;
  return r;
}
std::string str(const Shape& s) { return shape_str(s); }
}  // namespace

BOOST_AUTO_TEST_SUITE(autograd)

BOOST_AUTO_TEST_CASE(binary_ops_all_broadcasts) {
  struct Case {
    Shape a, b;
  };
  // same shape, row, column and scalar broadcasting, each way round, with odd sizes
  const std::vector<Case> cases = {{{3, 17}, {3, 17}}, {{1, 5}, {1, 5}},  {{4, 17}, {17}},  {{17}, {4, 17}},
                                   {{2, 3, 5}, {3, 5}}, {{3, 17}, {3, 1}}, {{3, 1}, {3, 17}}, {{17}, {1}},
                                   {{1}, {2, 3}},       {{1, 1}, {1, 1}}};
  const std::vector<std::pair<std::string, std::function<Var(const Var&, const Var&)>>> ops = {
      {"add", [](const Var& a, const Var& b) { return add(a, b); }},
      {"sub", [](const Var& a, const Var& b) { return sub(a, b); }},
      {"mul", [](const Var& a, const Var& b) { return mul(a, b); }},
      {"div", [](const Var& a, const Var& b) { return div(a, b); }}};
  for (const auto& [name, op] : ops)
    for (const Case& c : cases) {
      Tensor b = name == "div" ? pos(c.b) : rnd(c.b);
      check_grad(name + " " + str(c.a) + " " + str(c.b), [&](const std::vector<Var>& x) { return op(x[0], x[1]); },
                 {rnd(c.a), b});
    }
}

BOOST_AUTO_TEST_CASE(scalar_ops_and_neg) {
  for (Shape s : {Shape{17}, Shape{3, 1, 5}}) {
    check_grad("add scalar", [](const std::vector<Var>& x) { return x[0] + 2.5f; }, {rnd(s)});
    check_grad("mul scalar", [](const std::vector<Var>& x) { return x[0] * -1.5f; }, {rnd(s)});
    check_grad("neg", [](const std::vector<Var>& x) { return -x[0]; }, {rnd(s)});
  }
}

BOOST_AUTO_TEST_CASE(unary_ops) {
  for (Shape s : {Shape{1}, Shape{3, 17}, Shape{2, 3, 5}}) {
    check_grad("exp " + str(s), [](const std::vector<Var>& x) { return exp(x[0]); }, {rnd(s)});
    check_grad("log " + str(s), [](const std::vector<Var>& x) { return log(x[0]); }, {pos(s)});
    check_grad("tanh " + str(s), [](const std::vector<Var>& x) { return tanh(x[0]); }, {rnd(s)});
    check_grad("relu " + str(s), [](const std::vector<Var>& x) { return relu(x[0]); }, {away_from_zero(s)});
    check_grad("gelu " + str(s), [](const std::vector<Var>& x) { return gelu(x[0]); }, {rnd(s, 2.f)});
    check_grad("gelu tanh " + str(s), [](const std::vector<Var>& x) { return gelu(x[0], true); }, {rnd(s, 2.f)});
    check_grad("silu " + str(s), [](const std::vector<Var>& x) { return silu(x[0]); }, {rnd(s, 2.f)});
  }
}

BOOST_AUTO_TEST_CASE(matmul_2d_all_transposes) {
  for (auto [M, K, N] : {std::tuple{3, 17, 5}, std::tuple{1, 1, 1}, std::tuple{4, 1, 3}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Shape a = ta ? Shape{K, M} : Shape{M, K}, b = tb ? Shape{N, K} : Shape{K, N};
        check_grad("matmul " + str(a) + (ta ? "T " : " ") + str(b) + (tb ? "T" : ""),
                   [=](const std::vector<Var>& x) { return matmul(x[0], x[1], ta, tb); }, {rnd(a), rnd(b)});
      }
}

BOOST_AUTO_TEST_CASE(matmul_batched_and_shared_rhs) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape a = ta ? Shape{2, 3, 17, 4} : Shape{2, 3, 4, 17}, b = tb ? Shape{2, 3, 5, 17} : Shape{2, 3, 17, 5};
      check_grad("batched matmul", [=](const std::vector<Var>& x) { return matmul(x[0], x[1], ta, tb); },
                 {rnd(a), rnd(b)});
    }
  // many small batches take the one-matrix-per-thread path
  check_grad("batched matmul, 9 batches", [](const std::vector<Var>& x) { return matmul(x[0], x[1], false, true); },
             {rnd({9, 3, 4}), rnd({9, 5, 4})});
  for (bool tb : {false, true})
    check_grad("N-D times 2-D", [=](const std::vector<Var>& x) { return matmul(x[0], x[1], false, tb); },
               {rnd({2, 3, 17}), rnd(tb ? Shape{4, 17} : Shape{17, 4})});
}

BOOST_AUTO_TEST_CASE(linear_with_and_without_bias) {
  for (Shape xs : {Shape{3, 17}, Shape{2, 3, 4}, Shape{1, 1}}) {
    const int64_t in = xs.back(), out = in == 17 ? 5 : 3;
    check_grad("linear " + str(xs), [](const std::vector<Var>& x) { return linear(x[0], x[1]); },
               {rnd(xs), rnd({out, in})});
    check_grad("linear+bias " + str(xs), [](const std::vector<Var>& x) { return linear(x[0], x[1], x[2]); },
               {rnd(xs), rnd({out, in}), rnd({out})});
  }
}

// Several linears of one input: each output's gradient through the shared input and its own
// weight and bias, on few rows (the one-pass kernel, K >= 64) and on many (one sgemm each), the
// outputs combined so that every one counts.
BOOST_AUTO_TEST_CASE(linears_of_one_input) {
  for (Shape xs : {Shape{1, 1, 70}, Shape{2, 3, 70}, Shape{20, 70}, Shape{3, 5}}) {
    const int64_t in = xs.back();
    // The objective is quadratic in every single input element, so central differences have no
    // truncation error at any step: a wider step than the default only divides the float32
    // rounding of the outputs by more (at 0.01 it reached 1.7x the tolerance on [20, 70] in a
    // build whose kernels round differently).
    GradCheckOptions opt;
    opt.eps = 0.05;
    check_grad("linears " + str(xs),
               [](const std::vector<Var>& x) {
                 const std::vector<Var> y = linears(x[0], {x[1], x[2], x[3]}, {x[4], Var(), x[5]});
                 return add(add(mul(y[0], y[0]), y[1]), mul(y[2], y[0]));
               },
               {rnd(xs), rnd({3, in}), rnd({3, in}), rnd({3, in}), rnd({3}), rnd({3})}, opt);
  }
}

BOOST_AUTO_TEST_CASE(reductions) {
  for (Shape s : {Shape{3, 17}, Shape{2, 3, 5}, Shape{1}}) {
    check_grad("sum " + str(s), [](const std::vector<Var>& x) { return sum(x[0]); }, {rnd(s)});
    check_grad("mean " + str(s), [](const std::vector<Var>& x) { return mean(x[0]); }, {rnd(s)});
    for (int ax = 0; ax < static_cast<int>(s.size()); ax++)
      for (bool keep : {false, true}) {
        check_grad("sum axis " + std::to_string(ax) + " " + str(s),
                   [=](const std::vector<Var>& x) { return sum(x[0], ax, keep); }, {rnd(s)});
        check_grad("mean axis " + std::to_string(ax) + " " + str(s),
                   [=](const std::vector<Var>& x) { return mean(x[0], ax, keep); }, {rnd(s)});
      }
  }
  check_grad("sum axis -1", [](const std::vector<Var>& x) { return sum(x[0], -1); }, {rnd({4, 33})});
  check_grad("sum axis 0 wide", [](const std::vector<Var>& x) { return sum(x[0], 0); }, {rnd({3, 37})});
}

BOOST_AUTO_TEST_CASE(layout_ops) {
  check_grad("reshape", [](const std::vector<Var>& x) { return reshape(x[0], {5, -1}); }, {rnd({3, 5})});
  check_grad("reshape rank 3", [](const std::vector<Var>& x) { return reshape(x[0], {17}); },
             {rnd({1, 17, 1})});
  check_grad("permute 3-D", [](const std::vector<Var>& x) { return permute(x[0], {2, 0, 1}); }, {rnd({2, 3, 5})});
  check_grad("permute 4-D", [](const std::vector<Var>& x) { return permute(x[0], {0, 2, 1, 3}); },
             {rnd({2, 3, 4, 5})});
  check_grad("transpose", [](const std::vector<Var>& x) { return transpose(x[0], 0, 1); }, {rnd({3, 17})});
  check_grad("transpose 1x1", [](const std::vector<Var>& x) { return transpose(x[0], -1, -2); }, {rnd({1, 1})});
  for (int ax = 0; ax < 3; ax++) {
    check_grad("slice axis " + std::to_string(ax), [=](const std::vector<Var>& x) { return slice(x[0], ax, 1, 2); },
               {rnd({3, 4, 5})});
    check_grad("concat axis " + std::to_string(ax),
               [=](const std::vector<Var>& x) { return concat({x[0], x[1], x[0]}, ax); },
               {rnd({2, 3, 5}), rnd({2, 3, 5})});
  }
  check_grad("slice odd", [](const std::vector<Var>& x) { return slice(x[0], 1, 0, 17); }, {rnd({1, 17})});
  check_grad("concat unequal", [](const std::vector<Var>& x) { return concat({x[0], x[1]}, 1); },
             {rnd({3, 1}), rnd({3, 17})});
}

BOOST_AUTO_TEST_CASE(embedding_gather_scatter) {
  for (auto [V, C, shape] : {std::tuple{7, 5, Shape{2, 9}}, std::tuple{3, 17, Shape{1, 1}}, std::tuple{65, 33, Shape{40}}}) {
    Index idx = ids(shape, V, g_seed++);
    check_grad("embedding V=" + std::to_string(V), [idx](const std::vector<Var>& x) { return embedding(x[0], idx); },
               {rnd({V, C})});
  }
}

BOOST_AUTO_TEST_CASE(norms) {
  for (Shape s : {Shape{3, 17}, Shape{2, 3, 8}, Shape{1, 1}}) {
    const int64_t C = s.back();
    check_grad("layernorm " + str(s), [](const std::vector<Var>& x) { return layernorm(x[0], x[1]); },
               {rnd(s), rnd({C})}, {.eps = 1e-2, .atol = 5e-3});
    check_grad("layernorm+bias " + str(s), [](const std::vector<Var>& x) { return layernorm(x[0], x[1], x[2]); },
               {rnd(s), rnd({C}), rnd({C})}, {.eps = 1e-2, .atol = 5e-3});
    check_grad("rmsnorm " + str(s), [](const std::vector<Var>& x) { return rmsnorm(x[0], x[1]); },
               {rnd(s), rnd({C})}, {.eps = 1e-2, .atol = 5e-3});
  }
}

BOOST_AUTO_TEST_CASE(softmaxes_and_cross_entropy) {
  for (Shape s : {Shape{3, 17}, Shape{2, 3, 5}, Shape{1, 1}}) {
    check_grad("softmax " + str(s), [](const std::vector<Var>& x) { return softmax(x[0]); }, {rnd(s)});
    check_grad("log_softmax " + str(s), [](const std::vector<Var>& x) { return log_softmax(x[0]); }, {rnd(s)});
  }
  for (auto [N, V, ign] : {std::tuple{5, 17, false}, std::tuple{9, 3, true}, std::tuple{1, 1, false}}) {
    Index t = ids({N}, V, g_seed++, ign);
    check_grad("cross_entropy N=" + std::to_string(N) + " V=" + std::to_string(V),
               [t](const std::vector<Var>& x) { return cross_entropy(x[0], t); }, {rnd({N, V}, 2.f)});
  }
  Index t3 = ids({2, 3}, 5, 77, true);
  check_grad("cross_entropy 3-D logits", [t3](const std::vector<Var>& x) { return cross_entropy(x[0], t3); },
             {rnd({2, 3, 5})});
}

BOOST_AUTO_TEST_CASE(dropout_op) {
  for (Shape s : {Shape{3, 17}, Shape{1, 1, 5}})
    for (float p : {0.f, 0.3f, 0.9f})
      check_grad("dropout p=" + std::to_string(p), [p](const std::vector<Var>& x) { return dropout(x[0], p, 42); },
                 {rnd(s)});
}

BOOST_AUTO_TEST_CASE(composite_with_fan_out) {
  // x used three times, W twice: gradients must accumulate across uses.
  check_grad("fan-out", [](const std::vector<Var>& x) {
    Var h = tanh(linear(x[0], x[1]));
    return mul(h, linear(h, x[1])) + x[0];
  }, {rnd({3, 4}), rnd({4, 4}, 0.5f)});
}

// ---- forward values against independent computations -------------------------------------------

BOOST_AUTO_TEST_CASE(matmul_values) {
  Var a(Tensor::from({2, 2}, {1, 2, 3, 4})), b(Tensor::from({2, 2}, {5, 6, 7, 8}));
  const std::vector<float> ab{19, 22, 43, 50}, atb{26, 30, 38, 44}, abt{17, 23, 39, 53}, atbt{23, 31, 34, 46};
  BOOST_TEST(matmul(a, b).val().to_vector() == ab, tt::per_element());
  BOOST_TEST(matmul(a, b, true, false).val().to_vector() == atb, tt::per_element());
  BOOST_TEST(matmul(a, b, false, true).val().to_vector() == abt, tt::per_element());
  BOOST_TEST(matmul(a, b, true, true).val().to_vector() == atbt, tt::per_element());
  // a 3x17 · 17x5 product against a naive triple loop in double
  Tensor A = rnd({3, 17}), B = rnd({17, 5});
  Tensor C = matmul(Var(A), Var(B)).val();
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) {
      double s = 0;
      for (int k = 0; k < 17; k++) s += double(A[i * 17 + k]) * B[k * 5 + j];
      BOOST_TEST(C[i * 5 + j] == s, tt::tolerance(1e-5));
    }
}

BOOST_AUTO_TEST_CASE(vectorised_exp_and_erf_accuracy) {
  double worst_exp = 0, worst_erf = 0;
  for (double x = -87.0; x <= 88.0; x += 0.0137) {
    const float xf = static_cast<float>(x);
    const double e = std::exp(double(xf));
    worst_exp = std::max(worst_exp, std::fabs(kern::exp_approx(xf) - e) / e);
  }
  for (double x = -6.0; x <= 6.0; x += 0.001) worst_erf = std::max(worst_erf, std::fabs(kern::erf_approx(static_cast<float>(x)) - std::erf(x)));
  BOOST_TEST(worst_exp < 3e-7, "exp relative error " << worst_exp);  // 2 ulp
  BOOST_TEST(worst_erf < 5e-7, "erf absolute error " << worst_erf);   // 1.5e-7 (A&S) plus float rounding
  BOOST_TEST(kern::exp_approx(-1000.f) < 1e-37f);
  BOOST_TEST(kern::exp_approx(0.f) == 1.f);
}

BOOST_AUTO_TEST_CASE(softmax_values) {
  Tensor y = softmax(Var(Tensor::from({2, 3}, {1, 2, 3, 1000, 1000, 1000}))).val();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  BOOST_TEST(y[0] == std::exp(1.0) / z, tt::tolerance(1e-6));
  BOOST_TEST(y[1] == std::exp(2.0) / z, tt::tolerance(1e-6));
  BOOST_TEST(y[2] == std::exp(3.0) / z, tt::tolerance(1e-6));
  for (int i = 3; i < 6; i++) BOOST_TEST(y[i] == 1.0 / 3.0, tt::tolerance(1e-6));  // no overflow
  Tensor ls = log_softmax(Var(Tensor::from({1, 3}, {1, 2, 3}))).val();
  BOOST_TEST(ls[2] == 3.0 - std::log(z), tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(layernorm_values) {
  Tensor x = Tensor::from({1, 4}, {1, 2, 3, 4});
  Tensor y = layernorm(Var(x), Var(Tensor::from({4}, {1, 1, 2, 1})), Var(Tensor::from({4}, {0, 0, 0, 0.5f}))).val();
  const double sd = std::sqrt(1.25 + 1e-5);  // mean 2.5, biased variance 1.25
  BOOST_TEST(y[0] == -1.5 / sd, tt::tolerance(1e-5));
  BOOST_TEST(y[1] == -0.5 / sd, tt::tolerance(1e-5));
  BOOST_TEST(y[2] == 2 * 0.5 / sd, tt::tolerance(1e-5));
  BOOST_TEST(y[3] == 1.5 / sd + 0.5, tt::tolerance(1e-5));
  Tensor r = rmsnorm(Var(x), Var(Tensor::from({4}, {1, 1, 1, 1}))).val();
  BOOST_TEST(r[3] == 4 / std::sqrt(7.5 + 1e-5), tt::tolerance(1e-5));  // mean of squares 30/4
}

BOOST_AUTO_TEST_CASE(gelu_values) {
  // 0.5 x (1 + erf(x / sqrt 2)) at 1 and -1 is Phi(1) and -Phi(-1).
  Tensor y = gelu(Var(Tensor::from({3}, {0, 1, -1}))).val();
  BOOST_TEST(y[0] == 0.0, tt::tolerance(1e-7));
  BOOST_TEST(y[1] == 0.8413447460685429, tt::tolerance(1e-6));
  BOOST_TEST(y[2] == -0.15865525393145707, tt::tolerance(1e-6));
  Tensor t = gelu(Var(Tensor::from({1}, {1})), true).val();
  BOOST_TEST(t[0] == 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715)), tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(cross_entropy_values) {
  // uniform logits: ln V; one hand case; an ignored target does not count
  BOOST_TEST(cross_entropy(Var(Tensor::zeros({2, 4})), Index({1, 3}, {2})).item() == std::log(4.0), tt::tolerance(1e-6));
  Var l(Tensor::from({2, 3}, {1, 2, 3, 5, 0, 0}));
  const double l0 = std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)) - 1.0;
  BOOST_TEST(cross_entropy(l, Index({0, -1}, {2})).item() == l0, tt::tolerance(1e-6));
  const double l1 = std::log(std::exp(5.) + 2.0) - 0.0;
  BOOST_TEST(cross_entropy(l, Index({0, 1}, {2})).item() == (l0 + l1) / 2, tt::tolerance(1e-6));
}

// Distillation's soft-target loss against its definition, written out in double:
// T²·Σ_c p_t(c)·(log p_t(c) − log p_s(c)) with p = softmax(logits / T), averaged over counted rows.
BOOST_AUTO_TEST_CASE(distillation_loss_values_and_gradient) {
  const int64_t N = 5, V = 11;
  const Tensor s = rnd({N, V}, 2.f), t = rnd({N, V}, 2.f);
  const Index targets({3, -1, 0, 10, 7}, {N});
  for (float T : {1.f, 2.f, 0.5f}) {
    double want = 0;
    int counted = 0;
    for (int64_t r = 0; r < N; r++) {
      if (targets.data[r] < 0) continue;
      counted++;
      double zs = 0, zt = 0;
      for (int64_t c = 0; c < V; c++) {
        zs += std::exp(double(s[r * V + c]) / T);
        zt += std::exp(double(t[r * V + c]) / T);
      }
      for (int64_t c = 0; c < V; c++) {
        const double log_pt = double(t[r * V + c]) / T - std::log(zt), log_ps = double(s[r * V + c]) / T - std::log(zs);
        want += double(T) * T * std::exp(log_pt) * (log_pt - log_ps);
      }
    }
    want /= counted;
    BOOST_TEST(distill_kl(Var(s), t, targets, T).item() == want, tt::tolerance(2e-5));
    BOOST_TEST(std::fabs(distill_kl(Var(t), t, targets, T).item()) < 1e-6);  // the teacher itself: 0
    check_grad("distill_kl T=" + std::to_string(T),
               [t, targets, T](const std::vector<Var>& x) { return distill_kl(x[0], t, targets, T); }, {s});
  }
  const Tensor s3 = rnd({2, 3, V}), t3 = rnd({2, 3, V});
  const Index all({1, 2, 3, 4, 5, 6}, {2, 3});
  check_grad("distill_kl 3-D logits", [t3, all](const std::vector<Var>& x) { return distill_kl(x[0], t3, all, 2.f); }, {s3});
}

BOOST_AUTO_TEST_CASE(dropout_statistics) {
  Tensor x = Tensor::full({100000}, 1.f);
  Tensor y = dropout(Var(x), 0.25f, 7).val();
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); i++) {
    if (y[i] == 0.f) zeros++;
    else BOOST_REQUIRE_CLOSE(y[i], 1.f / 0.75f, 1e-4);
  }
  BOOST_TEST(zeros / 100000.0 == 0.25, tt::tolerance(0.03));  // relative: 0.2425 .. 0.2575
  BOOST_TEST(dropout(Var(x), 0.25f, 7).val().to_vector() == y.to_vector(), tt::per_element());
  BOOST_TEST(dropout(Var(x), 0.25f, 8).val().to_vector() != y.to_vector());
}

// ---- the tape ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(tape_frees_saved_activations) {
  Var x(rnd({64, 32}), true), w(rnd({48, 32}), true);
  x.grad();
  w.grad();  // allocate the gradients up front, so only activations come and go
  Tape::get().clear();
  const AllocStats before = alloc_stats();
  {
    Var loss = mean(gelu(layernorm(linear(x, w), Var(Tensor::full({48}, 1.f)))));
    BOOST_TEST(Tape::get().size() == 4u);
    BOOST_TEST(alloc_stats().live_blocks > before.live_blocks);
    backward(loss);
    BOOST_TEST(Tape::get().size() == 0u);
  }
  BOOST_TEST(alloc_stats().live_blocks == before.live_blocks);
  BOOST_TEST(alloc_stats().live_bytes == before.live_bytes);
  // clear() without backward frees too
  {
    Var y = softmax(linear(x, w));
    BOOST_TEST(y.use_count() == 2);  // this handle and the tape's closure
    Tape::get().clear();
    BOOST_TEST(y.use_count() == 1);
  }
  BOOST_TEST(alloc_stats().live_blocks == before.live_blocks);
}

// A recorded op holds only what its backward reads: an add's closure holds its inputs' gradient
// slots, not their values, so the value of t = a + a goes with its last Var while backward still
// delivers d(t + a)/da = 3 into a; a permute's input likewise; a value some backward reads (the
// product's inputs) stays. The same for a bf16 linear layer's input, whose backward reads its
// 16-bit copy (bf16-emulated: the same rounding on any CPU).
BOOST_AUTO_TEST_CASE(values_no_backward_reads_are_freed_with_their_last_var) {
  const int64_t bytes = 64 * 64 * static_cast<int64_t>(sizeof(float));
  Var a(rnd({64, 64}), true);
  a.grad();
  Tape::get().clear();
  {
    Var t = add(a, a);
    Var u = add(t, a);
    const AllocStats held = alloc_stats();
    t = Var();
    BOOST_TEST(alloc_stats().live_bytes == held.live_bytes - bytes);
    backward(sum(u));
    for (int64_t i = 0; i < a.numel(); i++) BOOST_REQUIRE(a.grad()[i] == 3.f);
  }
  a.zero_grad();
  {
    Var p = permute(add(a, a), {1, 0});  // the add's output: read by no backward, held by no Var
    Var m = mul(p, p);                   // reads p: p stays
    const AllocStats held = alloc_stats();
    p = Var();
    BOOST_TEST(alloc_stats().live_bytes == held.live_bytes);
    backward(sum(m));  // d Σ (2a)ᵀ² / da = 8a
    for (int64_t i = 0; i < a.numel(); i++) BOOST_REQUIRE(a.grad()[i] == 8.f * a.val()[i]);
  }
  // ops whose backward reads no input value: softmax (reads its output), dropout (draws its mask
  // again), a scalar product, concat, a sum: their input goes with its last Var
  const std::vector<std::pair<const char*, std::function<Var(const Var&)>>> readers_of_nothing{
      {"softmax", [](const Var& t) { return softmax(t); }},
      {"dropout", [](const Var& t) { return dropout(t, 0.5f, 9); }},
      {"mul scalar", [](const Var& t) { return mul(t, 2.f); }},
      {"concat", [](const Var& t) { return concat({t, t}, 0); }},
      {"sum", [](const Var& t) { return sum(t); }}};
  for (const auto& [name, f] : readers_of_nothing) {
    Var t = add(a, a);
    const Var y = f(t);
    const AllocStats held = alloc_stats();
    t = Var();
    BOOST_TEST(alloc_stats().live_bytes == held.live_bytes - bytes, name);
    backward(sum(mul(y, y)));
    float reached = 0;  // the gradient reached a through the freed value's slot
    for (int64_t i = 0; i < a.numel(); i++) reached = std::max(reached, std::fabs(a.grad()[i]));
    BOOST_TEST(reached > 0.f, name);
    a.zero_grad();
  }
  Var w(rnd({48, 64}), true);
  w.grad();
  a.zero_grad();
  {
    const Autocast bf16(Precision::bf16_emulated);
    Var x = add(a, a);
    const AllocStats before_linear = alloc_stats();
    Var y = linear(x, w);
    // what stays: y [64, 48] and x's rounded copy [64, 64]; no rounded copy of w [48, 64] is kept
    // for backward (which rounds w again)
    BOOST_TEST(alloc_stats().live_bytes == before_linear.live_bytes + 64 * 48 * static_cast<int64_t>(sizeof(float)) + bytes);
    const AllocStats held = alloc_stats();
    x = Var();  // the linear's backward reads its rounded copy of x, not x
    BOOST_TEST(alloc_stats().live_bytes == held.live_bytes - bytes);
    backward(sum(y));
    BOOST_TEST(a.grad()[0] != 0.f);
  }
  Tape::get().clear();
}

// GradReadyHook reports a watched parameter once its gradient is complete: the gradient at the
// report equals the gradient after backward, for a parameter used first and again last (as a tied
// embedding is), inside a checkpointed block (reported once, at the block's op, not by the block's
// inner backward), on every backward (accumulation), never for one no op used, and not for the
// uses of a forward cleared without its backward.
BOOST_AUTO_TEST_CASE(grad_ready_hooks_report_each_gradient_once_complete) {
  Tape::get().clear();
  const Var x(rnd({5}));
  Var b(rnd({5}), true), w1(rnd({5}), true), w2(rnd({5}), true), unused(rnd({5}), true);
  const std::vector<Var> watched{b, w1, w2, unused};
  BOOST_CHECK_THROW(GradReadyHook({b, w1, b}, [](size_t) {}), std::logic_error);  // b would be reported once
  std::vector<size_t> order;
  std::vector<std::vector<float>> at_report(watched.size());
  GradReadyHook hook(watched, [&](size_t i) {
    order.push_back(i);
    at_report[i] = watched[i].grad().to_vector();
  });
  auto check_complete = [&](const std::vector<size_t>& want) {
    BOOST_TEST(order == want, tt::per_element());
    for (size_t i : want) BOOST_TEST(at_report[i] == watched[i].grad().to_vector(), tt::per_element());
    order.clear();
  };
  auto forward = [&] { return sum(add(mul(tanh(add(mul(b, x), w1)), w2), b)); };  // b first and last
  backward(forward());
  check_complete({2, 1, 0});  // the reverse of first use: w2, w1, b
  backward(forward());        // accumulating: reported again, complete again
  check_complete({2, 1, 0});
  clear_tape();
  (void)forward();  // recorded, never run backward: its first uses go with it
  clear_tape();
  backward(sum(mul(w1, x)));
  check_complete({1});
  for (const Var& v : watched) v.zero_grad();
  const Var y = checkpoint(x, {w1, w2}, [&](const Var& t) { return tanh(add(mul(t, w2), w1)); });
  backward(sum(mul(y, b)));
  check_complete({0, 2, 1});  // b (used after the block), then the block's two, once each
  BOOST_TEST(!unused.has_grad());
  BOOST_CHECK_THROW(GradReadyHook(watched, [](size_t) {}), std::logic_error);  // one per thread
}

BOOST_AUTO_TEST_CASE(no_grad_records_nothing) {
  Var x(rnd({3, 4}), true);
  Tape::get().clear();
  {
    NoGrad ng;
    Var y = tanh(x * x);
    BOOST_TEST(!y.requires_grad());
    BOOST_TEST(Tape::get().size() == 0u);
  }
  Var y = tanh(x);
  BOOST_TEST(y.requires_grad());
  BOOST_TEST(Tape::get().size() == 1u);
  Tape::get().clear();
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_and_zero) {
  Var x(Tensor::from({2}, {1.5f, -2.f}), true);
  backward(sum(x * x + x));  // d/dx = 2x + 1
  BOOST_TEST(x.grad()[0] == 4.f);
  BOOST_TEST(x.grad()[1] == -3.f);
  backward(sum(x));  // accumulates
  BOOST_TEST(x.grad()[0] == 5.f);
  x.zero_grad();
  BOOST_TEST(x.grad()[0] == 0.f);
}

BOOST_AUTO_TEST_CASE(gradcheck_catches_a_wrong_backward) {
  // A deliberately wrong backward (softmax's gradient of a plain sum would be zero) must fail.
  auto wrong = [](const std::vector<Var>& x) {
    Var in = x[0];
    Tensor y = softmax(Var(in.val())).val();
    return record({in}, y, [](const Tensor&) {});
  };
  BOOST_TEST(!gradcheck(wrong, {rnd({3, 5})}).ok);
}

BOOST_AUTO_TEST_CASE(shape_errors_name_op_and_shapes) {
  auto expect = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    test::expect_throw(f, ErrorKind::shape, parts);
  };
  Var a(rnd({2, 3})), b(rnd({4, 5}));
  expect([&] { matmul(a, b); }, {"matmul", "[2, 3]", "[4, 5]"});
  expect([&] { add(a, b); }, {"add", "[2, 3]", "[4, 5]"});
  expect([&] { linear(a, b); }, {"linear", "[2, 3]", "[4, 5]"});
  expect([&] { reshape(a, {7}); }, {"reshape", "[2, 3]", "[7]"});
  expect([&] { concat({a, b}, 0); }, {"concat", "[2, 3]", "[4, 5]"});
  expect([&] { layernorm(a, Var(rnd({4}))); }, {"layernorm", "[2, 3]", "[4]"});
  expect([&] { embedding(b, Index({0, 9}, {2})); }, {"embedding", "9"});
  expect([&] { cross_entropy(a, Index({0, 3}, {2})); }, {"cross_entropy", "3"});
  expect([&] { permute(a, {0, 0}); }, {"permute", "[2, 3]"});
  expect([&] { slice(a, 1, 2, 5); }, {"slice", "[2, 3]"});
}

BOOST_AUTO_TEST_CASE(thread_count_does_not_change_results) {
  // Reductions use fixed chunking: the same bits on 1 and 2 threads.
  Tensor x = rnd({300, 257});
  Tensor s1;
  float a1 = 0;
  {
    test::ThreadCount one(1);
    s1 = sum(Var(x), 0).val();
    a1 = sum(Var(x)).item();
  }
  test::ThreadCount two(2);
  Tensor s2 = sum(Var(x), 0).val();
  BOOST_TEST(s1.to_vector() == s2.to_vector(), tt::per_element());
  BOOST_TEST(a1 == sum(Var(x)).item());
}

BOOST_AUTO_TEST_SUITE_END()

// ---- bf16 products (autograd/autocast.h) -------------------------------------------------------

namespace {
// bf16's value of a normal f: the nearest of the floats with 8 significant bits, ties to even
// (written out here from the definition, not from the kernel): f in units of its 8th bit.
double bf16_value(float f) {
  if (!std::isfinite(f) || f == 0.f) return f;
  int e;
  std::frexp(f, &e);  // |f| in [2^(e-1), 2^e): 8 significant bits are units of 2^(e-8)
  const double unit = std::ldexp(1.0, e - 8);
  return std::nearbyint(f / unit) * unit;  // the default rounding mode is to nearest, ties to even
}

// x·wᵀ + b in double over the bf16 values of x and w.
std::vector<double> bf16_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t in = w.dim(1), out = w.dim(0), rows = x.numel() / in;
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t o = 0; o < out; o++) {
      double s = b.defined() ? b[o] : 0.0;
      for (int64_t k = 0; k < in; k++) s += bf16_value(x[r * in + k]) * bf16_value(w[o * in + k]);
      y[r * out + o] = s;
    }
  return y;
}

double max_abs_diff(const std::vector<double>& want, const Tensor& got) {
  double m = 0;
  for (size_t i = 0; i < want.size(); i++) m = std::max(m, std::fabs(want[i] - got[static_cast<int64_t>(i)]));
  return m;
}

// The precisions that run here: bf16-emulated always, bf16 where the CPU has bf16 instructions.
std::vector<Precision> bf16_precisions() {
  std::vector<Precision> ps{Precision::bf16_emulated};
  if (precision_unavailable(Precision::bf16).empty()) ps.push_back(Precision::bf16);
  return ps;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(precision)

BOOST_AUTO_TEST_CASE(bf16_rounding_is_to_nearest_even) {
  const float max = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even is 1. 1 + 3·2^-8 is halfway between
  // 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6. Just above a tie rounds up. float's largest value
  // is past bf16's largest (0x7f7f) by more than half a unit: infinity. bf16's smallest
  // subnormal is 2^-133: float's (2^-149) rounds to zero, 3·2^-133 is exact.
  const std::vector<std::pair<float, float>> cases{
      {1.f + 0x1p-8f, 1.f}, {1.f + 3 * 0x1p-8f, 1.f + 0x1p-6f}, {1.f + 0x1p-8f + 0x1p-20f, 1.f + 0x1p-7f},
      {-(1.f + 0x1p-8f), -1.f}, {max, INFINITY}, {-max, -INFINITY}, {INFINITY, INFINITY}, {-0.f, -0.f},
      {tiny, 0.f}, {3.f * 0x1p-133f, 3.f * 0x1p-133f}};
  std::vector<float> in, out(cases.size());
  for (const auto& c : cases) in.push_back(c.first);
  kern::round_bf16(out.data(), in.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < cases.size(); i++) {
    BOOST_TEST(out[i] == cases[i].second, in[i] << " -> " << out[i]);
    BOOST_TEST(std::signbit(out[i]) == std::signbit(cases[i].second));
  }
  const float nan_in[2] = {std::nanf(""), -std::nanf("")};
  float nan_out[2];
  kern::round_bf16(nan_out, nan_in, 2);
  BOOST_TEST((std::isnan(nan_out[0]) && std::isnan(nan_out[1]) && std::signbit(nan_out[1])));
  // Random finite values (several threads): the kernel against the definition above, and the
  // bf16 bits against the scalar converter of float16.h
  const Tensor r = randn({70001}, 3, 50.f);
  std::vector<float> rounded(70001);
  std::vector<uint16_t> bits(70001);
  kern::round_bf16(rounded.data(), r.data(), r.numel());
  kern::to_bf16(bits.data(), r.data(), r.numel());
  int64_t wrong = 0;
  for (int64_t i = 0; i < r.numel(); i++)
    wrong += rounded[i] != bf16_value(r[i]) || bits[i] != f32_to_bf16(r[i]) || bf16_to_f32(bits[i]) != rounded[i];
  BOOST_TEST(wrong == 0);
}

// Under Autocast(bf16): y = bf16(x)·bf16(w)ᵀ + b with float32 sums; dy rounded to bf16 for dx
// and dw, the bias gradient from dy itself (autocast's rules, docs/guide/precision.md).
BOOST_AUTO_TEST_CASE(bf16_linear_layers_multiply_bf16_values) {
  const Tensor x = randn({2, 5, 48}, 21), w = randn({24, 48}, 22), b = randn({24}, 23), c = randn({2, 5, 24}, 24);
  const Tensor w2 = randn({16, 48}, 25);
  std::vector<double> dx_want(x.numel(), 0.0), dw_want(w.numel(), 0.0), db_want(24, 0.0);
  for (int64_t r = 0; r < 10; r++)
    for (int64_t o = 0; o < 24; o++) {
      const double g = bf16_value(c[r * 24 + o]);
      db_want[o] += c[r * 24 + o];
      for (int64_t k = 0; k < 48; k++) {
        dx_want[r * 48 + k] += g * bf16_value(w[o * 48 + k]);
        dw_want[o * 48 + k] += g * bf16_value(x[r * 48 + k]);
      }
    }
  const std::vector<double> y_want = bf16_linear(x, w, b);
  const Tensor y32 = linear(Var(x), Var(w), Var(b)).val();
  for (Precision p : bf16_precisions()) {
    BOOST_TEST_CONTEXT(to_string(p)) {
      Var xv(x.clone(), true), wv(w.clone(), true), bv(b.clone(), true), w2v(w2.clone(), true);
      Tensor y, y_many, y2;
      {
        const Autocast ac(p);
        Var yv = linear(xv, wv, bv);
        const std::vector<Var> many = linears(xv, {wv, w2v}, {bv, Var()});
        y = yv.val();
        y_many = many[0].val();
        y2 = many[1].val();
        backward(sum(mul(yv, Var(c))));
      }
      BOOST_TEST(max_abs_diff(y_want, y) < 2e-5);
      BOOST_TEST(max_abs_diff(y_want, y32) > 1e-3);  // the rounding is visible: f32 differs
      BOOST_TEST(y_many.to_vector() == y.to_vector(), tt::per_element());
      BOOST_TEST(max_abs_diff(bf16_linear(x, w2, Tensor()), y2) < 2e-5);
      BOOST_TEST(max_abs_diff(dx_want, xv.grad()) < 2e-5);
      BOOST_TEST(max_abs_diff(dw_want, wv.grad()) < 2e-5);
      BOOST_TEST(max_abs_diff(db_want, bv.grad()) < 1e-5);
      // A new scope rounds the weight anew: after an in-place update the output follows it.
      for (int64_t i = 0; i < w.numel(); i++) wv.val()[i] *= 0.5f;
      const std::vector<float> y_half32 = linear(xv, wv).val().to_vector();
      const Autocast ac(p);
      const Tensor y_half = linear(xv, wv).val();
      BOOST_TEST(max_abs_diff(bf16_linear(x, wv.val(), Tensor()), y_half) < 2e-5);
      const Autocast f32(Precision::f32);  // an inner f32 scope computes in float32
      BOOST_TEST(linear(xv, wv).val().to_vector() == y_half32, tt::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_on_bf16_instructions_matches_its_definition,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       test::Precondition r(precision_unavailable(Precision::bf16).empty());
                       if (!r) r.message() << precision_unavailable(Precision::bf16);
                       return r;
                     })) {
  // gemm_bf16 (oneDNN's bf16 matmul) against sgemm on the same values widened, each transpose,
  // alpha and beta, operands inside wider rows.
  const int64_t M = 37, N = 29, K = 70, ld = 80;
  const Tensor a = randn({K, ld}, 31), bm = randn({K, ld}, 32), c0 = randn({M, ld}, 33);
  std::vector<uint16_t> ab(a.numel()), bb(bm.numel());
  kern::to_bf16(ab.data(), a.data(), a.numel());
  kern::to_bf16(bb.data(), bm.data(), bm.numel());
  std::vector<float> ar(a.numel()), br(bm.numel());
  kern::round_bf16(ar.data(), a.data(), a.numel());
  kern::round_bf16(br.data(), bm.data(), bm.numel());
  for (int t = 0; t < 4; t++) {
    const bool ta = t & 1, tb = t & 2;
    std::vector<float> want = c0.to_vector(), got = c0.to_vector();
    kern::sgemm(ta, tb, M, N, K, 0.5f, ar.data(), ld, br.data(), ld, 1.f, want.data(), ld);
    kern::gemm_bf16(ta, tb, M, N, K, 0.5f, ab.data(), ld, bb.data(), ld, 1.f, got.data(), ld);
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++) worst = std::max(worst, double(std::fabs(want[i] - got[i])));
    BOOST_TEST(worst < 1e-4, "ta " << ta << " tb " << tb << ": max diff " << worst);
  }
}

// A layer wider than one block of the rounded output gradient (kern::linear_bwd_bf16 rounds dy
// to bf16 at most 8 Mi values at a time, in blocks of output columns: here 600 x 30001 = 18 M
// values, three blocks of 10001, 10001 and 9999 columns) has the gradients of the emulated
// precision, which rounds the whole dy at once and multiplies in float32 (sgemm): equal up to
// float32 summation order, the bias gradient (dy's column sums, never rounded) exactly.
BOOST_AUTO_TEST_CASE(bf16_backward_of_a_wide_layer_in_blocks_matches_the_emulated_one,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       test::Precondition r(precision_unavailable(Precision::bf16).empty());
                       if (!r) r.message() << precision_unavailable(Precision::bf16);
                       return r;
                     })) {
  const int64_t rows = 600, in = 8, outf = 30001;
  const Tensor x = randn({rows, in}, 41), w = randn({outf, in}, 42), b = randn({outf}, 43), c = randn({rows, outf}, 44);
  std::vector<std::vector<float>> grads[2];
  const Precision ps[2] = {Precision::bf16, Precision::bf16_emulated};
  for (int k = 0; k < 2; k++) {
    Var xv(x.clone(), true), wv(w.clone(), true), bv(b.clone(), true);
    {
      const Autocast ac(ps[k]);
      backward(sum(mul(linear(xv, wv, bv), Var(c))));
    }
    grads[k] = {xv.grad().to_vector(), wv.grad().to_vector(), bv.grad().to_vector()};
  }
  // dx sums 30001 products of about unit size (|dx| about 170): float32 order differences of
  // a few units in the 7th digit; dw sums 600 of them
  for (int g = 0; g < 2; g++) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < grads[0][g].size(); i++) {
      worst = std::max(worst, double(std::fabs(grads[0][g][i] - grads[1][g][i])));
      scale = std::max(scale, double(std::fabs(grads[1][g][i])));
    }
    BOOST_TEST(worst <= 1e-5 * scale, (g == 0 ? "dx" : "dw") << ": max diff " << worst << " of max " << scale);
  }
  BOOST_TEST(grads[0][2] == grads[1][2], tt::per_element());
}

BOOST_AUTO_TEST_CASE(bf16_without_bf16_instructions_is_refused_in_one_line) {
  const std::string why = precision_unavailable(Precision::bf16);
  if (why.empty()) {
    BOOST_TEST_MESSAGE("this machine runs bf16 natively: nothing to refuse");
    BOOST_TEST(precision_unavailable(Precision::bf16_emulated).empty());
    return;
  }
  BOOST_TEST(why.find('\n') == std::string::npos);
  BOOST_TEST((why.find("avx512_bf16") != std::string::npos || why.find("oneDNN") != std::string::npos), why);
  BOOST_CHECK_EXCEPTION(Autocast(Precision::bf16), Error, [&](const Error& e) { return std::string(e.what()) == why; });
  BOOST_CHECK_EXCEPTION(enum_from_name<Precision>("fp8", "config precision"), Error,
                        [](const Error& e) { return std::string(e.what()).find("f32, bf16 or bf16-emulated") != std::string::npos; });
}

BOOST_AUTO_TEST_SUITE_END()
