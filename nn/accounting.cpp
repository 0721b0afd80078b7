#include "nn/accounting.h"

namespace tapelm {

ModelCost model_cost(const GPTConfig& c, int64_t T) {
  if (T <= 0) T = c.block_size;
  const int64_t d = c.n_embd, hd = c.head_dim(), q = c.n_head * hd, kv = c.n_kv_head * hd, hid = c.mlp_hidden;
  const int64_t V = c.vocab_size, L = c.n_layer, b = c.bias ? 1 : 0;
  const int64_t norm = c.norm == NormKind::LayerNorm && c.bias ? 2 * d : d;
  const bool swiglu = c.mlp == MlpKind::SwiGLU;
  const int64_t attn_p = d * q + 2 * d * kv + q * d + b * (q + 2 * kv + d);
  const int64_t mlp_p = swiglu ? 3 * d * hid + b * (2 * hid + d) : 2 * d * hid + b * (hid + d);
  ModelCost m{};
  m.params = V * d + (c.pos == PosKind::Learned ? c.block_size * d : 0) + L * (2 * norm + attn_p + mlp_p) + norm +
             (c.tie_embeddings ? 0 : V * d);
  const double attn_mm = 2.0 * (d * q + 2 * d * kv + q * d), mlp_mm = 2.0 * (swiglu ? 3 : 2) * d * hid;
  const double attn_core = 4.0 * static_cast<double>(T) * q;
  m.forward_flops_per_token = L * (attn_mm + mlp_mm + attn_core) + 2.0 * d * V;
  m.train_flops_per_token = 3.0 * m.forward_flops_per_token;
  m.kv_cache_bytes_per_token = 2 * L * kv * static_cast<int64_t>(sizeof(float));
  return m;
}

}  // namespace tapelm
