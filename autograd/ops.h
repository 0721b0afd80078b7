#pragma once
// Differentiable ops: each computes its value and records its backward right below it.
// Shape errors throw a shape Error naming the op and the shapes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/quant.h"
#include "autograd/tape.h"

namespace tapelm {

// ---- elementwise binary, with broadcasting of one operand: same shape, a trailing-dims "row"
// (b: [C] or [T,C] against a: [..., T, C]), a "column" (b: [..., 1] against a: [..., C]) or a scalar.
Var add(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var div(const Var& a, const Var& b);
Var add(const Var& a, float s);
Var mul(const Var& a, float s);
Var neg(const Var& a);
inline Var operator+(const Var& a, const Var& b) { return add(a, b); }
inline Var operator-(const Var& a, const Var& b) { return sub(a, b); }
inline Var operator*(const Var& a, const Var& b) { return mul(a, b); }
inline Var operator/(const Var& a, const Var& b) { return div(a, b); }
inline Var operator*(const Var& a, float s) { return mul(a, s); }
inline Var operator+(const Var& a, float s) { return add(a, s); }
inline Var operator-(const Var& a) { return neg(a); }

// ---- elementwise unary
Var exp(const Var& x);
Var log(const Var& x);
Var tanh(const Var& x);
Var relu(const Var& x);
/// Exact erf GELU, or the tanh approximation.
Var gelu(const Var& x, bool tanh_approx = false);
Var silu(const Var& x);

// ---- matrix products
/// op(a) · op(b): 2-D [M,K]·[K,N]; batched [...,M,K]·[...,K,N] with equal leading dims; or an
/// N-D a against a 2-D b (the leading dims become rows). Transposes are BLAS flags, not copies.
Var matmul(const Var& a, const Var& b, bool trans_a = false, bool trans_b = false);
/// x·Wᵀ + b for x [..., in], W [out, in], b [out] (b may be undefined).
Var linear(const Var& x, const Var& w, const Var& b = Var());
/// linear(x, ws[i], bs[i]) for up to 4 weights of the same x (bs empty: no biases): the same values
/// and gradients, but a decoding step (x with at most 16 rows) reads all the weights in one pass
/// on the threads instead of one product after another.
std::vector<Var> linears(const Var& x, const std::vector<Var>& ws, const std::vector<Var>& bs = {});

/// A weight matrix [rows, cols] held for inference in fewer bytes than float32: q8_0 rows (34
/// bytes per 32 values, autograd/kernels/quant.h) or bfloat16 / IEEE half values (2 bytes each).
/// Its bytes are its own (pack), or another's that `owner` keeps alive: a file's tensor, mapped
/// (over). Either way they are read only.
struct PackedMatrix {
  WeightType type = WeightType::q8_0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;  // rows × q8_0_bytes(cols), or rows × cols 16-bit values; empty when viewed
  const uint8_t* view = nullptr;       // the bytes when they are not in data
  std::shared_ptr<const void> owner;   // what keeps view's bytes alive (a mapped file)
  /// > 0: the rows are in the interleaved RoPE order of that many heads (llama.cpp's q and k:
  /// x[2i], x[2i + 1] of each head); linear_packed gives its outputs in tapelm's half-split order.
  int64_t rope_heads = 0;
  /// w [rows, cols] in `type` (q8_0, bf16 or f16): q8_0 needs cols a multiple of 32; bf16 and f16
  /// round to nearest even (exact for values a 16-bit file held). A data error naming `what` if a
  /// value does not fit (a q8_0 block's f16 scale, or f16's ±65504).
  static PackedMatrix pack(const Tensor& w, WeightType type, const std::string& what);
  /// The matrix whose bytes are at `bytes` as `type` stores them (a 16-bit type: 2-byte aligned),
  /// kept alive by owner; no copy. Every value is checked: a data error naming `what` and the row
  /// for a value (or a q8_0 scale) that is not finite.
  static PackedMatrix over(WeightType type, int64_t rows, int64_t cols, const uint8_t* bytes, std::shared_ptr<const void> owner,
                           const std::string& what);
  const uint8_t* bytes_ptr() const { return view ? view : data.data(); }
  /// The bytes of its values: type's bytes for rows × cols.
  int64_t bytes() const;
  bool mapped() const { return view != nullptr; }
};
/// x·Wᵀ + b for x [..., in] with W [out, in] packed. q8_0: x rounded to q8_0 row by row and int8
/// dot products, as ggml multiplies q8_0 weights (kern::matmul_q8_0); bf16 and f16: W widened to
/// float32 in the kernel (kern::matmul_w16), x as it is. Inference: no tape.
Var linear_packed(const Var& x, const PackedMatrix& w, const Var& b = Var());

// ---- reductions
Var sum(const Var& x);
Var mean(const Var& x);
Var sum(const Var& x, int axis, bool keepdim = false);
Var mean(const Var& x, int axis, bool keepdim = false);

// ---- layout
/// A view of the same data with another shape (one -1 is inferred).
Var reshape(const Var& x, const Shape& shape);
Var permute(const Var& x, const std::vector<int>& perm);
Var transpose(const Var& x, int a, int b);
/// Elements [start, end) along axis.
Var slice(const Var& x, int axis, int64_t start, int64_t end);
Var concat(const std::vector<Var>& xs, int axis);

// ---- lookup
/// weight [V, C] gathered at ids -> [ids.shape..., C]; backward scatter-adds.
Var embedding(const Var& weight, const Index& ids);

// ---- normalisation and probabilities
/// Over the last axis; b may be undefined.
Var layernorm(const Var& x, const Var& w, const Var& b = Var(), float eps = 1e-5f);
Var rmsnorm(const Var& x, const Var& w, float eps = 1e-5f);
Var softmax(const Var& x);
Var log_softmax(const Var& x);
/// Mean cross-entropy of logits [..., V] against targets [...]; targets of -1 are ignored.
Var cross_entropy(const Var& logits, const Index& targets);
/// Knowledge distillation's soft-target loss (Hinton et al. 2015, as DistilBERT and MiniLLM use it):
/// T²·KL(softmax(teacher/T) ‖ softmax(logits/T)) averaged over the positions whose target is not
/// -1. teacher: logits of the same shape, no gradient. Its gradient in logits is
/// T·(softmax(logits/T) − softmax(teacher/T)) / positions: the T² keeps it on cross-entropy's scale.
Var distill_kl(const Var& logits, const Tensor& teacher, const Index& targets, float temperature);
/// Zeroes each element with probability p and scales the rest by 1/(1-p); the mask is a pure
/// function of (seed, element index), so a run is reproducible and backward recomputes it.
Var dropout(const Var& x, float p, uint64_t seed);

}  // namespace tapelm
