#include "autograd/ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "autograd/autocast.h"
#include "autograd/error.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/elementwise.h"
#include "autograd/kernels/embedding.h"
#include "autograd/kernels/layout.h"
#include "autograd/kernels/matmul.h"
#include "autograd/kernels/norms.h"
#include "autograd/kernels/quant.h"
#include "autograd/kernels/reduce.h"
#include "autograd/kernels/softmax.h"
#include "autograd/record.h"

namespace tapelm {

namespace {

int norm_axis(const char* op, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) fail(op, "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(ndim));
  return a;
}

// [O, N, I] around an axis.
void split_at(const Shape& s, int axis, int64_t& O, int64_t& N, int64_t& I) {
  O = 1;
  I = 1;
  for (int k = 0; k < axis; k++) O *= s[k];
  N = s[axis];
  for (size_t k = axis + 1; k < s.size(); k++) I *= s[k];
}

// ---- broadcasting for binary ops: one operand is full, the other "small" one is read at
// index k(i) of the output element i (kern::Bcast).
using kern::Bcast;

struct BPlan {
  bool a_full;     // which operand has the output's shape
  Bcast mode;      // how the other one is read
  int64_t period;  // Row: the small operand's size; Col: the full operand's last dim
  Shape out;
};

Shape strip_leading_ones(Shape s) {
  while (!s.empty() && s.front() == 1) s.erase(s.begin());
  return s;
}

bool is_row_of(const Shape& small, const Shape& big) {
  Shape s = strip_leading_ones(small);
  if (s.size() > big.size() || s.empty()) return false;
  return std::equal(s.begin(), s.end(), big.end() - s.size());
}

bool is_col_of(const Shape& small, const Shape& big) {
  if (small.size() != big.size() || big.empty() || small.back() != 1) return false;
  return std::equal(small.begin(), small.end() - 1, big.begin());
}

BPlan plan_binary(const char* op, const Shape& a, const Shape& b) {
  if (a == b) return {true, Bcast::Same, 0, a};
  const int64_t na = shape_numel(a), nb = shape_numel(b);
  if (nb == 1 && a.size() >= b.size()) return {true, Bcast::Scalar, 1, a};
  if (na == 1 && b.size() >= a.size()) return {false, Bcast::Scalar, 1, b};
  if (is_row_of(b, a)) return {true, Bcast::Row, nb, a};
  if (is_row_of(a, b)) return {false, Bcast::Row, na, b};
  if (is_col_of(b, a)) return {true, Bcast::Col, a.back(), a};
  if (is_col_of(a, b)) return {false, Bcast::Col, b.back(), b};
  fail(op, "cannot broadcast " + shape_str(a) + " with " + shape_str(b));
}

Var binary(const char* op, kern::BinaryOp kop, const Var& a, const Var& b) {
  const BPlan p = plan_binary(op, a.shape(), b.shape());
  Tensor out = Tensor::empty(p.out);
  const int64_t n = out.numel();
  kern::binary_fwd(kop, p.mode, p.a_full, out.data(), a.val().data(), b.val().data(), n, p.period);
  if (kop == kern::BinaryOp::Add || kop == kern::BinaryOp::Sub) {
    // the gradients do not read a or b: their slots alone are held (the residual stream's
    // branches are freed once nothing else's backward reads them); the kernel is handed dout,
    // n values, in their place, read at the indices of a and b and ignored
    return record({a, b}, out, [as = GradSlot(a), bs = GradSlot(b), p, n, kop](const Tensor& dout) {
      const GradSlot& small = p.a_full ? bs : as;
      Tensor scratch = small.requires_grad() ? Tensor::empty(dout.shape()) : Tensor();
      kern::binary_bwd(kop, p.mode, p.a_full, as.requires_grad() ? as.grad().data() : nullptr,
                       bs.requires_grad() ? bs.grad().data() : nullptr, dout.data(), dout.data(), dout.data(), n, p.period,
                       scratch.data());
    });
  }
  return record({a, b}, out, [a, b, p, n, kop](const Tensor& dout) {
    const Var& small = p.a_full ? b : a;
    Tensor scratch = small.requires_grad() ? Tensor::empty(dout.shape()) : Tensor();
    kern::binary_bwd(kop, p.mode, p.a_full, a.requires_grad() ? a.grad().data() : nullptr,
                     b.requires_grad() ? b.grad().data() : nullptr, dout.data(), a.val().data(), b.val().data(), n,
                     p.period, scratch.data());
  });
}

// y = op(x); backward reads x (log, relu), y (exp, tanh) or neither (adding or multiplying a
// scalar): it holds only what it reads, and hands the kernel dout in place of a value it never reads.
Var unary(kern::UnaryOp kop, const Var& x, float s = 0.f) {
  Tensor out = Tensor::empty(x.shape());
  const int64_t n = out.numel();
  kern::unary_fwd(kop, s, out.data(), x.val().data(), n);
  const bool reads_x = kop == kern::UnaryOp::Log || kop == kern::UnaryOp::Relu;
  const bool reads_y = kop == kern::UnaryOp::Exp || kop == kern::UnaryOp::Tanh;
  Var xv = reads_x ? x : Var();
  Tensor y = reads_y ? out : Tensor();
  return record({x}, out, [xs = GradSlot(x), xv, y, n, kop, s](const Tensor& dout) {
    kern::unary_bwd(kop, s, xs.grad().data(), dout.data(), xv.defined() ? xv.val().data() : dout.data(),
                    y.defined() ? y.data() : dout.data(), n);
  });
}

}  // namespace

// ---- elementwise binary ----------------------------------------------------------------------

Var add(const Var& a, const Var& b) { return binary("add", kern::BinaryOp::Add, a, b); }
Var sub(const Var& a, const Var& b) { return binary("sub", kern::BinaryOp::Sub, a, b); }
Var mul(const Var& a, const Var& b) { return binary("mul", kern::BinaryOp::Mul, a, b); }
Var div(const Var& a, const Var& b) { return binary("div", kern::BinaryOp::Div, a, b); }
Var add(const Var& a, float s) { return unary(kern::UnaryOp::AddScalar, a, s); }
Var mul(const Var& a, float s) { return unary(kern::UnaryOp::MulScalar, a, s); }
Var neg(const Var& a) { return mul(a, -1.f); }

// ---- elementwise unary -----------------------------------------------------------------------

Var exp(const Var& x) { return unary(kern::UnaryOp::Exp, x); }
Var log(const Var& x) { return unary(kern::UnaryOp::Log, x); }
Var tanh(const Var& x) { return unary(kern::UnaryOp::Tanh, x); }
Var relu(const Var& x) { return unary(kern::UnaryOp::Relu, x); }

Var gelu(const Var& x, bool tanh_approx) {
  Tensor out = Tensor::empty(x.shape());
  kern::gelu_fwd(out.data(), x.val().data(), out.numel(), tanh_approx);
  return record({x}, out, [x, tanh_approx](const Tensor& dout) {
    kern::gelu_bwd(x.grad().data(), dout.data(), x.val().data(), dout.numel(), tanh_approx);
  });
}

Var silu(const Var& x) {
  Tensor out = Tensor::empty(x.shape());
  kern::silu_fwd(out.data(), x.val().data(), out.numel());
  return record({x}, out, [x](const Tensor& dout) {
    kern::silu_bwd(x.grad().data(), dout.data(), x.val().data(), dout.numel());
  });
}

// ---- matrix products -------------------------------------------------------------------------

Var matmul(const Var& a, const Var& b, bool ta, bool tb) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const std::string shapes = shape_str(as) + (ta ? "ᵀ" : "") + " and " + shape_str(bs) + (tb ? "ᵀ" : "");
  if (as.size() < 2 || bs.size() < 2) fail("matmul", "needs rank >= 2, got " + shapes);
  const int64_t a0 = as[as.size() - 2], a1 = as.back(), b0 = bs[bs.size() - 2], b1 = bs.back();
  int64_t M = ta ? a1 : a0, K = ta ? a0 : a1, Kb = tb ? b1 : b0, N = tb ? b0 : b1;
  if (K != Kb) fail("matmul", "inner dimensions differ: " + shapes);
  int64_t batch = 1;
  Shape out_shape;
  bool b_shared = false;  // b is one matrix for every row block of a
  if (bs.size() == 2 && !ta) {
    M = a.numel() / K;
    out_shape.assign(as.begin(), as.end() - 1);
    out_shape.push_back(N);
    b_shared = true;
  } else {
    if (as.size() != bs.size() || !std::equal(as.begin(), as.end() - 2, bs.begin()))
      fail("matmul", "batch dimensions differ: " + shapes);
    batch = a.numel() / (a0 * a1);
    out_shape.assign(as.begin(), as.end() - 2);
    out_shape.push_back(M);
    out_shape.push_back(N);
  }
  const kern::MatmulShape s{.batch = batch, .M = M, .N = N, .K = K, .ta = ta, .tb = tb, .b_shared = b_shared,
                            .lda = a1, .ldb = b1, .sa = b_shared ? 0 : a0 * a1, .sb = b_shared ? 0 : b0 * b1,
                            .sc = M * N};
  Tensor out = Tensor::empty(out_shape);
  kern::matmul_fwd(out.data(), a.val().data(), b.val().data(), s);
  return record({a, b}, out, [a, b, s](const Tensor& dout) {
    kern::matmul_bwd(a.requires_grad() ? a.grad().data() : nullptr, b.requires_grad() ? b.grad().data() : nullptr,
                     dout.data(), a.val().data(), b.val().data(), s);
  });
}

