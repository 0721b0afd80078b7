#pragma once
// Var (a value with an optional gradient), recording control and backward: what the layers above
// need of the tape. The tape itself, a flat list of backward closures recorded in forward order,
// run in reverse and cleared after every step, and record(), which ops use to append to it, are in
// autograd/record.h, for autograd's own ops.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/tensor.h"

namespace tapelm {

struct Node {
  Tensor val;
  Tensor grad;  // allocated (zeroed) on first use
  Shape shape;  // val's, kept for the gradient once val is freed (see GradSlot)
  bool requires_grad = false;
};

/// What every copy of one Var shares: its node, and with it the value. When the last Var of a
/// node goes while a GradSlot still holds the node, the value is freed (the gradient stays).
struct ValueHold {
  explicit ValueHold(std::shared_ptr<Node> node) : n(std::move(node)) {}
  ~ValueHold();
  ValueHold(const ValueHold&) = delete;
  ValueHold& operator=(const ValueHold&) = delete;
  std::shared_ptr<Node> n;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor v, bool requires_grad = false);

  bool defined() const { return h_ != nullptr; }
  // Var is a handle, like shared_ptr: a const handle still reaches a mutable node.
  Tensor& val() const { return n()->val; }
  const Shape& shape() const { return n()->val.shape(); }
  int64_t dim(int i) const { return n()->val.dim(i); }
  int ndim() const { return n()->val.ndim(); }
  int64_t numel() const { return n()->val.numel(); }
  float item() const { return n()->val.item(); }
  bool requires_grad() const { return h_ && n()->requires_grad; }
  void set_requires_grad(bool r) const { n()->requires_grad = r; }
  /// The gradient buffer, allocated and zeroed on first call.
  Tensor& grad() const;
  bool has_grad() const { return h_ && n()->grad.defined(); }
  /// Zero the gradient in place (keeps the buffer).
  void zero_grad() const;
  /// Drop the gradient buffer.
  void drop_grad() const { n()->grad = Tensor(); }
  /// Frees the value and keeps the node, its gradient and its shape (a parameter another rank
  /// holds between uses: ZeRO stage 3). Recorded ops that read the value read whatever val() holds
  /// when their backward runs, so it must be put back (same shape) before then.
  void release_value() const;
  bool same(const Var& o) const { return n() == o.n(); }
  /// Identity of the underlying node (for de-duplicating shared parameters).
  const void* id() const { return n(); }
  /// Holders of the node: the Vars' one shared hold and each GradSlot (a recorded op's closure).
  long use_count() const { return h_ ? h_->n.use_count() : 0; }

 private:
  friend class GradSlot;
  Node* n() const { return h_ ? h_->n.get() : nullptr; }
  std::shared_ptr<ValueHold> h_;
};

/// A Var's gradient without its value: what a recorded op's backward holds of an input or output
/// whose value it does not read (PyTorch's saved tensors: backward keeps what it reads). While any
/// Var of the node lives, the value does too; once the last one goes, the value is freed and the
/// gradient slot stays for backward to fill and read. The output of every op is held so, and the
/// input of a bf16 linear layer (its backward reads the bf16 copy), so `precision: bf16` keeps
/// the 16-bit copies of those activations instead of both copies.
class GradSlot {
 public:
  GradSlot() = default;
  explicit GradSlot(const Var& v) : n_(v.h_ ? v.h_->n : nullptr) {}
  bool defined() const { return n_ != nullptr; }
  bool requires_grad() const { return n_ && n_->requires_grad; }
  /// The gradient buffer, allocated and zeroed (in the Var's shape) on first call.
  Tensor& grad() const;
  bool has_grad() const { return n_ && n_->grad.defined(); }

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

/// d out / d everything that requires a gradient, seeded with 1 (out must have one element). Runs
/// the thread's tape in reverse and clears it.
void backward(const Var& out);
/// Backprop the cotangent `seed` (same shape as out); clears the tape.
void backward(const Var& out, const Tensor& seed);

/// Gradient-ready hooks (PyTorch DDP's and DeepSpeed ZeRO-2's per-parameter hooks): while one is
/// alive on a thread, each backward on that thread calls `ready(i)` for the watched Var i as soon as
/// no op left to run can add to its gradient — right after the earliest recorded op that took it as
/// an input has run. A gradient can then be reduced to the rank that keeps it, and dropped, while
/// backward goes on. Watched Vars that no recorded op took are not reported. Calls come in the
/// reverse order of first use, the same in every run of the same forward; a checkpointed block's
/// inner forward and backward (see checkpoint) report nothing of their own: the block's recorded op
/// is the use. One hook per thread at a time.
class GradReadyHook {
 public:
  GradReadyHook(const std::vector<Var>& watched, std::function<void(size_t)> ready);
  ~GradReadyHook();
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;
};

/// Activation checkpointing (torch.utils.checkpoint): out = fn(x), computed without recording, so
/// that nothing fn computes on the way is kept; one op is recorded in its place whose backward runs
/// fn(x) again with recording on, then backward through that, seeded with out's gradient. fn must
/// compute the same values both times (a dropout stream restored by fn itself) and may read only x
/// and `params` as recorded inputs; gradients are those of fn recorded directly, bit for bit.
Var checkpoint(const Var& x, const std::vector<Var>& params, const std::function<Var(const Var&)>& fn);

/// Records `fn` to run when backward reaches this point of the tape: after every op recorded later
/// has run its backward and before any op recorded earlier does, whether or not a gradient flows
/// here (PyTorch's FSDP uses module hooks for this: its parameters gathered before a block's
/// backward and freed after it). Nothing is recorded when recording is off.
void on_backward(std::function<void()> fn);

/// Drops the thread's recorded ops and with them the activations they saved (after a forward
/// whose backward will not run).
void clear_tape();
/// Number of ops recorded on the thread's tape.
size_t tape_size();

}  // namespace tapelm
