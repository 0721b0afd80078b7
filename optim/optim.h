#pragma once
// Optimizers with state kept by parameter name, global-norm gradient clipping and nanoGPT's
// learning-rate schedule. Updates reproduce torch 1.13's single-tensor (foreach=False) CPU paths
// operation by operation in float32, so a step matches PyTorch to the last bit given the same
// gradients; the scalars (lr, betas, bias corrections) are computed in double as Python does.
//
// A training step, with gradient accumulation over k micro-batches:
//
//   for (int i = 0; i < k; i++) backward(loss_i * (1.f / k));   // backward adds into grad()
//   double norm = clip_grad_norm(params, grad_clip);             // once, on the summed gradient
//   opt.step(lr_at(it, schedule));
//   opt.zero_grad();                                             // before the next step's backward
//
// Nothing in here touches gradients between backward passes, so they accumulate untouched.
// A tied weight is one Var listed once; its gradient already sums every use.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/error.h"
#include "autograd/names.h"
#include "autograd/tape.h"

namespace tapelm {

using NamedParams = std::vector<std::pair<std::string, Var>>;

/// What AdamW keeps its two moments in: float32 (8 bytes a parameter), or bfloat16 rounded
/// stochastically (4 bytes a parameter; kern::adamw_update_bf16).
enum class Moments { f32, bf16 };
template <> struct EnumNames<Moments> {
  static constexpr std::array<std::pair<Moments, const char*>, 2> values{{{Moments::f32, "f32"}, {Moments::bf16, "bf16"}}};
};

/// One optimizer state tensor, in float32 or in bfloat16. A float32 one shares the Tensor it was
/// made from. Ranks exchange every state in float32 (f32(), exact for bf16); checkpoints keep a
/// bf16 one as a 16-bit dataset, read back widened.
class StateBuf {
 public:
  StateBuf() = default;
  /// Float32, sharing t's storage (so that `state(key)[name] = tensor` reads as it says).
  StateBuf(Tensor t) : t_(std::move(t)) {}  // NOLINT(google-explicit-constructor)
  /// t rounded to the nearest bfloat16 (exact when t's values are bf16 already).
  static StateBuf bf16_of(const Tensor& t);
  /// Uninitialised bfloat16 storage of the given shape.
  static StateBuf bf16_empty(const Shape& shape);

  bool defined() const { return t_.defined() || b_ != nullptr; }
  bool is_bf16() const { return b_ != nullptr; }
  const Shape& shape() const { return b_ ? shape_ : t_.shape(); }
  int64_t numel() const { return b_ ? shape_numel(shape_) : t_.numel(); }
  /// The values in float32: the tensor itself, or a widened copy.
  Tensor f32() const;
  /// The float32 tensor (is_bf16() false).
  Tensor& tensor() { return t_; }
  /// The bfloat16 bits (is_bf16() true).
  uint16_t* bf16_data() { return b_.get(); }
  const uint16_t* bf16_data() const { return b_.get(); }
  /// The stored bytes, for checksums: 4 or 2 a value.
  const void* bytes() const { return b_ ? static_cast<const void*>(b_.get()) : static_cast<const void*>(t_.data()); }
  size_t byte_size() const { return static_cast<size_t>(numel()) * (b_ ? 2 : 4); }