namespace {
// The shape checks linear() and linears() share: x [..., in], w [out, in], b [out] or undefined.
void check_linear(const std::string& op, const Var& x, const Var& w, const Var& b) {
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape().back() != w.dim(1))
    fail(op, "input " + shape_str(x.shape()) + " does not fit weight " + shape_str(w.shape()));
  if (b.defined() && (b.ndim() != 1 || b.dim(0) != w.dim(0)))
    fail(op, "bias " + shape_str(b.shape()) + " does not fit weight " + shape_str(w.shape()));
}

// x's shape with the last axis w's rows: the shape of x·wᵀ.
Shape linear_shape(const Var& x, const Var& w) {
  Shape os = x.shape();
  os.back() = w.dim(0);
  return os;
}

// Puts out = x·wᵀ (+ b) on the tape, with linear_bwd as its backward.
Var record_linear(const Var& x, const Var& w, const Var& b, const Tensor& out) {
  const int64_t in = w.dim(1), outf = w.dim(0), rows = x.numel() / in;
  std::vector<Var> ins{x, w};
  if (b.defined()) ins.push_back(b);
  return record(ins, out, [x, w, b, rows, in, outf](const Tensor& dout) {
    kern::linear_bwd(x.requires_grad() ? x.grad().data() : nullptr, w.requires_grad() ? w.grad().data() : nullptr,
                     b.defined() && b.requires_grad() ? b.grad().data() : nullptr, dout.data(), x.val().data(),
                     w.val().data(), rows, in, outf);
  });
}

