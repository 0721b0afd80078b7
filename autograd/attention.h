#pragma once
// Fused causal attention with H query heads over KV key/value heads (MHA: KV = H, GQA, MQA: KV = 1),
// and rotary position embeddings, as ops. Query head h reads kv head h / (H/KV). The kernels are
// in autograd/kernels/attention.h.
#include <cstdint>
#include <vector>

#include "autograd/tape.h"

namespace tapelm {

struct AttentionOptions {
  int64_t n_head = 1, n_kv_head = 1;
  bool causal = true;
  float dropout = 0.f;  // on the probabilities; 0 in eval
  uint64_t seed = 0;
  const Index* key_keep = nullptr;  // [B, Tk]: 1 keep, 0 padding (like an attention_mask)
};

/// softmax(q·kᵀ/√hd + mask) · v for q [B,T,H*hd], k, v [B,T,KV*hd]; returns [B,T,H*hd].
Var attention(const Var& q, const Var& k, const Var& v, const AttentionOptions& opt);

/// Incremental decoding (no tape): writes k_new, v_new [B,t,KV*hd] into the caches
/// [B,max_len,KV*hd] at positions pos..pos+t-1, then attends q [B,t,H*hd] causally over 0..pos+t-1.
Var attention_cached(const Var& q, const Var& k_new, const Var& v_new, Tensor& cache_k, Tensor& cache_v,
                     int64_t n_head, int64_t n_kv_head, int64_t pos);

/// Rotary embedding of x [B,T,n_heads*hd] at positions pos0.. with base theta.
Var rope(const Var& x, int64_t n_heads, int64_t pos0, double theta);

}  // namespace tapelm
