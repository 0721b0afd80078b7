// Optimizers, clipping and the schedule: one step against hand-computed numbers, three steps
// against torch.optim on the gqa fixture's gradients (tests/fixtures/optim_reference.h5, written by
// tests/fixtures/make_optim_reference.py), and bit-exact resumption from exported state.
#include <bit>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <numbers>

#include "autograd/float16.h"
#include "autograd/kernels/common.h"
#include "autograd/kernels/optim.h"
#include "autograd/runtime.h"
#include "optim/optim.h"
#include "train/formats/h5file.h"
#include "test_util.h"

using namespace tapelm;
namespace tt = boost::test_tools;
using test::same_bits;

namespace {

Var param(const Shape& s, const std::vector<float>& v) { return Var(Tensor::from(s, v), true); }

void set_grad(const Var& p, const std::vector<float>& g) {
  BOOST_REQUIRE_EQUAL(static_cast<int64_t>(g.size()), p.numel());
  std::copy(g.begin(), g.end(), p.grad().data());
}

void set_grad(const Var& p, const Tensor& g) {
  BOOST_REQUIRE(g.shape() == p.shape());
  std::memcpy(p.grad().data(), g.data(), sizeof(float) * g.numel());
}

NamedParams clone_params(const NamedParams& ps) {
  NamedParams out;
  for (const auto& [name, p] : ps) out.emplace_back(name, Var(p.val().clone(), true));
  return out;
}

// The gqa fixture's parameters, and its gradients by the same names.
struct Fixture {
  NamedParams params;
  std::vector<Tensor> grads;
};

Fixture load_fixture() {
  H5File f = H5File::open_read(test::fixture_path("parity/gqa.h5"));
  Fixture fx;
  for (const auto& name : f.list("/model")) {
    fx.params.emplace_back(name, Var(f.read_tensor("/model/" + name), true));
    fx.grads.push_back(f.read_tensor("/expected/grad/" + name));
  }
  BOOST_REQUIRE(!fx.params.empty());
  return fx;
}

void put_grads(const Fixture& fx) {
  for (size_t i = 0; i < fx.params.size(); i++) set_grad(fx.params[i].second, fx.grads[i]);
}

// Worst deviation of `got` from `want` over a set of tensors.
struct Deviation {
  double max_rel = 0;  // max |a-b| / max |b|, per tensor
  double max_abs = 0;
  int64_t differing = 0, total = 0;
  void add(const std::string& what, const Tensor& got, const Tensor& want) {
    BOOST_REQUIRE_MESSAGE(got.shape() == want.shape(), what << ": shape " << shape_str(got.shape()));
    double dmax = 0, scale = 0;
    for (int64_t i = 0; i < want.numel(); i++) {
      dmax = std::max(dmax, std::abs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      differing += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]);
    }
    total += want.numel();
    max_abs = std::max(max_abs, dmax);
    max_rel = std::max(max_rel, scale > 0 ? dmax / scale : dmax);
  }
};