// linear() inside a bf16 Autocast scope: x rounded to bf16 here and kept so for the backward, w
// rounded at each use (forward, and backward where dx is asked for) and dropped after it, output
// and gradients f32. bf16 multiplies bf16 values (gemm_bf16, x kept at half its f32 bytes);
// bf16-emulated multiplies the same values held in float32 by sgemm.
struct Bf16Input {
  std::shared_ptr<const uint16_t[]> bits;  // bf16 (not zeroed first: every value is written)
  Tensor rounded;                                     // bf16-emulated
};

Bf16Input bf16_input(Precision p, const Tensor& x) {
  Bf16Input in;
  if (p == Precision::bf16) {
    std::shared_ptr<uint16_t[]> b(new uint16_t[static_cast<size_t>(x.numel())]);
    kern::to_bf16(b.get(), x.data(), x.numel());
    in.bits = std::move(b);
  } else {
    in.rounded = Tensor::empty(x.shape());
    kern::round_bf16(in.rounded.data(), x.data(), x.numel());
  }
  return in;
}
Bf16Input bf16_input(const Autocast& ac, const Var& x) { return bf16_input(ac.precision(), x.val()); }

// A weight's bf16 copy lives for one product, not from the forward to the backward: a step of
// every weight held in 16 bits beside its float32 (2 bytes a parameter at the peak, 0.25 GB for
// GPT-2 small) costs more memory than rounding twice costs time. The copy goes into the thread's
// buffer, grown to the largest weight and reused, not into fresh pages: a fresh 77 MB copy of a
// 50257-row head on every use cost more in page faults than the rounding itself.
struct Bf16Weight {
  const uint16_t* bits = nullptr;  // bf16
  const float* rounded = nullptr;  // bf16-emulated
};
Bf16Weight bf16_weight(Precision p, const Tensor& w) {
  static thread_local std::vector<uint16_t> bits;
  static thread_local std::vector<float> rounded;
  const auto n = static_cast<size_t>(w.numel());
  if (p == Precision::bf16) {
    if (bits.size() < n) bits.resize(n);
    kern::to_bf16(bits.data(), w.data(), w.numel());
    return {bits.data(), nullptr};
  }
  if (rounded.size() < n) rounded.resize(n);
  kern::round_bf16(rounded.data(), w.data(), w.numel());
  return {nullptr, rounded.data()};
}

Var linear_bf16(Autocast& ac, const Var& x, const Var& w, const Var& b, const Bf16Input& xin) {
  const int64_t in = w.dim(1), outf = w.dim(0), rows = x.numel() / in;
  const Precision prec = ac.precision();
  Tensor out = Tensor::empty(linear_shape(x, w));
  const float* bias = b.defined() ? b.val().data() : nullptr;
  const Bf16Weight wc = bf16_weight(prec, w.val());
  if (xin.bits)
    kern::linear_fwd_bf16(out.data(), xin.bits.get(), wc.bits, bias, rows, in, outf);
  else
    kern::linear_fwd(out.data(), xin.rounded.data(), wc.rounded, bias, rows, in, outf);
  std::vector<Var> ins{x, w};
  if (b.defined()) ins.push_back(b);
  // x's float32 value is not read again: its gradient slot alone is held (GradSlot), so x is
  // freed once the forward is done with it, where nothing else's backward reads it
  return record(ins, out, [xs = GradSlot(x), w, b, xin, prec, rows, in, outf](const Tensor& dout) {
    float* dx = xs.requires_grad() ? xs.grad().data() : nullptr;
    float* dw = w.requires_grad() ? w.grad().data() : nullptr;
    float* db = b.defined() && b.requires_grad() ? b.grad().data() : nullptr;
    const Bf16Weight wc = dx ? bf16_weight(prec, w.val()) : Bf16Weight{};  // only dx reads w
    if (xin.bits) {
      kern::linear_bwd_bf16(dx, dw, db, dout.data(), xin.bits.get(), wc.bits, rows, in, outf);
      return;
    }
    if (dx || dw) {
      Tensor dyr = Tensor::empty(dout.shape());
      kern::round_bf16(dyr.data(), dout.data(), dout.numel());
      kern::linear_bwd(dx, dw, nullptr, dyr.data(), xin.rounded.data(), wc.rounded, rows, in, outf);
    }
    if (db) kern::linear_bwd(nullptr, nullptr, db, dout.data(), nullptr, nullptr, rows, in, outf);
  });
}
}  // namespace

