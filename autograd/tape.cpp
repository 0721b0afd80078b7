#include "autograd/tape.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>

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

void Var::release_value() const {
  Node& node = *n();
  if (!node.val.defined()) return;
  node.shape = node.val.shape();
  node.val = Tensor();
}
Tensor& GradSlot::grad() const { return grad_of(*n_); }

void Var::zero_grad() const {
  if (h_ && n()->grad.defined()) n()->grad.zero();
}

bool grad_enabled() { return t_grad_enabled; }
NoGrad::NoGrad() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGrad::~NoGrad() { t_grad_enabled = prev_; }

struct Tape::Watch {
  std::unordered_map<const void*, size_t> index;  // a watched Var's node -> its index
  std::vector<char> seen;                         // used by an op on the tape since it was last cleared
  std::vector<std::pair<size_t, size_t>> firsts;  // (tape position, index) of each first use, in tape order
  std::function<void(size_t)> ready;
};

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
  // Only the outermost backward reports ready gradients: the first uses were noted on its tape.
  const bool report = depth_ == 0 && watch_ != nullptr;
  struct Depth {
    Tape& t;
    bool outer;
    ~Depth() {
      if (--t.depth_ == 0 && outer) t.forget_uses();
    }
  } depth{*this, depth_++ == 0};
  for (size_t k = fns.size(); k-- > 0;) {
    fns[k]();
    fns[k] = nullptr;  // free what this op saved as soon as it is done
    if (!report) continue;
    auto& firsts = watch_->firsts;
    while (!firsts.empty() && firsts.back().first == k) {
      const size_t i = firsts.back().second;
      firsts.pop_back();
      watch_->ready(i);
    }
  }
}

void Tape::note_inputs(const std::vector<Var>& inputs) {
  if (!watch_ || depth_ > 0) return;
  for (const Var& v : inputs) {
    if (!v.defined()) continue;
    const auto it = watch_->index.find(v.id());
    if (it == watch_->index.end() || watch_->seen[it->second]) continue;
    watch_->seen[it->second] = 1;
    watch_->firsts.emplace_back(fns_.size(), it->second);
  }
}

void Tape::forget_uses() {
  if (!watch_) return;
  watch_->firsts.clear();
  std::fill(watch_->seen.begin(), watch_->seen.end(), 0);
}

GradReadyHook::GradReadyHook(const std::vector<Var>& watched, std::function<void(size_t)> ready) {
  Tape& t = Tape::get();
  if (t.watch_) throw std::logic_error("GradReadyHook: this thread already has one");
  if (t.size() > 0) throw std::logic_error("GradReadyHook: made while ops are recorded, whose first uses it never saw");
  auto w = std::make_unique<Tape::Watch>();
  for (size_t i = 0; i < watched.size(); i++)
    if (!w->index.emplace(watched[i].id(), i).second)
      throw std::logic_error("GradReadyHook: Var " + std::to_string(i) + " is watched twice (it would be reported once)");
  w->seen.assign(watched.size(), 0);
  w->ready = std::move(ready);
  t.watch_ = w.release();
}

GradReadyHook::~GradReadyHook() {
  Tape& t = Tape::get();
  delete t.watch_;
  t.watch_ = nullptr;
}

void backward(const Var& out) { Tape::get().backward(out); }
void backward(const Var& out, const Tensor& seed) { Tape::get().backward(out, seed); }
void clear_tape() { Tape::get().clear(); }
void on_backward(std::function<void()> fn) {
  if (grad_enabled()) Tape::get().push(std::move(fn));
}
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
    Tape::get().note_inputs(inputs);
    Tape::get().push([slot = GradSlot(result), bwd = std::move(bwd)]() mutable {
      if (slot.has_grad()) bwd(slot.grad());
    });
  }
  return result;
}

}  // namespace tapelm
