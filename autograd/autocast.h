#pragma once
// Mixed precision for the matrix products of linear layers, as torch.autocast("cpu",
// dtype=torch.bfloat16) runs them: inside an Autocast(bf16) scope, linear() and linears() round
// their input and weight to bfloat16, multiply with float32 accumulation and give a float32
// output; their backward rounds the output gradient to bf16 for both of its products. Everything
// else stays float32: master weights, gradients, optimizer state, norms, softmax, attention,
// losses, reductions and biases (docs/guide/precision.md).
#include <array>
#include <string>
#include <utility>

#include "autograd/names.h"
#include "autograd/tensor.h"

namespace tapelm {

/// f32: every product in float32. bf16: bf16 products on bf16 instructions (oneDNN on a CPU with
/// AVX512-BF16 or AMX). bf16-emulated: the same rounding on any CPU, multiplied by f32 sgemm —
/// bf16's numbers (up to the order of the sums) at below f32's speed, for quality studies.
enum class Precision { f32, bf16, bf16_emulated };
template <> struct EnumNames<Precision> {
  static constexpr std::array<std::pair<Precision, const char*>, 3> values{
      {{Precision::f32, "f32"}, {Precision::bf16, "bf16"}, {Precision::bf16_emulated, "bf16-emulated"}}};
};
/// "" when p can run on this machine; otherwise the one-line reason (bf16 without bf16
/// instructions names what is missing and the emulated choice).
std::string precision_unavailable(Precision p);

/// While alive, the linear layers of this thread compute in the given precision (scopes nest;
/// the innermost wins). A weight is rounded at each use, in the forward and again in the backward,
/// into the thread's reused buffer (grown to the largest weight, never shrunk: 2 bytes a value of
/// the largest weight in bf16, 4 in bf16-emulated), no copy kept from forward to backward: open one
/// scope per optimizer step (forward and backward of every micro-batch), so the weights do not
/// change inside it.
class Autocast {
 public:
  /// A usage Error if p cannot run here (precision_unavailable).
  explicit Autocast(Precision p);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  Precision precision() const { return p_; }

 private:
  Precision p_;
  Autocast* prev_;
};

/// The innermost live Autocast of this thread if it asks for bf16 products, else null.
Autocast* bf16_autocast();

}  // namespace tapelm