Var linear(const Var& x, const Var& w, const Var& b) {
  check_linear("linear", x, w, b);
  if (Autocast* ac = bf16_autocast()) return linear_bf16(*ac, x, w, b, bf16_input(*ac, x));
  const int64_t in = w.dim(1), outf = w.dim(0), rows = x.numel() / in;
  Tensor out = Tensor::empty(linear_shape(x, w));
  kern::linear_fwd(out.data(), x.val().data(), w.val().data(), b.defined() ? b.val().data() : nullptr, rows, in, outf);
  return record_linear(x, w, b, out);
}

PackedMatrix PackedMatrix::pack(const Tensor& w, WeightType type, const std::string& what) {
  if (w.ndim() != 2) fail(ErrorKind::usage, what + ": only a matrix is packed, got " + shape_str(w.shape()));
  if (type == WeightType::f32) fail(ErrorKind::internal, what + ": float32 is not a packed type");
  PackedMatrix q;
  q.type = type;
  q.rows = w.dim(0);
  q.cols = w.dim(1);
  if (type == WeightType::q8_0) {
    if (q.cols % kQ8Block != 0)
      fail(ErrorKind::usage, what + ": q8_0 needs a matrix whose rows hold a multiple of 32 values, got " + shape_str(w.shape()));
    q.data.resize(static_cast<size_t>(q.rows * q8_0_bytes(q.cols)));
    const int64_t bad = quantize_q8_0_rows(q.data.data(), w.data(), q.rows, q.cols);
    if (bad >= 0)
      fail(ErrorKind::data, what + ": row " + std::to_string(bad) +
                                " holds a value beyond what a q8_0 block's f16 scale can hold (127 x 65504)");
    return q;
  }
  q.data.resize(static_cast<size_t>(q.rows * q.cols) * sizeof(uint16_t));
  uint16_t* h = reinterpret_cast<uint16_t*>(q.data.data());
  if (type == WeightType::bf16) {
    kern::to_bf16(h, w.data(), q.rows * q.cols);
    // finite floats past bf16's largest (about 3.39e38) round to infinity
    if (const int64_t bad = kern::first_non_finite_w16(h, q.rows * q.cols, true); bad >= 0)
      fail(ErrorKind::data, what + ": value " + std::to_string(w.data()[bad]) + " at row " + std::to_string(bad / q.cols) +
                                " is beyond what bf16 holds (3.39e38)");
    return q;
  }
  const int64_t bad = kern::to_f16(h, w.data(), q.rows * q.cols);
  if (bad >= 0)
    fail(ErrorKind::data, what + ": value " + std::to_string(w.data()[bad]) + " at row " + std::to_string(bad / q.cols) +
                              " is beyond what f16 holds (65504)");
  return q;
}

int64_t PackedMatrix::bytes() const {
  return packed_bytes(type, rows, cols);
}

PackedMatrix PackedMatrix::over(WeightType type, int64_t rows, int64_t cols, const uint8_t* bytes, std::shared_ptr<const void> owner,
                                const std::string& what) {
  if (type == WeightType::f32) fail(ErrorKind::internal, what + ": float32 is not a packed type");
  if (rows < 0 || cols < 0 || (type == WeightType::q8_0 && cols % kQ8Block != 0))
    fail(ErrorKind::internal, what + ": no " + to_string(type) + " matrix of " + std::to_string(rows) + " x " + std::to_string(cols));
  if (type != WeightType::q8_0 && reinterpret_cast<uintptr_t>(bytes) % alignof(uint16_t) != 0)
    fail(ErrorKind::internal, what + ": 16-bit values at an odd address");
  PackedMatrix q;
  q.type = type;
  q.rows = rows;
  q.cols = cols;
  q.view = bytes;
  q.owner = std::move(owner);
  const int64_t bad = type == WeightType::q8_0
                          ? kern::first_non_finite_q8_0(bytes, rows * cols / kQ8Block) * kQ8Block
                          : kern::first_non_finite_w16(reinterpret_cast<const uint16_t*>(bytes), rows * cols, type == WeightType::bf16);
  if (bad >= 0)
    fail(ErrorKind::data, what + ": row " + std::to_string(bad / cols) + " holds a " +
                              (type == WeightType::q8_0 ? "q8_0 block whose scale is" : "value that is") + " not finite");
  return q;
}

