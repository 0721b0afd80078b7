// Every op gradient-checked against central differences of <w, f(x)> for a random cotangent w,
// forward values against closed forms, the tape's bookkeeping and the shape errors.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <numeric>

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
    check_grad("linears " + str(xs),
               [](const std::vector<Var>& x) {
                 const std::vector<Var> y = linears(x[0], {x[1], x[2], x[3]}, {x[4], Var(), x[5]});
                 return add(add(mul(y[0], y[0]), y[1]), mul(y[2], y[0]));
               },
               {rnd(xs), rnd({3, in}), rnd({3, in}), rnd({3, in}), rnd({3}), rnd({3})});
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
