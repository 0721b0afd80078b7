#pragma once
// Fused causal attention with H query heads over KV key/value heads (MHA: KV = H, GQA, MQA: KV = 1),
// and rotary position embeddings. Query head h reads kv head h / (H/KV).
#include <cstdint>
#include <vector>

#include "autograd/tape.h"

namespace tapelm {

namespace kern {

/// Geometry of one attention call. q: [B, Tq, H*hd]; k, v: rows of KV*hd floats, batch b starting
/// at b*kv_batch_stride (so a KV cache [B, Tmax, KV*hd] is read in place); y: [B, Tq, H*hd].
struct AttnShape {
  int64_t B, Tq, Tk, H, KV, hd;
  int64_t kv_batch_stride;  // floats between batches of k and v
  int64_t q_pos0;           // absolute position of query row 0 (causal limit: key j <= q_pos0 + i)
  bool causal = true;
};

/// probs (optional, [B, H, Tq, Tk]) receives the softmax before dropout, for backward.
/// key_keep (optional, [B, Tk]): 0 masks a key out. A row with no visible key outputs zeros.
void attention_fwd(float* y, float* probs, const float* q, const float* k, const float* v, const AttnShape& s,
                   const int32_t* key_keep, float p_drop, uint64_t seed);
/// Adds into dq, dk, dv (any may be null). Threads own (batch, kv head) pairs, so the group's
/// dK and dV sums never race.
void attention_bwd(float* dq, float* dk, float* dv, const float* dy, const float* probs, const float* q,
                   const float* k, const float* v, const AttnShape& s, float p_drop, uint64_t seed);

/// cos/sin tables [n_pos, hd/2] of angle p * theta^(-2i/hd), computed in double.
void rope_tables(float* cos_t, float* sin_t, int64_t n_pos, int64_t hd, double theta);
/// Rotates each head of x [B, T, nh*hd] at positions pos0 .. pos0+T-1 (half-split, GPT-NeoX
/// style); inverse=true applies the transpose rotation (the backward). out may alias x.
void rope_apply(float* out, const float* x, int64_t B, int64_t T, int64_t nh, int64_t hd, int64_t pos0,
                const float* cos_t, const float* sin_t, bool inverse, bool add);

}  // namespace kern

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