Var linear_packed(const Var& x, const PackedMatrix& w, const Var& b) {
  const std::string type = to_string(w.type);
  if (x.ndim() < 1 || x.shape().back() != w.cols || (b.defined() && b.shape() != Shape{w.rows}))
    fail("linear_packed", "x " + shape_str(x.shape()) + " for " + type + " weight [" + std::to_string(w.rows) + ", " +
                              std::to_string(w.cols) + "]" + (b.defined() ? " and bias " + shape_str(b.shape()) : ""));
  if (grad_enabled() && (x.requires_grad() || (b.defined() && b.requires_grad())))
    fail("linear_packed", type + " weights are for inference: no gradient flows through them");
  Shape out_shape = x.shape();
  out_shape.back() = w.rows;
  Tensor out = Tensor::empty(out_shape);
  const float* bias = b.defined() ? b.val().data() : nullptr;
  const int64_t M = x.numel() / w.cols;
  // rows in interleaved RoPE order: the products in that order, then each head's outputs moved
  // to the half-split order (x[2i] -> i, x[2i + 1] -> hd/2 + i) and the bias added there
  Tensor file_order = w.rope_heads > 0 ? Tensor::empty(out_shape) : out;
  const float* kbias = w.rope_heads > 0 ? nullptr : bias;
  if (w.type == WeightType::q8_0)
    kern::matmul_q8_0(file_order.data(), x.val().data(), M, w.cols, w.bytes_ptr(), w.rows, kbias);
  else
    kern::matmul_w16(file_order.data(), x.val().data(), M, w.cols, reinterpret_cast<const uint16_t*>(w.bytes_ptr()), w.rows, kbias,
                     w.type == WeightType::bf16);
  if (w.rope_heads > 0) {
    const int64_t hd = w.rows / w.rope_heads, half = hd / 2;
    const float* f = file_order.data();
    float* o = out.data();
    for (int64_t m = 0; m < M; m++)
      for (int64_t h = 0; h < w.rope_heads; h++)
        for (int64_t i = 0; i < half; i++)
          for (int64_t j = 0; j < 2; j++) {
            const int64_t split = m * w.rows + h * hd + j * half + i;
            o[split] = f[m * w.rows + h * hd + 2 * i + j] + (bias ? bias[split - m * w.rows] : 0.f);
          }
  }
  return Var(out);
}

std::vector<Var> linears(const Var& x, const std::vector<Var>& ws, const std::vector<Var>& bs) {
  const int n = static_cast<int>(ws.size());
  if (n < 1 || n > kern::kMaxLinearsAtOnce)
    fail("linears", "expected 1 to " + std::to_string(kern::kMaxLinearsAtOnce) + " weights, got " + std::to_string(n));
  if (!bs.empty() && bs.size() != ws.size())
    fail("linears", std::to_string(bs.size()) + " biases for " + std::to_string(n) + " weights");
  if (Autocast* ac = bf16_autocast()) {  // x rounded once for all the weights
    for (int i = 0; i < n; i++) check_linear("linears", x, ws[i], bs.empty() ? Var() : bs[i]);
    const Bf16Input xin = bf16_input(*ac, x);
    std::vector<Var> res;
    for (int i = 0; i < n; i++) res.push_back(linear_bf16(*ac, x, ws[i], bs.empty() ? Var() : bs[i], xin));
    return res;
  }
  std::vector<Tensor> outs;
  float* ys[kern::kMaxLinearsAtOnce];
  const float* wp[kern::kMaxLinearsAtOnce];
  const float* bp[kern::kMaxLinearsAtOnce];
  int64_t outf[kern::kMaxLinearsAtOnce];
  for (int i = 0; i < n; i++) {
    const Var b = bs.empty() ? Var() : bs[i];
    check_linear("linears", x, ws[i], b);
    outs.push_back(Tensor::empty(linear_shape(x, ws[i])));
    ys[i] = outs.back().data();
    wp[i] = ws[i].val().data();
    bp[i] = b.defined() ? b.val().data() : nullptr;
    outf[i] = ws[i].dim(0);
  }
  const int64_t in = x.shape().back();
  kern::linear_many_fwd(ys, x.val().data(), wp, bp, outf, n, x.numel() / in, in);
  // One record per output, each with linear()'s backward.
  std::vector<Var> res;
  for (int i = 0; i < n; i++) res.push_back(record_linear(x, ws[i], bs.empty() ? Var() : bs[i], outs[i]));
  return res;
}

// ---- reductions ------------------------------------------------------------------------------

