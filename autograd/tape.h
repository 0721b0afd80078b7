#pragma once
// Var (a value with an optional gradient) and the tape: a flat list of backward closures recorded
// in forward order, run in reverse, cleared after every step.
#include <functional>
#include <memory>
#include <vector>

#include "autograd/tensor.h"

namespace tapelm {

struct Node {
  Tensor val;
  Tensor grad;  // allocated (zeroed) on first use
  bool requires_grad = false;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor v, bool requires_grad = false);

  bool defined() const { return n_ != nullptr; }
  // Var is a handle, like shared_ptr: a const handle still reaches a mutable node.
  Tensor& val() const { return n_->val; }
  const Shape& shape() const { return n_->val.shape(); }
  int64_t dim(int i) const { return n_->val.dim(i); }
  int ndim() const { return n_->val.ndim(); }
  int64_t numel() const { return n_->val.numel(); }
  float item() const { return n_->val.item(); }
  bool requires_grad() const { return n_ && n_->requires_grad; }
  void set_requires_grad(bool r) const { n_->requires_grad = r; }
  /// The gradient buffer, allocated and zeroed on first call.
  Tensor& grad() const;
  bool has_grad() const { return n_ && n_->grad.defined(); }
  /// Zero the gradient in place (keeps the buffer).
  void zero_grad() const;
  /// Drop the gradient buffer.
  void drop_grad() const { n_->grad = Tensor(); }
  bool same(const Var& o) const { return n_ == o.n_; }
  /// Identity of the underlying node (for de-duplicating shared parameters).
  const void* id() const { return n_.get(); }
  long use_count() const { return n_.use_count(); }

 private:
  std::shared_ptr<Node> n_;
};

/// Is the tape recording on this thread?
bool grad_enabled();

/// Turns recording off for its lifetime (eval, decoding).
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

class Tape {
 public:
  /// The thread's tape.
  static Tape& get();
  void push(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
  size_t size() const { return fns_.size(); }
  /// d out / d everything, seeded with 1 (out must have one element); clears the tape.
  void backward(const Var& out);
  /// Backprop the cotangent `seed` (same shape as out); clears the tape.
  void backward(const Var& out, const Tensor& seed);
  /// Drops every closure and with them the activations they saved.
  void clear() { fns_.clear(); }

 private:
  std::vector<std::function<void()>> fns_;
};

inline void backward(const Var& out) { Tape::get().backward(out); }

/// Records an op: `out` needs a gradient when any input does and recording is on; then `bwd`
/// runs during backward if `out` received a gradient. The closure captures the inputs and out.
Var record(const std::vector<Var>& inputs, Tensor out, std::function<void(const Tensor& dout)> bwd);

}  // namespace tapelm
