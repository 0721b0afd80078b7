#pragma once
// Fused causal attention with H query heads over KV key/value heads (MHA: KV = H, GQA, MQA: KV = 1),
// and rotary position embeddings, as ops. Query head h reads kv head h / (H/KV). The kernels are
// in autograd/kernels/attention.h.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/quant.h"
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

// How a KV cache stores keys and values (KvType, autograd/quant.h): f32; f16 or bf16 (half the
// bytes; f16 as llama.cpp's default cache); q8 (llama.cpp's q8_0 blocks of 32 along each head's
// row: 34 bytes per 32 values).
// Named by EnumNames<KvType> (autograd/quant.h): to_string, enum_from_name<KvType>.
/// Checks that rows of hd values can be stored as t (q8: hd a multiple of 32), else a usage error.
void check_kv_type(KvType t, int64_t hd);

/// One layer's cached keys (or values): [B, KV, max_len] rows of hd values stored as `type`, every
/// head's positions contiguous so that a decoding step streams them (autograd/kernels/attention.h).
struct KvStore {
  KvType type = KvType::f32;
  int64_t batch = 0, heads = 0, max_len = 0, hd = 0;
  std::vector<uint8_t> data;
  KvStore() = default;
  KvStore(KvType t, int64_t batch, int64_t heads, int64_t max_len, int64_t hd);
  int64_t bytes() const { return static_cast<int64_t>(data.size()); }
};

/// Incremental decoding (no tape): stores k_new, v_new [B,t,KV*hd] into the caches at positions
/// pos..pos+t-1, then attends q [B,t,H*hd] causally over 0..pos+t-1, reading keys and values as
/// the cache holds them (rounded to its type).
Var attention_cached(const Var& q, const Var& k_new, const Var& v_new, KvStore& cache_k, KvStore& cache_v,
                     int64_t n_head, int64_t n_kv_head, int64_t pos);

/// The values x [B, T, n_heads·hd] stands for once stored in a KV cache of type t (each head's
/// row of hd values rounded as the cache rounds it): an evaluation of what a 16-bit or 8-bit cache
/// costs in quality. No gradient flows through it.
Var round_kv(const Var& x, int64_t n_heads, KvType t);

/// Rotary embedding of x [B,T,n_heads*hd] at positions pos0.. with base theta, on the first rot
/// dims of each head (0: all of them; the rest pass through, GPT-NeoX's partial rotary).
Var rope(const Var& x, int64_t n_heads, int64_t pos0, double theta, int64_t rot = 0);

}  // namespace tapelm
