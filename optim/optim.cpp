#include "optim/optim.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <stdexcept>

#include "autograd/float16.h"
#include "autograd/json_read.h"
#include "autograd/splitmix.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/optim.h"
#include "autograd/kernels/reduce.h"

// PyTorch rounds every op on its own except where its kernels fuse (add with alpha, addcmul use
// FMA), so contraction is off here and the fused ones are spelled std::fma.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tapelm {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw Error(ErrorKind::config, what);
}

}  // namespace

// ---- StateBuf ----------------------------------------------------------------------------
StateBuf StateBuf::bf16_empty(const Shape& shape) {
  StateBuf b;
  b.shape_ = shape;
  b.b_ = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(std::max<int64_t>(shape_numel(shape), 1))]);
  return b;
}

StateBuf StateBuf::bf16_of(const Tensor& t) {
  StateBuf b = bf16_empty(t.shape());
  kern::to_bf16(b.b_.get(), t.data(), t.numel());
  return b;
}

Tensor StateBuf::f32() const {
  if (!b_) return t_;
  Tensor t = Tensor::empty(shape_);
  float* dst = t.data();
  for (int64_t i = 0; i < t.numel(); i++) dst[i] = bf16_to_f32(b_[static_cast<size_t>(i)]);
  return t;
}

// ---- Optimizer ---------------------------------------------------------------------------
Optimizer::Optimizer(NamedParams params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); i++) {
    const auto& [name, var] = params_[i];
    require(var.defined(), "optimizer: parameter '" + name + "' is undefined");
    require(index_.emplace(name, i).second, "optimizer: parameter name '" + name + "' appears twice");
    for (size_t j = 0; j < i; j++)
      require(!params_[j].second.same(var), "optimizer: parameters '" + params_[j].first + "' and '" + name +
                                                "' are one Var (list a tied weight once)");
  }
}

std::map<std::string, StateBuf>& Optimizer::state(const std::string& key) {
  const auto keys = state_keys();
  require(std::find(keys.begin(), keys.end(), key) != keys.end(),
          "optimizer " + type() + ": no state '" + key + "'");
  return state_[key];
}

const std::map<std::string, StateBuf>& Optimizer::state(const std::string& key) const {
  static const std::map<std::string, StateBuf> empty;
  const auto keys = state_keys();
  require(std::find(keys.begin(), keys.end(), key) != keys.end(),
          "optimizer " + type() + ": no state '" + key + "'");
  auto it = state_.find(key);
  return it == state_.end() ? empty : it->second;
}

void Optimizer::set_steps(int64_t steps) {
  require(steps >= 0, "optimizer: negative step count");
  steps_ = steps;
}

void Optimizer::check_state() const {
  for (const auto& [key, by_name] : state_)
    for (const auto& [name, t] : by_name) {
      auto it = index_.find(name);
      if (it == index_.end())
        throw Error(ErrorKind::checkpoint, "optimizer: state " + key + "/" + name + " names no parameter");
      const Var& p = params_[it->second].second;
      if (!t.defined() || t.shape() != p.shape())
        throw Error(ErrorKind::shape, "optimizer: state " + key + "/" + name + " has shape " +
                         (t.defined() ? shape_str(t.shape()) : std::string("(none)")) + ", parameter " +
                         shape_str(p.shape()));
    }
}

StateBuf& Optimizer::state_for(const std::string& key, const std::string& name, const Var& p, bool& fresh, bool bf16) {
  auto& by_name = state_[key];
  auto it = by_name.find(name);
  fresh = it == by_name.end();
  if (fresh)
    it = by_name.emplace(name, bf16 ? StateBuf::bf16_empty(p.shape()) : StateBuf(Tensor::empty(p.shape()))).first;
  else if (it->second.is_bf16() != bf16)  // set from outside in the other type
    it->second = bf16 ? StateBuf::bf16_of(it->second.tensor()) : StateBuf(it->second.f32());
  return it->second;
}

void Optimizer::step(double lr) {
  check_state();
  steps_++;
  for (const auto& [name, p] : params_)
    if (p.has_grad()) update(name, p, lr);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const auto& [name, p] : params_) {
    if (!p.has_grad()) continue;
    if (set_to_none)
      p.drop_grad();
    else
      p.zero_grad();
  }
}

