#pragma once
// Elementwise kernels: binary ops with one broadcast operand, unary maps, the activations and
// dropout. Every buffer here is flat: n elements, or the broadcast operand's size.
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

// ---- binary, with broadcasting of one operand ----------------------------------------------
enum class BinaryOp { Add, Sub, Mul, Div };

/// How the "small" operand is read at element i of the full operand and the output (both [n]):
///   Same: [n] at i;   Row: [P] at i % P;   Col: [n / P] at i / P;   Scalar: [1] at 0.
enum class Bcast { Same, Row, Col, Scalar };

/// out = a op b, where a is the full operand when a_full, else b is.
///   out: [n]   a: [n] if a_full, else the small shape   b: the small shape if a_full, else [n]
void binary_fwd(BinaryOp op, Bcast mode, bool a_full, float* out, const float* a, const float* b, int64_t n,
                int64_t P);
/// da += dout * ∂(a op b)/∂a and db += dout * ∂(a op b)/∂b, the small operand's gradient summing
/// over the elements that read it; da or db may be null.
///   dout: [n]   da, a and db, b: as a and b in forward
///   scratch: [n], overwritten (needed when the small operand's gradient is wanted)
void binary_bwd(BinaryOp op, Bcast mode, bool a_full, float* da, float* db, const float* dout, const float* a,
                const float* b, int64_t n, int64_t P, float* scratch);

// ---- unary maps ------------------------------------------------------------------------------
/// AddScalar: x + s;  MulScalar: x * s;  Exp, Log, Tanh (libm);  Relu: max(x, 0).
enum class UnaryOp { AddScalar, MulScalar, Exp, Log, Tanh, Relu };

/// y = op(x)   (s: the scalar of AddScalar and MulScalar, unused otherwise)
///   y, x: [n]
void unary_fwd(UnaryOp op, float s, float* y, const float* x, int64_t n);
/// dx += dy * op'(x), given the forward's y = op(x).
///   dx, dy, x, y: [n]
void unary_bwd(UnaryOp op, float s, float* dx, const float* dy, const float* x, const float* y, int64_t n);

/// dst += src (a view's backward: reshape).
///   dst, src: [n]
void add_into(float* dst, const float* src, int64_t n);

// ---- activations -----------------------------------------------------------------------------
/// GELU: exact (erf) or the tanh approximation.
///   y, x: [n]
void gelu_fwd(float* y, const float* x, int64_t n, bool tanh_approx);
/// STREAM's triad a = b + s·c on all threads, in static chunks (the memory-bandwidth probe).
void triad(float* a, const float* b, const float* c, float s, int64_t n);
///   dx, dy, x: [n]   (x: the forward's input)
void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);
/// SiLU: x * sigmoid(x).
///   y, x: [n]
void silu_fwd(float* y, const float* x, int64_t n);
///   dx, dy, x: [n]   (x: the forward's input)
void silu_bwd(float* dx, const float* dy, const float* x, int64_t n);

// ---- dropout ---------------------------------------------------------------------------------
/// y = x * keep / (1-p), keep = hash_uniform(seed, offset + i) >= p: a pure function of
/// (seed, element index), so backward recomputes the mask.
///   y, x: [n]
void dropout_fwd(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t offset);
/// dx += dy * keep / (1-p), the same mask.
///   dx, dy: [n]
void dropout_bwd(float* dx, const float* dy, int64_t n, float p, uint64_t seed, uint64_t offset);

}  // namespace tapelm::kern
