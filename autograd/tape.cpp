#include "autograd/tape.h"

#include <cstring>

#include "autograd/error.h"
#include "autograd/kernels/elementwise.h"
#include "autograd/record.h"

namespace tapelm {

namespace {
thread_local bool t_grad_enabled = true;
}

Var::Var(Tensor v, bool requires_grad) {
  auto node = std::make_shared<Node>();
  node->val = std::move(v);
  node->requires_grad = requires_grad;
  h_ = std::make_shared<ValueHold>(std::move(node));
}

ValueHold::~ValueHold() {
  if (n.use_count() > 1) {  // GradSlots remain: they need the gradient's shape, never the value
    n->shape = n->val.shape();
    n->val = Tensor();
  }
}

namespace {
Tensor& grad_of(Node& n) {
  if (!n.grad.defined()) n.grad = Tensor::zeros(n.val.defined() ? n.val.shape() : n.shape);
  return n.grad;
}
}  // namespace

Tensor& Var::grad() const { return grad_of(*n()); }
Tensor& GradSlot::grad() const { return grad_of(*n_); }

void Var::zero_grad() const {
  if (h_ && n()->grad.defined()) n()->grad.zero();
}

bool grad_enabled() { return t_grad_enabled; }
NoGrad::NoGrad() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGrad::~NoGrad() { t_grad_enabled = prev_; }

Tape& Tape::get() {
  thread_local Tape tape;
  return tape;
}

void Tape::backward(const Var& out) {
  if (out.numel() != 1)
    fail("backward", "output of shape " + shape_str(out.shape()) + " needs an explicit cotangent");
  backward(out, Tensor::full(out.shape(), 1.f));
}

void Tape::backward(const Var& out, const Tensor& seed) {
  if (seed.shape() != out.shape())
    fail("backward", "cotangent " + shape_str(seed.shape()) + " for output " + shape_str(out.shape()));
  if (!out.requires_grad()) {
    clear();
    throw std::logic_error("backward: the output does not depend on anything that requires a gradient");
  }
  Var o = out;
  Tensor& g = o.grad();
  std::memcpy(g.data(), seed.data(), seed.numel() * sizeof(float));
  // Moving the closures out first keeps the tape usable if a closure throws.
  std::vector<std::function<void()>> fns;
  fns.swap(fns_);
  for (auto it = fns.rbegin(); it != fns.rend(); ++it) {
    (*it)();
    *it = nullptr;  // free what this op saved as soon as it is done
  }
}

void backward(const Var& out) { Tape::get().backward(out); }
void backward(const Var& out, const Tensor& seed) { Tape::get().backward(out, seed); }
void clear_tape() { Tape::get().clear(); }
size_t tape_size() { return Tape::get().size(); }

Var checkpoint(const Var& x, const std::vector<Var>& params, const std::function<Var(const Var&)>& fn) {
  if (!grad_enabled()) return fn(x);
  Tensor y;
  {
    NoGrad off;
    y = fn(x).val();
  }
  std::vector<Var> inputs = params;
  inputs.push_back(x);
  return record(inputs, std::move(y), [x, fn](const Tensor& dout) {
    // The running backward has moved its closures out of the tape: fn records on an empty one,
    // which this backward runs and clears.
    Var in(x.val(), x.requires_grad());
    const Var out = fn(in);
    if (!out.requires_grad()) return;
    Tape::get().backward(out, dout);
    if (x.requires_grad() && in.has_grad()) kern::add_into(x.grad().data(), in.grad().data(), in.numel());
  });
}

Var record(const std::vector<Var>& inputs, Tensor out, std::function<void(const Tensor& dout)> bwd) {
  bool needs = false;
  if (grad_enabled())
    for (const Var& v : inputs) needs = needs || v.requires_grad();
  Var result(std::move(out), needs);
  if (needs) {
    Tape::get().push([slot = GradSlot(result), bwd = std::move(bwd)]() mutable {
      if (slot.has_grad()) bwd(slot.grad());
    });
  }
  return result;
}

}  // namespace tapelm