// ---- AdamW -------------------------------------------------------------------------------
AdamW::AdamW(NamedParams params, double lr, double beta1, double beta2, double eps, double weight_decay, Moments moments)
    : Optimizer(std::move(params)), h_{lr, beta1, beta2, eps, weight_decay, moments} {
  require(lr >= 0, "adamw: lr must be >= 0");
  require(eps >= 0, "adamw: eps must be >= 0");
  require(beta1 >= 0 && beta1 < 1, "adamw: beta1 must be in [0, 1)");
  require(beta2 >= 0 && beta2 < 1, "adamw: beta2 must be in [0, 1)");
  require(weight_decay >= 0, "adamw: weight_decay must be >= 0");
}

std::string AdamW::hparams_json() const {
  nlohmann::json j{{"lr", h_.lr}, {"beta1", h_.beta1}, {"beta2", h_.beta2}, {"eps", h_.eps}, {"weight_decay", h_.weight_decay}};
  if (h_.moments != Moments::f32) j["moments"] = to_string(h_.moments);
  return j.dump();
}

StateBuf AdamW::adopt_state(const Tensor& t) const {
  return h_.moments == Moments::bf16 ? StateBuf::bf16_of(t) : StateBuf(t);
}

namespace {
// The key of a parameter's bf16 rounding bits at step t: FNV-1a of the name mixed with the step,
// so that each (name, step) draws its own stream whichever rank updates the parameter.
uint64_t rounding_key(const std::string& name, int64_t step) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(h ^ splitmix64(static_cast<uint64_t>(step)));
}
}  // namespace

void AdamW::update(const std::string& name, const Var& p, double lr) {
  const bool bf16 = h_.moments == Moments::bf16;
  bool fresh_m, fresh_v;
  StateBuf& m_t = state_for("exp_avg", name, p, fresh_m, bf16);
  StateBuf& v_t = state_for("exp_avg_sq", name, p, fresh_v, bf16);
  if (bf16) {
    if (fresh_m) std::fill_n(m_t.bf16_data(), p.numel(), uint16_t{0});
    if (fresh_v) std::fill_n(v_t.bf16_data(), p.numel(), uint16_t{0});
  } else {
    if (fresh_m) m_t.tensor().zero();
    if (fresh_v) v_t.tensor().zero();
  }
  const double t = static_cast<double>(steps());
  const double bc1 = 1.0 - std::pow(h_.beta1, t), bc2 = 1.0 - std::pow(h_.beta2, t);
  // Each Python-float scalar becomes a float32 at torch's kernel.
  const float decay = static_cast<float>(1.0 - lr * (p.ndim() >= 2 ? h_.weight_decay : 0.0));
  const float b1 = static_cast<float>(h_.beta1), c1 = static_cast<float>(1.0 - h_.beta1);
  const float b2 = static_cast<float>(h_.beta2), c2 = static_cast<float>(1.0 - h_.beta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2)), eps = static_cast<float>(h_.eps);
  const float neg_step = static_cast<float>(-(lr / bc1));
  const kern::AdamWScalars k{decay, b1, c1, b2, c2, bc2_sqrt, eps, neg_step};
  if (bf16)
    kern::adamw_update_bf16(p.val().data(), p.grad().data(), m_t.bf16_data(), v_t.bf16_data(), p.numel(), k,
                            rounding_key(name, steps()));
  else
    kern::adamw_update(p.val().data(), p.grad().data(), m_t.tensor().data(), v_t.tensor().data(), p.numel(), k);
}

// ---- SGD ---------------------------------------------------------------------------------
SGD::SGD(NamedParams params, double lr, double momentum, double dampening, double weight_decay, bool nesterov)
    : Optimizer(std::move(params)), h_{lr, momentum, dampening, weight_decay, nesterov} {
  require(lr >= 0, "sgd: lr must be >= 0");
  require(momentum >= 0, "sgd: momentum must be >= 0");
  require(weight_decay >= 0, "sgd: weight_decay must be >= 0");
  require(!nesterov || (momentum > 0 && dampening == 0), "sgd: nesterov needs momentum > 0 and dampening 0");
}

std::string SGD::hparams_json() const {
  return nlohmann::json{{"lr", h_.lr},
                        {"momentum", h_.momentum},
                        {"dampening", h_.dampening},
                        {"weight_decay", h_.weight_decay},
                        {"nesterov", h_.nesterov}}
      .dump();
}

