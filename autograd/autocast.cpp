#include "autograd/autocast.h"

#include "autograd/error.h"
#include "autograd/kernels/blas.h"

namespace tapelm {

namespace {
thread_local Autocast* t_current = nullptr;
}

std::string precision_unavailable(Precision p) {
  if (p != Precision::bf16) return "";
  const std::string missing = kern::bf16_gemm_native_missing();
  if (missing.empty()) return "";
  return "precision bf16: " + missing +
         "; bf16-emulated computes bf16's numbers with f32 instructions (no faster than f32: for quality studies)";
}

Autocast::Autocast(Precision p) : p_(p), prev_(t_current) {
  if (const std::string why = precision_unavailable(p); !why.empty()) fail(ErrorKind::usage, why);
  t_current = this;
}

Autocast::~Autocast() { t_current = prev_; }

const Autocast::Bf16Copy& Autocast::weight(const Tensor& w) {
  auto it = copies_.find(w.data());
  if (it != copies_.end() && it->second.source.numel() == w.numel()) return it->second;
  Bf16Copy c{w, nullptr, Tensor()};
  if (p_ == Precision::bf16) {
    auto b = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(w.numel()));
    kern::to_bf16(b->data(), w.data(), w.numel());
    c.bits = std::move(b);
  } else {
    c.rounded = Tensor::empty(w.shape());
    kern::round_bf16(c.rounded.data(), w.data(), w.numel());
  }
  return copies_[w.data()] = std::move(c);
}

Autocast* bf16_autocast() { return t_current && t_current->precision() != Precision::f32 ? t_current : nullptr; }

}  // namespace tapelm
