#pragma once
// Fused causal attention with H query heads over KV key/value heads (MHA: KV = H, GQA, MQA: KV = 1),
// the KV-cache write of incremental decoding, and rotary position embeddings. Query head h reads
// kv head h / (H/KV).
#include <cstdint>

#include "autograd/kernels/common.h"
#include "autograd/kernels/quant.h"

namespace tapelm::kern {

/// Geometry of one attention call. q: [B, Tq, H*hd]; k, v: rows of KV*hd floats, batch b starting
/// at b*kv_batch_stride (so a KV cache [B, Tmax, KV*hd] is read in place); y: [B, Tq, H*hd].
struct AttnShape {
  int64_t B, Tq, Tk, H, KV, hd;
  int64_t kv_batch_stride;  // floats between batches of k and v
  int64_t q_pos0;           // absolute position of query row 0 (causal limit: key j <= q_pos0 + i)
  bool causal = true;
  // Where KV head g's key j is: k + b·kv_batch_stride + g·kv_head_stride + j·kv_row_stride. The
  // defaults (-1) are the activations' layout [B, Tk, KV·hd]: head stride hd, row stride KV·hd.
  // The KV cache is [B, KV, max_len, hd] (head stride max_len·hd, row stride hd): each head's
  // keys are contiguous, so a decoding step streams them.
  int64_t kv_head_stride = -1, kv_row_stride = -1;
  int64_t head_stride() const { return kv_head_stride >= 0 ? kv_head_stride : hd; }
  int64_t row_stride() const { return kv_row_stride >= 0 ? kv_row_stride : KV * hd; }
};

/// y = softmax(q·kᵀ/√hd + masks) · v, with dropout p_drop on the probabilities (mask from seed).
/// A row with no visible key outputs zeros.
///   y, q: [B, Tq, H*hd]   k, v: [B, Tk, KV*hd] (batches kv_batch_stride floats apart)
///   probs: [B, H, Tq, Tk] or null; receives the softmax before dropout, for backward
///   key_keep: [B, Tk] or null; 0 masks a key out
void attention_fwd(float* y, float* probs, const float* q, const float* k, const float* v, const AttnShape& s,
                   const int32_t* key_keep, float p_drop, uint64_t seed);
/// Adds into dq, dk, dv (any may be null). A group's query heads share its dK and dV: each head's
/// share is summed alone and the shares are added in head order, by one thread per (batch, kv head)
/// or, where those pairs are fewer than the threads, after every head's share is done. The same
/// bits on any thread count.
///   dq, dy, q: [B, Tq, H*hd]   dk, dv, k, v: as k in forward   probs: [B, H, Tq, Tk] (from forward)
void attention_bwd(float* dq, float* dk, float* dv, const float* dy, const float* probs, const float* q,
                   const float* k, const float* v, const AttnShape& s, float p_drop, uint64_t seed);

/// Writes the new keys and values into the caches at positions pos .. pos+t-1, stored as `type`.
///   cache_k, cache_v: [B, KV, max_len] rows of kv_row_bytes(type, hd) bytes   k_new, v_new: [B, t, KV·hd]
void kv_cache_write(uint8_t* cache_k, uint8_t* cache_v, KvType type, const float* k_new, const float* v_new,
                    int64_t B, int64_t t, int64_t KV, int64_t hd, int64_t max_len, int64_t pos);
/// attention_fwd for inference (no probabilities kept, no dropout, no key mask) over keys and
/// values stored as `type`: rows of kv_row_bytes(type, hd) bytes, AttnShape's strides counted in
/// values (contiguous rows: row stride hd). A decoding step widens each chunk of keys and values
/// as it reads it, on its thread; a prefill widens every head's keys and values 0 .. Tk-1 first.
void attention_fwd_stored(float* y, const float* q, const uint8_t* k, const uint8_t* v, KvType type, const AttnShape& s);

/// cos/sin tables of angle p * theta^(-2i/rot), computed in double (rot: the rotated dims of a head).
///   cos_t, sin_t: [n_pos, rot/2]
void rope_tables(float* cos_t, float* sin_t, int64_t n_pos, int64_t rot, double theta);
/// Rotates the first rot dims of each head of x at positions pos0 .. pos0+T-1 (half-split within
/// them, GPT-NeoX style: pairs (i, i + rot/2)); dims rot .. hd-1 pass through (GPT-NeoX's partial
/// rotary). inverse applies the transpose rotation (the backward); add accumulates into out. out
/// may alias x.
///   out, x: [B, T, nh*hd]   cos_t, sin_t: [>= pos0+T, rot/2]
void rope_apply(float* out, const float* x, int64_t B, int64_t T, int64_t nh, int64_t hd, int64_t rot, int64_t pos0,
                const float* cos_t, const float* sin_t, bool inverse, bool add);

}  // namespace tapelm::kern