void SGD::update(const std::string& name, const Var& p, double lr) {
  const bool decay = h_.weight_decay != 0 && p.ndim() >= 2;
  const float wd = static_cast<float>(h_.weight_decay), mu = static_cast<float>(h_.momentum);
  const float keep = static_cast<float>(1.0 - h_.dampening), neg_lr = static_cast<float>(-lr);
  if (h_.momentum == 0) {
    kern::sgd_update(p.val().data(), p.grad().data(), p.numel(), neg_lr, decay, wd);
    return;
  }
  bool fresh;
  float* buf = state_for("momentum_buffer", name, p, fresh).tensor().data();
  kern::sgd_momentum_update(p.val().data(), p.grad().data(), buf, p.numel(), neg_lr, decay, wd, mu, keep, fresh,
                            h_.nesterov);
}

// ---- factory, clipping, schedule ---------------------------------------------------------
std::unique_ptr<Optimizer> make_optimizer(const std::string& type, NamedParams params,
                                          const std::string& hparams_json) {
  const auto j = parse_json(hparams_json, "optimizer hyperparameters", ErrorKind::checkpoint);
  require(j.is_object(), "optimizer hyper-parameters: not a JSON object");
  auto take = [&](const std::map<std::string, double*>& reals, bool* flag, Moments* moments) {
    for (const auto& [key, value] : j.items()) {
      if (auto it = reals.find(key); it != reals.end() && value.is_number())
        *it->second = value.get<double>();
      else if (flag && key == "nesterov" && value.is_boolean())
        *flag = value.get<bool>();
      else if (moments && key == "moments" && value.is_string())
        *moments = enum_from_name<Moments>(value.get<std::string>(), "optimizer " + type + ": moments", ErrorKind::config);
      else
        throw Error(ErrorKind::config, "optimizer " + type + ": bad hyper-parameter '" + key + "': " + value.dump());
    }
  };
  if (type == "adamw") {
    AdamW::Hparams h;
    take({{"lr", &h.lr}, {"beta1", &h.beta1}, {"beta2", &h.beta2}, {"eps", &h.eps}, {"weight_decay", &h.weight_decay}},
         nullptr, &h.moments);
    return std::make_unique<AdamW>(std::move(params), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.moments);
  }
  if (type == "sgd") {
    SGD::Hparams h;
    take({{"lr", &h.lr}, {"momentum", &h.momentum}, {"dampening", &h.dampening}, {"weight_decay", &h.weight_decay}},
         &h.nesterov, nullptr);
    return std::make_unique<SGD>(std::move(params), h.lr, h.momentum, h.dampening, h.weight_decay, h.nesterov);
  }
  throw Error(ErrorKind::config, "unknown optimizer '" + type + "' (adamw or sgd)");
}

double grad_sumsq(const Var& p) { return p.has_grad() ? kern::sumsq_all(p.grad().data(), p.numel()) : 0.0; }

double grad_sumsq(const NamedParams& params) {
  double sumsq = 0;
  for (const auto& [name, p] : params) sumsq += grad_sumsq(p);
  return sumsq;
}

double grad_norm(const NamedParams& params) { return std::sqrt(grad_sumsq(params)); }

std::string first_non_finite_grad(const NamedParams& params) {
  for (const auto& [name, p] : params)
    if (!std::isfinite(grad_sumsq(p))) return name;
  return "";
}

double clip_grad_norm(const NamedParams& params, double max_norm) {
  const double total = grad_norm(params);
  clip_grads_to(params, total, max_norm);
  return total;
}

void clip_grads_to(const NamedParams& params, double total, double max_norm) {
  // torch: max_norm / (total + 1e-6) is (total + 1e-6).reciprocal() * max_norm in float32.
  const float coef = (1.0f / (static_cast<float>(total) + 1e-6f)) * static_cast<float>(max_norm);
  if (coef >= 1.0f) return;  // a NaN coefficient falls through, as through torch's clamp
  for (const auto& [name, p] : params) {
    if (p.has_grad()) p.grad().scale_(coef);
  }
}

double lr_at(int64_t it, const LrSchedule& s) {
  if (!s.decay) return s.lr;
  if (it < s.warmup_iters) return s.lr * static_cast<double>(it + 1) / static_cast<double>(s.warmup_iters + 1);
  // lr_decay_iters <= warmup_iters: no decay phase (nanoGPT would divide by zero at it == warmup).
  if (it > s.lr_decay_iters || s.lr_decay_iters <= s.warmup_iters) return s.min_lr;
  const double ratio =
      static_cast<double>(it - s.warmup_iters) / static_cast<double>(s.lr_decay_iters - s.warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return s.min_lr + coeff * (s.lr - s.min_lr);
}

}  // namespace tapelm