static Var sum_scaled(const Var& x, float scale) {
  Tensor out = Tensor::scalar(static_cast<float>(kern::sum_all(x.val().data(), x.numel()) * scale));
  return record({x}, out, [xs = GradSlot(x), n = x.numel(), scale](const Tensor& dout) {
    kern::sum_all_bwd(xs.grad().data(), dout.data()[0] * scale, n);
  });
}

Var sum(const Var& x) { return sum_scaled(x, 1.f); }
Var mean(const Var& x) {
  if (x.numel() == 0) fail("mean", "empty input " + shape_str(x.shape()));
  return sum_scaled(x, 1.f / static_cast<float>(x.numel()));
}

static Var sum_axis_scaled(const char* op, const Var& x, int axis, bool keepdim, bool average) {
  const int ax = norm_axis(op, axis, x.ndim());
  int64_t O, N, I;
  split_at(x.shape(), ax, O, N, I);
  if (average && N == 0) fail(op, "empty axis in " + shape_str(x.shape()));
  const float scale = average ? 1.f / static_cast<float>(N) : 1.f;
  Shape os = x.shape();
  if (keepdim)
    os[ax] = 1;
  else
    os.erase(os.begin() + ax);
  Tensor out = Tensor::empty(os);
  kern::sum_axis_fwd(out.data(), x.val().data(), O, N, I, scale);
  return record({x}, out, [xs = GradSlot(x), O, N, I, scale](const Tensor& dout) {
    kern::sum_axis_bwd(xs.grad().data(), dout.data(), O, N, I, scale);
  });
}

Var sum(const Var& x, int axis, bool keepdim) { return sum_axis_scaled("sum", x, axis, keepdim, false); }
Var mean(const Var& x, int axis, bool keepdim) { return sum_axis_scaled("mean", x, axis, keepdim, true); }

// ---- layout ----------------------------------------------------------------------------------

Var reshape(const Var& x, const Shape& shape) {
  Tensor out;
  try {
    out = x.val().reshape(shape);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::shape) throw;
    fail("reshape", "cannot view " + shape_str(x.shape()) + " as " + shape_str(shape));
  }
  return record({x}, out, [xs = GradSlot(x)](const Tensor& dout) { kern::add_into(xs.grad().data(), dout.data(), dout.numel()); });
}

Var permute(const Var& x, const std::vector<int>& perm) {
  const int nd = x.ndim();
  std::vector<int> p(perm), inv(nd, -1);
  bool ok = static_cast<int>(p.size()) == nd && nd <= 8;
  for (int k = 0; ok && k < nd; k++) {
    if (p[k] < 0) p[k] += nd;
    ok = p[k] >= 0 && p[k] < nd && inv[p[k]] < 0;
    if (ok) inv[p[k]] = k;
  }
  if (!ok) {
    std::string ps;
    for (int v : perm) ps += (ps.empty() ? "" : ", ") + std::to_string(v);
    fail("permute", "[" + ps + "] is not a permutation of the axes of " + shape_str(x.shape()));
  }
  Shape os(nd);
  for (int k = 0; k < nd; k++) os[k] = x.shape()[p[k]];
  Tensor out = Tensor::empty(os);
  if (out.numel()) kern::permute(out.data(), x.val().data(), x.shape().data(), p.data(), nd, false);
  return record({x}, out, [xs = GradSlot(x), os, inv, nd](const Tensor& dout) {
    if (dout.numel()) kern::permute(xs.grad().data(), dout.data(), os.data(), inv.data(), nd, true);
  });
}

Var transpose(const Var& x, int a, int b) {
  const int nd = x.ndim();
  const int ia = norm_axis("transpose", a, nd), ib = norm_axis("transpose", b, nd);
  std::vector<int> p(nd);
  for (int k = 0; k < nd; k++) p[k] = k;
  std::swap(p[ia], p[ib]);
  return permute(x, p);
}

Var slice(const Var& x, int axis, int64_t start, int64_t end) {
  const int ax = norm_axis("slice", axis, x.ndim());
  int64_t O, N, I;
  split_at(x.shape(), ax, O, N, I);
  if (start < 0 || end > N || start > end)
    fail("slice", "range [" + std::to_string(start) + ", " + std::to_string(end) + ") out of bounds for axis " +
                      std::to_string(axis) + " of " + shape_str(x.shape()));
  Shape os = x.shape();
  os[ax] = end - start;
  Tensor out = Tensor::empty(os);
  const int64_t M = end - start;
  kern::slice_rows(out.data(), x.val().data(), O, N, I, start, M, false);
  return record({x}, out, [xs = GradSlot(x), O, N, I, start, M](const Tensor& dout) {
    kern::unslice_rows(xs.grad().data(), dout.data(), O, N, I, start, M, true);
  });
}

