#pragma once
// The tape's internals, for autograd's ops: the thread's tape of backward closures and record(),
// which appends one. Layers above use autograd/tape.h (backward, clear_tape, NoGrad).
#include <functional>
#include <vector>

#include "autograd/tape.h"

namespace tapelm {

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
  void clear() {
    fns_.clear();
    if (depth_ == 0) forget_uses();  // a checkpointed block's inner tape holds no first uses
  }
  /// A recorded op's inputs: a watched Var (GradReadyHook) not seen before on this tape is first
  /// used by the op about to be pushed.
  void note_inputs(const std::vector<Var>& inputs);

 private:
  friend class GradReadyHook;
  struct Watch;
  void forget_uses();
  std::vector<std::function<void()>> fns_;
  Watch* watch_ = nullptr;  // the thread's GradReadyHook's state, while one lives
  int depth_ = 0;           // backwards running on this thread (a checkpointed block's runs inside another)
};

/// Records an op: `out` needs a gradient when any input does and recording is on; then `bwd`
/// runs during backward if `out` received a gradient. The closure captures the inputs and out.
Var record(const std::vector<Var>& inputs, Tensor out, std::function<void(const Tensor& dout)> bwd);

}  // namespace tapelm