 private:
  Tensor t_;
  std::shared_ptr<uint16_t[]> b_;
  Shape shape_;
};

class Optimizer {
 public:
  /// Takes the parameters to update; names must be unique and each Var listed once.
  explicit Optimizer(NamedParams params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update at learning rate lr of every parameter that has a gradient (the others are
  /// skipped, as PyTorch skips grad=None); creates missing state on the way.
  void step(double lr);
  /// Drops every gradient (PyTorch's set_to_none=True, nanoGPT's choice) or zeroes it in place.
  void zero_grad(bool set_to_none = true);

  /// "adamw" or "sgd".
  virtual std::string type() const = 0;
  /// The hyper-parameters as a JSON object; make_optimizer reads it back.
  virtual std::string hparams_json() const = 0;
  /// Names of the per-parameter state tensors, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> state_keys() const = 0;
  /// State tensors of one key by parameter name; absent until a parameter's first step, and may
  /// be filled from a checkpoint before it (shapes are checked at the next step).
  std::map<std::string, StateBuf>& state(const std::string& key);
  const std::map<std::string, StateBuf>& state(const std::string& key) const;
  /// A state tensor read from a checkpoint or another rank, in the form this optimizer keeps it
  /// (bfloat16 moments: rounded to nearest, exact for what a bf16 run saved).
  virtual StateBuf adopt_state(const Tensor& t) const { return StateBuf(t); }

  /// Number of steps taken (the step count of the bias corrections).
  int64_t steps() const { return steps_; }
  /// Restores the step count from a checkpoint.
  void set_steps(int64_t steps);
  const NamedParams& params() const { return params_; }

 protected:
  /// Updates one parameter at step t = steps() (already incremented).
  virtual void update(const std::string& name, const Var& p, double lr) = 0;
  /// The state tensor of key for p; created uninitialised when absent (fresh = true: the caller
  /// fills it), in bfloat16 when bf16; one held in the other type is converted.
  StateBuf& state_for(const std::string& key, const std::string& name, const Var& p, bool& fresh, bool bf16 = false);

 private:
  void check_state() const;

  NamedParams params_;
  std::map<std::string, size_t> index_;  // name -> position in params_
  int64_t steps_ = 0;
  std::map<std::string, std::map<std::string, StateBuf>> state_;
};

/// torch.optim.AdamW with decoupled weight decay on >= 2-D parameters only (nanoGPT's groups):
/// p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
/// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
/// With Moments::bf16, m and v are stored in bfloat16 (kern::adamw_update_bf16), the random bits
/// of their rounding keyed by the parameter's name and the step.
class AdamW : public Optimizer {
 public:
  struct Hparams {
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
    Moments moments = Moments::f32;
  };
  /// lr is the base rate recorded in hparams_json(); step() takes the rate of each step.
  AdamW(NamedParams params, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01, Moments moments = Moments::f32);
  std::string type() const override { return "adamw"; }
  /// "moments" appears only when bf16, so float32 runs' checkpoints read as before.
  std::string hparams_json() const override;
  std::vector<std::string> state_keys() const override { return {"exp_avg", "exp_avg_sq"}; }
  StateBuf adopt_state(const Tensor& t) const override;
  const Hparams& hparams() const { return h_; }

 private:
  void update(const std::string& name, const Var& p, double lr) override;
  Hparams h_;
};

/// torch.optim.SGD: d = g + wd*p;  buf = momentum*buf + (1-dampening)*d (buf = d on the first
/// step);  d = nesterov ? d + momentum*buf : buf;  p -= lr*d.  Unlike torch's single group, weight
/// decay applies to >= 2-D parameters only, as in AdamW, so switching optimizers keeps the groups.
class SGD : public Optimizer {
 public:
  struct Hparams {
    double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
    bool nesterov = false;
  };
  /// lr is the base rate recorded in hparams_json(); step() takes the rate of each step.
  SGD(NamedParams params, double lr, double momentum = 0, double dampening = 0, double weight_decay = 0,
      bool nesterov = false);
  std::string type() const override { return "sgd"; }
  std::string hparams_json() const override;
  /// {"momentum_buffer"}; its map stays empty when momentum is 0.
  std::vector<std::string> state_keys() const override { return {"momentum_buffer"}; }
  const Hparams& hparams() const { return h_; }

 private:
  void update(const std::string& name, const Var& p, double lr) override;
  Hparams h_;
};

/// An optimizer of the given type from hparams_json() output (missing keys take the defaults).
std::unique_ptr<Optimizer> make_optimizer(const std::string& type, NamedParams params,
                                          const std::string& hparams_json);

/// L2 norm of all gradients together, in double (parameters without a gradient count as 0).
double grad_norm(const NamedParams& params);
/// grad_norm's square before its root: Σ over the parameters, in order, of each one's sum of squares.
double grad_sumsq(const NamedParams& params);
/// One parameter's part of grad_sumsq: its gradient's sum of squares in double (0 without one).
double grad_sumsq(const Var& p);
/// The name of the first parameter whose gradient holds a NaN or Inf, or "" (what makes grad_norm
/// non-finite).
std::string first_non_finite_grad(const NamedParams& params);
/// torch.nn.utils.clip_grad_norm_: scales every gradient by max_norm / (norm + 1e-6) when that is
/// below 1; returns the norm before clipping.
double clip_grad_norm(const NamedParams& params, double max_norm);
/// clip_grad_norm's scaling for a norm `total` computed elsewhere (over every rank's share of the
/// gradients): the gradients present in params are scaled as clip_grad_norm would scale them.
void clip_grads_to(const NamedParams& params, double total, double max_norm);

struct LrSchedule {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_iters = 0, lr_decay_iters = 0;
  bool decay = true;
};
/// nanoGPT's get_lr: linear warmup lr*(it+1)/(warmup+1), cosine decay to min_lr at lr_decay_iters,
/// min_lr after; the constant lr when decay is off.
double lr_at(int64_t it, const LrSchedule& s);

}  // namespace tapelm