Var concat(const std::vector<Var>& xs, int axis) {
  if (xs.empty()) fail("concat", "no inputs");
  const int ax = norm_axis("concat", axis, xs[0].ndim());
  Shape os = xs[0].shape();
  int64_t total = 0;
  for (const Var& v : xs) {
    Shape s = v.shape();
    if (s.size() != os.size()) fail("concat", "ranks differ: " + shape_str(os) + " and " + shape_str(s));
    s[ax] = os[ax];
    if (s != os) fail("concat", "shapes differ off axis " + std::to_string(axis) + ": " + shape_str(xs[0].shape()) +
                                    " and " + shape_str(v.shape()));
    total += v.shape()[ax];
  }
  os[ax] = total;
  Tensor out = Tensor::empty(os);
  int64_t O, N, I;
  split_at(os, ax, O, N, I);
  std::vector<int64_t> starts, sizes;
  std::vector<GradSlot> slots;  // backward reads no input's value
  int64_t at = 0;
  for (const Var& v : xs) {
    starts.push_back(at);
    sizes.push_back(v.shape()[ax]);
    slots.emplace_back(v);
    kern::unslice_rows(out.data(), v.val().data(), O, N, I, at, v.shape()[ax], false);
    at += v.shape()[ax];
  }
  return record(xs, out, [slots, starts, sizes, O, N, I](const Tensor& dout) {
    for (size_t k = 0; k < slots.size(); k++)
      if (slots[k].requires_grad()) kern::slice_rows(slots[k].grad().data(), dout.data(), O, N, I, starts[k], sizes[k], true);
  });
}

// ---- lookup ----------------------------------------------------------------------------------

Var embedding(const Var& weight, const Index& ids) {
  if (weight.ndim() != 2) fail("embedding", "weight must be [V, C], got " + shape_str(weight.shape()));
  if (shape_numel(ids.shape) != ids.numel())
    fail("embedding", std::to_string(ids.numel()) + " ids for shape " + shape_str(ids.shape));
  const int64_t V = weight.dim(0), C = weight.dim(1), N = ids.numel();
  for (int64_t t = 0; t < N; t++)
    if (ids.data[t] < 0 || ids.data[t] >= V)
      fail("embedding", "id " + std::to_string(ids.data[t]) + " at position " + std::to_string(t) +
                            " out of range for vocabulary " + std::to_string(V));
  Shape os = ids.shape;
  os.push_back(C);
  Tensor out = Tensor::empty(os);
  kern::embedding_fwd(out.data(), weight.val().data(), ids.data.data(), N, C);
  return record({weight}, out, [weight, ids, N, C](const Tensor& dout) {
    kern::embedding_bwd(weight.grad().data(), dout.data(), ids.data.data(), N, C);
  });
}

// ---- normalisation and probabilities ----------------------------------------------------------

Var layernorm(const Var& x, const Var& w, const Var& b, float eps) {
  const int64_t C = x.ndim() ? x.shape().back() : 0;
  if (C == 0 || w.shape() != Shape{C} || (b.defined() && b.shape() != Shape{C}))
    fail("layernorm", "input " + shape_str(x.shape()) + " with weight " + shape_str(w.shape()) +
                          (b.defined() ? " and bias " + shape_str(b.shape()) : ""));
  const int64_t N = x.numel() / C;
  Tensor out = Tensor::empty(x.shape()), mu = Tensor::empty({N}), rs = Tensor::empty({N});
  kern::layernorm_fwd(out.data(), mu.data(), rs.data(), x.val().data(), w.val().data(),
                      b.defined() ? b.val().data() : nullptr, N, C, eps);
  std::vector<Var> ins{x, w};
  if (b.defined()) ins.push_back(b);
  return record(ins, out, [x, w, b, mu, rs, N, C](const Tensor& dout) {
    kern::layernorm_bwd(x.requires_grad() ? x.grad().data() : nullptr,
                        w.requires_grad() ? w.grad().data() : nullptr,
                        b.defined() && b.requires_grad() ? b.grad().data() : nullptr, dout.data(), x.val().data(),
                        w.val().data(), mu.data(), rs.data(), N, C);
  });
}

Var rmsnorm(const Var& x, const Var& w, float eps) {
  const int64_t C = x.ndim() ? x.shape().back() : 0;
  if (C == 0 || w.shape() != Shape{C})
    fail("rmsnorm", "input " + shape_str(x.shape()) + " with weight " + shape_str(w.shape()));
  const int64_t N = x.numel() / C;
  Tensor out = Tensor::empty(x.shape()), rs = Tensor::empty({N});
  kern::rmsnorm_fwd(out.data(), rs.data(), x.val().data(), w.val().data(), N, C, eps);
  return record({x, w}, out, [x, w, rs, N, C](const Tensor& dout) {
    kern::rmsnorm_bwd(x.requires_grad() ? x.grad().data() : nullptr, w.requires_grad() ? w.grad().data() : nullptr,
                      dout.data(), x.val().data(), w.val().data(), rs.data(), N, C);
  });
}

