#pragma once
// Row gather and its scatter-add.
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// out[t,:] = w[idx[t],:]   (ids already checked to lie in [0, V))
///   out: [N, C]   w: [V, C]   idx: [N]
void embedding_fwd(float* out, const float* w, const int32_t* idx, int64_t N, int64_t C);
/// dw[idx[t],:] += dout[t,:]   (threads own column blocks, so repeated ids never race)
///   dw: [V, C]   dout: [N, C]   idx: [N]
void embedding_bwd(float* dw, const float* dout, const int32_t* idx, int64_t N, int64_t C);

}  // namespace tapelm::kern