// Runs 3 steps like make_optim_reference.py and compares parameters and state with /<run>.
void check_against_torch(const std::string& run) {
  Fixture fx = load_fixture();
  H5File ref = H5File::open_read(test::fixture_path("optim_reference.h5"));
  const auto steps = static_cast<int64_t>(ref.read_attr_double("/" + run, "step"));
  const double lr = ref.read_attr_double("/" + run, "lr");
  std::unique_ptr<Optimizer> opt;
  if (run == "adamw")
    opt = std::make_unique<AdamW>(fx.params, lr, ref.read_attr_double("/adamw", "beta1"),
                                  ref.read_attr_double("/adamw", "beta2"), ref.read_attr_double("/adamw", "eps"),
                                  ref.read_attr_double("/adamw", "weight_decay"));
  else
    opt = std::make_unique<SGD>(fx.params, lr, ref.read_attr_double("/sgd", "momentum"),
                                ref.read_attr_double("/sgd", "dampening"), ref.read_attr_double("/sgd", "weight_decay"),
                                ref.read_attr_double("/sgd", "nesterov") != 0);
  std::vector<double> torch_norms;
  if (run == "adamw") torch_norms = ref.read_attr_doubles("/adamw", "grad_norm");
  int same_norms = 0;
  for (int64_t s = 0; s < steps; s++) {
    put_grads(fx);
    if (run == "adamw") {
      const double norm = clip_grad_norm(fx.params, 1.0);
      BOOST_TEST(norm == torch_norms[s], tt::tolerance(1e-6));
      same_norms += static_cast<float>(norm) == static_cast<float>(torch_norms[s]);
    }
    opt->step(lr);
    opt->zero_grad();
  }
  BOOST_TEST(opt->steps() == steps);
  Deviation dev;
  for (const auto& [name, p] : fx.params)
    dev.add(run + "/model/" + name, p.val(), ref.read_tensor("/" + run + "/model/" + name));
  for (const auto& key : opt->state_keys()) {
    const auto& st = opt->state(key);
    BOOST_TEST(st.size() == fx.params.size());
    for (const auto& [name, p] : fx.params) {
      auto it = st.find(name);
      BOOST_REQUIRE_MESSAGE(it != st.end(), "no state " << key << "/" << name);
      dev.add(run + "/" + key + "/" + name, it->second.f32(), ref.read_tensor("/" + run + "/" + key + "/" + name));
    }
  }
  BOOST_TEST_MESSAGE(run << " vs torch.optim after " << steps << " steps: max relative deviation " << dev.max_rel
                         << ", max absolute " << dev.max_abs << ", " << dev.differing << " of " << dev.total
                         << " floats not bit-identical"
                         << (run == "adamw" ? ", float32 grad norm equal to torch's on " + std::to_string(same_norms) +
                                                  " of " + std::to_string(steps) + " steps"
                                            : std::string()));
  // The update reproduces torch's float32 operations one by one; only the clip coefficient could
  // differ (torch sums squares in float32, we in double), by one ulp when the norms round apart.
  BOOST_TEST(dev.max_rel <= 1e-6);
  if (same_norms == steps) BOOST_TEST(dev.differing == 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(optim)

BOOST_AUTO_TEST_CASE(adamw_one_step_hand_computed) {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2 and the bias corrections cancel: p -= lr * g / (|g| + eps).
  // g = 1e-8 = eps shows eps added after the bias correction: the step is lr/2.
  const std::vector<float> p0 = {1.f, -2.f, 0.5f}, g = {0.5f, -0.25f, 1e-8f};
  for (double wd : {0.0, 0.1}) {
    Var w2 = param({1, 3}, p0), w1 = param({3}, p0);
    AdamW opt({{"w2", w2}, {"w1", w1}}, 0.1, 0.9, 0.999, 1e-8, wd);
    set_grad(w2, g);
    set_grad(w1, g);
    opt.step(0.1);
    BOOST_TEST(opt.steps() == 1);
    const float k = wd > 0 ? 0.99f : 1.f;  // 1 - lr*wd, on the 2-D parameter only
    const std::vector<float> want2 = {1.f * k - 0.1f, -2.f * k + 0.1f, 0.5f * k - 0.05f};
    const std::vector<float> want1 = {0.9f, -1.9f, 0.45f};
    BOOST_TEST(w2.val().to_vector() == want2, tt::tolerance(1e-6f) << tt::per_element());
    BOOST_TEST(w1.val().to_vector() == want1, tt::tolerance(1e-6f) << tt::per_element());
    const std::vector<float> m = {0.05f, -0.025f, 1e-9f}, v = {2.5e-4f, 6.25e-5f, 1e-19f};
    BOOST_TEST(opt.state("exp_avg").at("w1").f32().to_vector() == m, tt::tolerance(1e-6f) << tt::per_element());
    BOOST_TEST(opt.state("exp_avg_sq").at("w2").f32().to_vector() == v, tt::tolerance(1e-5f) << tt::per_element());
  }
}

BOOST_AUTO_TEST_CASE(adamw_two_steps_closed_form) {
  const double lr = 0.01, b1 = 0.8, b2 = 0.9, eps = 1e-3, wd = 0.5;
  Var w = param({2, 1}, {1.f, -1.f});
  AdamW opt({{"w", w}}, lr, b1, b2, eps, wd);
  const double g1[2] = {0.3, -0.1}, g2[2] = {-0.2, 0.4};
  double want[2] = {1, -1};
  for (int i = 0; i < 2; i++) {
    double m = (1 - b1) * g1[i], v = (1 - b2) * g1[i] * g1[i];
    want[i] = want[i] * (1 - lr * wd) - lr / (1 - b1) * m / (std::sqrt(v / (1 - b2)) + eps);
    m = b1 * m + (1 - b1) * g2[i];
    v = b2 * v + (1 - b2) * g2[i] * g2[i];
    want[i] = want[i] * (1 - lr * wd) - lr / (1 - b1 * b1) * m / (std::sqrt(v / (1 - b2 * b2)) + eps);
  }
  set_grad(w, {0.3f, -0.1f});
  opt.step(lr);
  set_grad(w, {-0.2f, 0.4f});  // grad() was not dropped: overwrite
  opt.step(lr);
  BOOST_TEST(w.val()[0] == want[0], tt::tolerance(1e-6));
  BOOST_TEST(w.val()[1] == want[1], tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(sgd_plain) {
  Var w = param({2}, {1.f, 2.f});
  SGD opt({{"w", w}}, 0.1);
  set_grad(w, {0.5f, -1.f});
  opt.step(0.1);
  BOOST_TEST(w.val().to_vector() == std::vector<float>({0.95f, 2.1f}), tt::tolerance(1e-7f) << tt::per_element());
  BOOST_TEST(opt.state("momentum_buffer").empty());
}

BOOST_AUTO_TEST_CASE(sgd_momentum_two_steps) {
  // buf = g1, p1 = -lr g1;  buf = 0.9 g1 + g2 = [1.4, -1.3], p2 = p1 - lr buf.
  Var w = param({2}, {0.f, 0.f});
  SGD opt({{"w", w}}, 0.1, 0.9);
  set_grad(w, {1.f, -2.f});
  opt.step(0.1);
  BOOST_TEST(w.val().to_vector() == std::vector<float>({-0.1f, 0.2f}), tt::tolerance(1e-6f) << tt::per_element());
  BOOST_TEST(opt.state("momentum_buffer").at("w").f32().to_vector() == std::vector<float>({1.f, -2.f}), tt::per_element());
  set_grad(w, {0.5f, 0.5f});
  opt.step(0.1);
  BOOST_TEST(opt.state("momentum_buffer").at("w").f32().to_vector() == std::vector<float>({1.4f, -1.3f}),
             tt::tolerance(1e-6f) << tt::per_element());
  BOOST_TEST(w.val().to_vector() == std::vector<float>({-0.24f, 0.33f}), tt::tolerance(1e-6f) << tt::per_element());
}

BOOST_AUTO_TEST_CASE(sgd_nesterov_two_steps) {
  // Step 1: buf = g, d = g + 0.9 g.  Step 2: buf = [1.4, -1.3], d = g2 + 0.9 buf = [1.76, -0.67].
  Var w = param({2}, {0.f, 0.f});
  SGD opt({{"w", w}}, 0.1, 0.9, 0, 0, true);
  set_grad(w, {1.f, -2.f});
  opt.step(0.1);
  BOOST_TEST(w.val().to_vector() == std::vector<float>({-0.19f, 0.38f}), tt::tolerance(1e-6f) << tt::per_element());
  set_grad(w, {0.5f, 0.5f});
  opt.step(0.1);
  BOOST_TEST(w.val().to_vector() == std::vector<float>({-0.366f, 0.447f}), tt::tolerance(1e-6f) << tt::per_element());
}

BOOST_AUTO_TEST_CASE(sgd_weight_decay_on_matrices_only) {
  Var w2 = param({1, 1}, {2.f}), w1 = param({1}, {2.f});
  SGD opt({{"w2", w2}, {"w1", w1}}, 0.1, 0, 0, 0.5);
  set_grad(w2, {0.f});
  set_grad(w1, {0.f});
  opt.step(0.1);
  BOOST_TEST(w2.val()[0] == 1.9f, tt::tolerance(1e-7f));  // d = g + 0.5 p = 1
  BOOST_TEST(w1.val()[0] == 2.f);
}

BOOST_AUTO_TEST_CASE(params_without_grad_are_skipped) {
  Var a = param({2, 2}, {1, 2, 3, 4}), b = param({2, 2}, {1, 2, 3, 4});
  AdamW opt({{"a", a}, {"b", b}}, 0.1, 0.9, 0.99, 1e-8, 0.1);
  set_grad(a, {1, 1, 1, 1});
  opt.step(0.1);
  BOOST_TEST(b.val().to_vector() == std::vector<float>({1, 2, 3, 4}), tt::per_element());
  BOOST_TEST(!b.has_grad());
  BOOST_TEST(opt.state("exp_avg").count("a") == 1);
  BOOST_TEST(opt.state("exp_avg").count("b") == 0);
  opt.zero_grad(false);
  BOOST_TEST(a.has_grad());
  BOOST_TEST(a.grad().to_vector() == std::vector<float>(4, 0.f), tt::per_element());
  opt.zero_grad();
  BOOST_TEST(!a.has_grad());
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_above_and_below) {
  Var a = param({1}, {0}), b = param({1, 1}, {0}), c = param({3}, {0, 0, 0});  // c has no grad
  NamedParams ps = {{"a", a}, {"b", b}, {"c", c}};
  BOOST_TEST(grad_norm(ps) == 0.0);
  set_grad(a, {3.f});
  set_grad(b, {4.f});
  BOOST_TEST(clip_grad_norm(ps, 10.0) == 5.0);
  BOOST_TEST(a.grad()[0] == 3.f);  // coefficient >= 1: untouched
  BOOST_TEST(b.grad()[0] == 4.f);
  BOOST_TEST(clip_grad_norm(ps, 1.0) == 5.0);
  BOOST_TEST(a.grad()[0] == 3.f / (5.f + 1e-6f), tt::tolerance(1e-7f));
  BOOST_TEST(b.grad()[0] == 4.f / (5.f + 1e-6f), tt::tolerance(1e-7f));
  BOOST_TEST(grad_norm(ps) == 1.0, tt::tolerance(1e-6));
  BOOST_TEST(!c.has_grad());
}

BOOST_AUTO_TEST_CASE(lr_schedule) {
  const LrSchedule s{1e-3, 1e-4, 10, 110};
  BOOST_TEST(lr_at(0, s) == 1e-3 / 11, tt::tolerance(1e-12));  // warmup: lr (it+1) / (warmup+1)
  BOOST_TEST(lr_at(9, s) == 1e-3 * 10 / 11, tt::tolerance(1e-12));
  BOOST_TEST(lr_at(10, s) == 1e-3);                              // peak: cos(0)
  BOOST_TEST(lr_at(60, s) == 5.5e-4, tt::tolerance(1e-12));     // middle: half way to min_lr
  BOOST_TEST(lr_at(35, s) == 1e-4 + 0.5 * (1 + std::cos(std::numbers::pi / 4)) * 9e-4, tt::tolerance(1e-12));
  BOOST_TEST(lr_at(110, s) == 1e-4);                             // end: cos(pi)
  BOOST_TEST(lr_at(111, s) == 1e-4);                             // beyond
  BOOST_TEST(lr_at(100000, s) == 1e-4);
  LrSchedule constant = s;
  constant.decay = false;
  BOOST_TEST(lr_at(0, constant) == 1e-3);
  BOOST_TEST(lr_at(500, constant) == 1e-3);
  const LrSchedule no_warmup{1e-3, 1e-4, 0, 100};
  BOOST_TEST(lr_at(0, no_warmup) == 1e-3);
  const LrSchedule degenerate{1e-3, 1e-4, 10, 10};
  BOOST_TEST(lr_at(10, degenerate) == 1e-4);
}

BOOST_AUTO_TEST_CASE(adamw_matches_torch) { check_against_torch("adamw"); }

BOOST_AUTO_TEST_CASE(sgd_matches_torch) { check_against_torch("sgd"); }

BOOST_AUTO_TEST_CASE(state_export_import_is_bit_exact) {
  for (const std::string type : {"adamw", "sgd"}) {
    Fixture fx = load_fixture();
    const std::string hp = type == "adamw" ? AdamW(fx.params, 1e-3, 0.9, 0.99, 1e-8, 0.1).hparams_json()
                                           : SGD(fx.params, 0.1, 0.9, 0, 0.01, true).hparams_json();
    auto a = make_optimizer(type, fx.params, hp);
    BOOST_TEST(a->type() == type);
    BOOST_TEST(a->hparams_json() == hp);
    const double lrs[3] = {1e-3, 7e-4, 3e-4};
    for (int s = 0; s < 2; s++) {
      put_grads(fx);
      clip_grad_norm(fx.params, 1.0);
      a->step(lrs[s]);
      a->zero_grad();
    }
    // A resumed run: copies of the weights, a fresh optimizer from the hyper-parameters, the
    // exported state and step count loaded before its first step.
    NamedParams copy = clone_params(fx.params);
    auto b = make_optimizer(a->type(), copy, a->hparams_json());
    for (const auto& key : a->state_keys())
      for (const auto& [name, t] : a->state(key)) b->state(key)[name] = t.f32().clone();
    b->set_steps(a->steps());
    for (size_t i = 0; i < copy.size(); i++) {
      set_grad(fx.params[i].second, fx.grads[i]);
      set_grad(copy[i].second, fx.grads[i]);
    }
    BOOST_TEST(clip_grad_norm(fx.params, 1.0) == clip_grad_norm(copy, 1.0));
    a->step(lrs[2]);
    b->step(lrs[2]);
    BOOST_TEST(b->steps() == 3);
    for (size_t i = 0; i < copy.size(); i++)
      BOOST_TEST(same_bits(fx.params[i].second.val(), copy[i].second.val()), type << " " << copy[i].first);
    for (const auto& key : a->state_keys())
      for (const auto& [name, t] : a->state(key))
        BOOST_TEST(same_bits(t.f32(), b->state(key).at(name).f32()), type << " " << key << "/" << name);
  }
}

BOOST_AUTO_TEST_CASE(parallel_path_matches_serial) {
  // A parameter big enough for the OpenMP loop, tiled from a small one: every tile must update
  // exactly as the small parameter does.
  const int64_t rows = 2 * kern::kParallelMin / 32;
  Tensor small_w = randn({1, 32}, 7), small_g = randn({1, 32}, 8);
  Tensor big_w = Tensor::empty({rows, 32}), big_g = Tensor::empty({rows, 32});
  for (int64_t r = 0; r < rows; r++) {
    std::memcpy(big_w.data() + r * 32, small_w.data(), 32 * sizeof(float));
    std::memcpy(big_g.data() + r * 32, small_g.data(), 32 * sizeof(float));
  }
  for (const std::string type : {"adamw", "sgd"}) {
    Var s(small_w.clone(), true), b(big_w.clone(), true);
    const std::string hp = R"({"lr": 0.01, "weight_decay": 0.1, "momentum": 0.9, "nesterov": true})";
    auto os = make_optimizer(type, {{"w", s}}, type == "sgd" ? hp : R"({"lr": 0.01, "weight_decay": 0.1})");
    auto ob = make_optimizer(type, {{"w", b}}, type == "sgd" ? hp : R"({"lr": 0.01, "weight_decay": 0.1})");
    for (int step = 0; step < 2; step++) {
      set_grad(s, small_g);
      set_grad(b, big_g);
      os->step(0.01);
      ob->step(0.01);
    }
    bool ok = true;
    for (int64_t r = 0; r < rows; r++)
      ok = ok && std::memcmp(b.val().data() + r * 32, s.val().data(), 32 * sizeof(float)) == 0;
    BOOST_TEST(ok, type);
  }
}

// AdamW with bf16 moments is float32 AdamW run from the moments it stored: each step computes m
// and v in float32 from the stored (widened) ones and moves the weights by those, then keeps each
// rounded to one of its two bf16 neighbours. So, on the gqa fixture's gradients over three steps,
// a float32 AdamW given the bf16 one's moments before each step moves every weight to the same
// bits, and every stored moment is the float32 one's value rounded down or up (the value itself
// when it is a bf16 already), up about as often as down.
BOOST_AUTO_TEST_CASE(bf16_moments_move_the_weights_as_float32_adamw_from_the_same_moments) {
  Fixture fx = load_fixture();
  NamedParams copy = clone_params(fx.params);
  const std::string hp = R"({"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.1)";
  auto a = make_optimizer("adamw", fx.params, hp + R"(, "moments": "bf16"})");
  auto b = make_optimizer("adamw", copy, hp + "}");
  BOOST_TEST(a->hparams_json().find(R"("moments":"bf16")") != std::string::npos);
  BOOST_TEST(b->hparams_json().find("moments") == std::string::npos);
  int64_t up = 0, down = 0, exact = 0;
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < copy.size(); i++) {
      set_grad(fx.params[i].second, fx.grads[i]);
      set_grad(copy[i].second, fx.grads[i]);
    }
    a->step(0.01);
    b->step(0.01);
    for (size_t i = 0; i < copy.size(); i++)
      BOOST_TEST(same_bits(fx.params[i].second.val(), copy[i].second.val()), "step " << step << " " << copy[i].first);
    for (const auto& key : a->state_keys())
      for (const auto& [name, s] : a->state(key)) {
        BOOST_REQUIRE(s.is_bf16());
        const Tensor want = b->state(key).at(name).f32(), got = s.f32();
        for (int64_t j = 0; j < got.numel(); j++) {
          const uint32_t w = float_bits(want[j]), lower = w & 0xFFFF0000u, g = float_bits(got[j]);
          if (w == lower) {
            exact += g == w;
            BOOST_TEST_REQUIRE(g == w, key << "/" << name << "[" << j << "] " << got[j] << " for " << want[j]);
          } else {
            down += g == lower;
            up += g == lower + 0x10000u;
            BOOST_TEST_REQUIRE((g == lower || g == lower + 0x10000u), key << "/" << name << "[" << j << "] " << got[j] << " for " << want[j]);
          }
        }
        b->state(key)[name] = got.clone();  // the next step starts both from the bf16 moments
      }
  }
  BOOST_TEST_MESSAGE("bf16 moments: " << up << " rounded up, " << down << " down, " << exact << " exact");
  BOOST_TEST(up + down > 1000);
  BOOST_TEST(std::abs(static_cast<double>(up - down)) < 0.2 * static_cast<double>(up + down));
}

// The rounding is unbiased. Of the 2^16 values of the random bits, exactly as many carry into the
// kept bits as the 16 dropped bits count (L): x rounds up for L of them, so the mean over all of
// them is lower + L/2^16 · (upper − lower) = x, exactly (in double, for either sign).
BOOST_AUTO_TEST_CASE(stochastic_bf16_rounding_is_unbiased) {
  for (const float x : {1.0f, 0.3f, -0.3f, 1e-20f, 0.99999f, -7.123456e5f}) {
    double sum = 0;
    for (uint32_t r = 0; r < 65536; r++) sum += bf16_to_f32(kern::bf16_round_stochastic(x, r));
    BOOST_TEST(sum / 65536 == static_cast<double>(x), x);
  }
  BOOST_TEST(std::isnan(bf16_to_f32(kern::bf16_round_stochastic(std::nanf(""), 0xFFFF))));
  BOOST_TEST(bf16_to_f32(kern::bf16_round_stochastic(-INFINITY, 0xFFFF)) == -INFINITY);
}

// Why the rounding is stochastic: with beta2 0.999 and a constant gradient 1, v_t = 1 − 0.999^t
// (0.632 at t = 1000). Each step adds 0.001·(1 − v), below half of bf16's gap (2^-9 in [0.5, 1))
// once v passes about 0.5, so v rounded to nearest stops there; rounded stochastically it reaches
// 0.632 in expectation. Over 20000 elements (each its own random bits) the mean is within 0.002 of
// it: the stationary spread of one element is about 0.02 (rounding noise of at most 2^-10 a step,
// decaying by 0.999), 1.5e-4 for the mean of 20000. The parameter is large enough for the threaded
// loop, and 1 or 2 threads give the same bits (each element's bits come from its index).
BOOST_AUTO_TEST_CASE(bf16_second_moments_follow_small_increments_in_expectation) {
  const int steps = 1000;
  const double want = 1 - std::pow(0.999, steps);
  float nearest = 0;
  for (int t = 0; t < steps; t++) nearest = bf16_to_f32(f32_to_bf16(std::fma(0.001f, 1.f, nearest * 0.999f)));
  BOOST_TEST(want - nearest > 0.05, "nearest rounding stalls at " << nearest);
  const int64_t n = 20000;
  BOOST_REQUIRE(n >= kern::kParallelMin);
  std::vector<std::vector<float>> moments;
  for (const int threads : {1, 2}) {
    const int before = get_num_threads();
    set_num_threads(threads);
    BOOST_REQUIRE(get_num_threads() == threads);
    Var w(Tensor::zeros({n}), true);
    auto opt = make_optimizer("adamw", {{"w", w}}, R"({"lr": 0, "beta2": 0.999, "moments": "bf16"})");
    for (int t = 0; t < steps; t++) {
      w.grad().fill(1.f);
      opt->step(0);
    }
    set_num_threads(before);
    moments.push_back(opt->state("exp_avg_sq").at("w").f32().to_vector());
  }
  double mean = 0;
  for (const float v : moments[0]) mean += v;
  mean /= n;
  BOOST_TEST(std::abs(mean - want) < 0.002, "mean v " << mean << ", f32 " << want);
  BOOST_TEST(std::memcmp(moments[0].data(), moments[1].data(), n * sizeof(float)) == 0);
}

// Moments exported in float32 (a checkpoint's) and loaded into a bf16 AdamW are kept in bf16;
// float32 state set into it is rounded to nearest, exactly for values that are bf16 already.
BOOST_AUTO_TEST_CASE(bf16_moments_adopt_float32_state) {
  Var w = param({2}, {1, 2});
  auto opt = make_optimizer("adamw", {{"w", w}}, R"({"lr": 0.1, "moments": "bf16"})");
  const StateBuf s = opt->adopt_state(Tensor::from({2}, {0.5f, 1.0f + 1.0f / 512}));  // 1 + 2^-9: a tie, to even
  BOOST_TEST(s.is_bf16());
  BOOST_TEST(s.f32().to_vector() == std::vector<float>({0.5f, 1.0f}), tt::per_element());
  opt->state("exp_avg")["w"] = Tensor::from({2}, {0.25f, 0.125f});
  opt->state("exp_avg_sq")["w"] = s;
  set_grad(w, {0, 0});
  opt->step(0.1);
  BOOST_TEST(opt->state("exp_avg").at("w").is_bf16());
  // m = 0.9 m: 0.225 and 0.1125 (float32), each kept as one of its two bf16 neighbours
  const std::vector<float> m = opt->state("exp_avg").at("w").f32().to_vector();
  for (int i = 0; i < 2; i++) {
    const float want = 0.9f * (i == 0 ? 0.25f : 0.125f);
    const uint32_t lower = float_bits(want) & 0xFFFF0000u, got = float_bits(m[i]);
    BOOST_TEST((got == lower || got == lower + 0x10000u), m[i] << " for " << want);
  }
  BOOST_CHECK_THROW(make_optimizer("adamw", {{"w", w}}, R"({"moments": "int8"})"), Error);
}

BOOST_AUTO_TEST_CASE(rejects_bad_params_state_and_hparams) {
  Var w = param({2, 2}, {1, 2, 3, 4}), v = param({2}, {1, 2});
  BOOST_CHECK_THROW(AdamW({{"w", w}, {"w", v}}, 1e-3), Error);  // one name twice
  BOOST_CHECK_THROW(AdamW({{"w", w}, {"tied", w}}, 1e-3), Error);  // one Var twice
  BOOST_CHECK_THROW(AdamW({{"w", w}}, 1e-3, 1.0), Error);
  BOOST_CHECK_THROW(SGD({{"w", w}}, 0.1, 0, 0, 0, true), Error);  // nesterov without momentum
  AdamW opt({{"w", w}}, 1e-3);
  BOOST_CHECK_THROW(opt.state("momentum_buffer"), Error);
  set_grad(w, {1, 1, 1, 1});
  opt.state("exp_avg")["w"] = Tensor::zeros({4});
  BOOST_CHECK_EXCEPTION(opt.step(1e-3), Error, test::is_kind(ErrorKind::shape));
  opt.state("exp_avg").clear();
  opt.state("exp_avg_sq")["nope"] = Tensor::zeros({2, 2});
  BOOST_CHECK_THROW(opt.step(1e-3), Error);
  opt.state("exp_avg_sq").clear();
  BOOST_TEST(opt.steps() == 0);  // failed steps change nothing
  BOOST_TEST(w.val().to_vector() == std::vector<float>({1, 2, 3, 4}), tt::per_element());
  opt.step(1e-3);
  BOOST_TEST(opt.steps() == 1);
  BOOST_CHECK_THROW(make_optimizer("adam", {{"w", w}}, "{}"), Error);
  BOOST_CHECK_THROW(make_optimizer("adamw", {{"x", v}}, R"({"momentum": 0.9})"), Error);
  BOOST_CHECK_THROW(make_optimizer("sgd", {{"x", v}}, R"({"lr": "fast"})"), Error);
}

BOOST_AUTO_TEST_SUITE_END()
