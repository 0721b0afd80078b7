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

Autocast* bf16_autocast() { return t_current && t_current->precision() != Precision::f32 ? t_current : nullptr; }

}  // namespace tapelm