Var softmax(const Var& x) {
  if (x.ndim() == 0) fail("softmax", "needs rank >= 1");
  const int64_t C = x.shape().back(), N = C ? x.numel() / C : 0;
  Tensor out = Tensor::empty(x.shape());
  kern::softmax_fwd(out.data(), x.val().data(), N, C);
  Tensor y = out;
  return record({x}, out, [xs = GradSlot(x), y, N, C](const Tensor& dout) {  // reads its output, not x
    kern::softmax_bwd(xs.grad().data(), dout.data(), y.data(), N, C);
  });
}

Var log_softmax(const Var& x) {
  if (x.ndim() == 0) fail("log_softmax", "needs rank >= 1");
  const int64_t C = x.shape().back(), N = C ? x.numel() / C : 0;
  Tensor out = Tensor::empty(x.shape());
  kern::log_softmax_fwd(out.data(), x.val().data(), N, C);
  Tensor y = out;
  return record({x}, out, [xs = GradSlot(x), y, N, C](const Tensor& dout) {  // reads its output, not x
    kern::log_softmax_bwd(xs.grad().data(), dout.data(), y.data(), N, C);
  });
}

Var cross_entropy(const Var& logits, const Index& targets) {
  if (logits.ndim() < 1) fail("cross_entropy", "logits need rank >= 1");
  const int64_t V = logits.shape().back(), N = V ? logits.numel() / V : 0;
  if (targets.numel() != N)
    fail("cross_entropy", "logits " + shape_str(logits.shape()) + " and targets " + shape_str(targets.shape));
  for (int64_t t = 0; t < N; t++)
    if (targets.data[t] < -1 || targets.data[t] >= V)
      fail("cross_entropy", "target " + std::to_string(targets.data[t]) + " at position " + std::to_string(t) +
                                " out of range for vocabulary " + std::to_string(V));
  Tensor losses = Tensor::empty({N}), lse = Tensor::empty({N});
  const int64_t count = kern::cross_entropy_fwd(losses.data(), lse.data(), logits.val().data(), targets.data.data(), N, V);
  // With every target ignored the loss is 0 and so is its gradient (PyTorch would give NaN).
  const float inv = count ? 1.f / static_cast<float>(count) : 0.f;
  Tensor out = Tensor::scalar(static_cast<float>(kern::sum_all(losses.data(), N) * inv));
  return record({logits}, out, [logits, targets, lse, N, V, inv](const Tensor& dout) {
    kern::cross_entropy_bwd(logits.grad().data(), logits.val().data(), lse.data(), targets.data.data(), N, V,
                            dout.data()[0] * inv);
  });
}

Var distill_kl(const Var& logits, const Tensor& teacher, const Index& targets, float temperature) {
  if (logits.ndim() < 1 || teacher.shape() != logits.shape())
    fail("distill_kl", "teacher logits " + shape_str(teacher.shape()) + " for student logits " + shape_str(logits.shape()));
  if (!(temperature > 0) || !std::isfinite(temperature))
    fail(ErrorKind::usage, "distill_kl: temperature " + std::to_string(temperature) + " is not positive and finite");
  const int64_t V = logits.shape().back(), N = V ? logits.numel() / V : 0;
  if (targets.numel() != N)
    fail("distill_kl", "logits " + shape_str(logits.shape()) + " and targets " + shape_str(targets.shape));
  Tensor losses = Tensor::empty({N}), lse_s = Tensor::empty({N}), lse_t = Tensor::empty({N});
  const int64_t count = kern::distill_kl_fwd(losses.data(), lse_s.data(), lse_t.data(), logits.val().data(), teacher.data(),
                                             targets.data.data(), N, V, temperature);
  const float inv = count ? 1.f / static_cast<float>(count) : 0.f;
  Tensor out = Tensor::scalar(static_cast<float>(kern::sum_all(losses.data(), N) * inv));
  return record({logits}, out, [logits, teacher, targets, lse_s, lse_t, N, V, inv, temperature](const Tensor& dout) {
    kern::distill_kl_bwd(logits.grad().data(), logits.val().data(), teacher.data(), lse_s.data(), lse_t.data(),
                         targets.data.data(), N, V, temperature, dout.data()[0] * inv);
  });
}

Var dropout(const Var& x, float p, uint64_t seed) {
  if (!(p >= 0.f && p < 1.f)) fail("dropout", "probability " + std::to_string(p) + " not in [0, 1)");
  if (p == 0.f) return x;
  Tensor out = Tensor::empty(x.shape());
  kern::dropout_fwd(out.data(), x.val().data(), out.numel(), p, seed, 0);
  return record({x}, out, [xs = GradSlot(x), p, seed](const Tensor& dout) {  // the mask is drawn again from the seed
    kern::dropout_bwd(xs.grad().data(), dout.data(), dout.numel(), p, seed, 0);
  });
}

}  // namespace tapelm
