#pragma once
// The layers of docs/formats.md §1. nn/ only combines ops: no tape, no raw pointers.
#include <memory>

#include "autograd/attention.h"
#include "autograd/ops.h"
#include "nn/config.h"
#include "nn/module.h"
#include "nn/rng.h"

namespace tapelm {

/// While one lives on this thread, a new Linear's weight is allocated but not zeroed: its values
/// are about to be read from a file, or mapped from it and the allocation dropped (a 7B block's
/// 0.8 GB of zeros, written and freed for each of 32 blocks, took longer than mapping the model).
class UnzeroedWeights {
 public:
  UnzeroedWeights();
  ~UnzeroedWeights();
  UnzeroedWeights(const UnzeroedWeights&) = delete;
  UnzeroedWeights& operator=(const UnzeroedWeights&) = delete;

 private:
  bool before_;
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias);
  Var forward(const Var& x) const { return packed ? linear_packed(x, *packed, bias) : linear(x, weight, bias); }
  /// Inference with a smaller weight: stores it as `type` (q8_0 rows, in a multiple of 32, or
  /// bf16 / f16 values) and frees the float copy; forward then multiplies by the packed weight
  /// (no gradient). `what` names the layer in errors.
  void pack(WeightType type, const std::string& what);
  Var weight, bias;  // bias undefined without bias
  std::shared_ptr<const PackedMatrix> packed;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Var forward(const Index& ids) const { return embedding(weight, ids); }
  Var weight;
};

/// LayerNorm (optional bias), RMSNorm, or RMSNorm scaled by (1 + w) (Gemma's), per the config.
class Norm : public Module {
 public:
  Norm(int64_t dim, NormKind kind, bool bias, double eps);
  Var forward(const Var& x) const;
  Var weight, bias;

 private:
  bool rms_, one_plus_;
  float eps_;
};

/// Draws a fresh mask seed from the model's dropout stream on every call in training mode.
class Dropout : public Module {
 public:
  Dropout(double p, std::shared_ptr<Rng> rng) : p_(static_cast<float>(p)), rng_(std::move(rng)) {}
  Var forward(const Var& x) const;

 private:
  float p_;
  std::shared_ptr<Rng> rng_;
};

/// fc -> GELU (exact, or its tanh approximation for mlp gelu_tanh) or ReLU (OPT's) -> proj, or
/// down(silu(gate x) * up x), or down(gelu_tanh(gate x) * up x) (GeGLU, Gemma's).
class MLP : public Module {
 public:
  explicit MLP(const GPTConfig& c);
  Var forward(const Var& x) const;
  std::shared_ptr<Linear> fc, proj, gate, up, down;

 private:
  bool gated_, tanh_, relu_;
};

/// One attention layer's K and V for every position decoded so far: [B, KV, max_len, hd] each, every
/// KV head's positions contiguous so that a decoding step streams them (autograd/attention.h).
struct LayerCache {
  KvStore k, v;
};

class Attention : public Module {
 public:
  Attention(const GPTConfig& c, std::shared_ptr<Rng> rng);
  /// x [B,T,d] -> [B,T,d] (before the residual dropout). key_keep: optional [B,T] padding mask.
  Var forward(const Var& x, const Index* key_keep) const;
  /// x [B,t,d] holds positions pos..pos+t-1; appends their K/V to the cache, attends over 0..pos+t-1.
  Var forward_cached(const Var& x, LayerCache& cache, int64_t pos) const;
  std::shared_ptr<Linear> wq, wk, wv, wo;
  /// RMSNorm of the queries and keys before RoPE (qk_norm head: over each head's hd values, one
  /// weight for all heads; all: over the whole projection); null without qk_norm.
  std::shared_ptr<Norm> q_norm, k_norm;
  /// forward() rounds K and V as a cache of this type stores them (evaluation only; f32: not at all).
  KvType kv_round = KvType::f32;

 private:
  /// The query, key and value projections of x, read in one pass when x has few rows.
  std::vector<Var> qkv(const Var& x) const;
  /// q and k normalised (qk_norm) and rotated (RoPE) at positions pos..
  void position(Var& q, Var& k, int64_t pos) const;
  int64_t H_, KV_, hd_, rot_;
  bool rope_, per_head_norm_;
  double theta_;
  float p_;
  std::shared_ptr<Rng> rng_;
};

class Block : public Module {
 public:
  Block(const GPTConfig& c, std::shared_ptr<Rng> rng);
  /// attn_in, when given, receives the attention's input [B,T,d], ln1(x) (x itself with post-norms:
  /// calibration statistics);
  /// attn_out the attention's output [B,T,d] before dropout and the residual (on the tape).
  Var forward(const Var& x, const Index* key_keep, Tensor* attn_in = nullptr, Var* attn_out = nullptr) const;
  Var forward_cached(const Var& x, LayerCache& cache, int64_t pos) const;
  /// The block's linear layers by name ("attn.wq", ..., "mlp.down"), those its MLP kind has.
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> linears() const;
  std::shared_ptr<Norm> ln1, ln2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<MLP> mlp;
  std::shared_ptr<Dropout> drop;

 private:
  bool parallel_, post_;
};

}  // namespace tapelm
