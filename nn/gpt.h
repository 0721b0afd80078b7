#pragma once
// The GPT of docs/formats.md §1 with configurable key/value heads, and KV-cache decoding.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace tapelm {

/// K and V for every layer, holding the KV heads only: bytes ∝ n_kv_head, stored as `type`.
struct KVCache {
  std::vector<LayerCache> layers;
  int64_t batch = 0, max_len = 0, len = 0;  // len: positions filled so far
  KvType type = KvType::f32;
  int64_t bytes() const;
};

/// An empty cache of config c for `batch` sequences of up to max_len (<= block_size) positions.
KVCache make_kv_cache(const GPTConfig& c, int64_t batch, int64_t max_len, KvType type = KvType::f32);

/// What generation runs: a model fed ids at a cache's position. GPT holds its weights; a model
/// larger than memory reads each block as it goes (train/streamed.h).
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual const GPTConfig& decoder_config() const = 0;
  /// Feeds ids [B, t] at positions cache.len.. (prefill when t > 1), returns the logits of the
  /// last position [B, V]. No tape.
  virtual Tensor decode_step(const Index& idx, KVCache& cache) const = 0;
};

/// Where the blocks' parameters live between uses (ZeRO stage 3, train/trainer.cpp): gather(l)
/// makes block l's parameters whole on this process, release(l) frees what another process keeps.
/// Both are collectives where they send; GPT calls them in the same order on every process.
class BlockResidency {
 public:
  virtual ~BlockResidency() = default;
  virtual void gather(size_t layer) = 0;
  virtual void release(size_t layer) = 0;
  /// Whether gather and release are collectives (every process must make the same calls).
  virtual bool collective() const = 0;
};

class GPT : public Module, public Decoder {
 public:
  /// Which parameters (by name) to give values.
  using Keep = std::function<bool(const std::string& name)>;
  /// Builds the model and draws its init (docs/formats.md §1) from seed. With `init_only`, only
  /// the parameters it names are drawn: the linear weights of the others are allocated and never
  /// written (no memory is touched until a value arrives: ZeRO stage 3's weights another rank
  /// keeps), and each drawn one is what the whole model's init gives it.
  explicit GPT(const GPTConfig& cfg, uint64_t seed = 1337, const Keep& init_only = nullptr);
  const GPTConfig& config() const { return cfg_; }
  /// Re-draws every parameter (or those `only` names) as docs/formats.md §1: normal(0, 0.02),
  /// residual projections 0.02/√(2L), norm weights 1, biases 0. A parameter's values do not depend
  /// on which others are drawn.
  void init_weights(uint64_t seed, const Keep& only = nullptr);

  /// Logits [B, T, V] for ids [B, T]; key_keep [B, T] (1 keep, 0 pad) masks padded keys.
  /// attn_outs, when given, receives each block's attention output [B, T, d] (Block::forward).
  Var forward(const Index& idx, const Index* key_keep = nullptr, std::vector<Var>* attn_outs = nullptr) const;
  /// The input of every layer's attention, ln1(x) [B, T, d] per layer, from the forward pass
  /// (what conversion calibrates on; call it under NoGrad, in eval mode).
  std::vector<Tensor> attention_inputs(const Index& idx) const;
  /// Mean cross-entropy of forward(idx) against targets [B, T] (-1 ignored).
  Var loss(const Index& idx, const Index& targets, const Index* key_keep = nullptr) const;

  /// An empty cache for `batch` sequences of up to max_len (<= block_size) positions.
  KVCache make_cache(int64_t batch, int64_t max_len, KvType type = KvType::f32) const;
  Tensor decode_step(const Index& idx, KVCache& cache) const override;
  const GPTConfig& decoder_config() const override { return cfg_; }

  /// Decoding with smaller weights: every block's linear weights and the output head (unless tied
  /// to the embedding, which stays float32) become `type` (q8_0 rows, or bf16 / f16 values) and
  /// their float copies are freed; the model then runs inference only (no gradient, no saving).
  /// For q8_0 a matrix whose rows are not a multiple of 32 values stays float32 (llama.cpp's
  /// converter keeps such a matrix in f16).
  void pack_weights(WeightType type);
  /// Every attention layer's forward rounds K and V as a KV cache of type t stores them: the loss
  /// a 16-bit or 8-bit cache would give (evaluation only; f32 undoes it).
  void round_kv_as(KvType t);
  /// Bytes of the weights as held (packed where packed).
  int64_t weight_bytes() const;

  /// Training forwards keep one hidden state per block and recompute each block's activations in
  /// backward (autograd checkpoint): activation memory of one block, gradients bit for bit the same.
  bool recompute_blocks = false;

  /// When set, forward gathers each block's parameters just before the block runs and releases
  /// them after it; a recording forward also has backward gather them before the block's backward
  /// and release them after it (on_backward), so one block at a time is whole. Decoding does not
  /// use it (a model being trained is not decoded).
  std::shared_ptr<BlockResidency> residency;

  /// The dropout stream: its state is part of the training state.
  Rng& dropout_rng() { return *rng_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<Norm> ln_f;
  Var lm_head;  // wte.weight when tied
  std::shared_ptr<const PackedMatrix> lm_head_packed;  // after pack_weights when untied

 private:
  Var embed(const Index& idx, int64_t pos0) const;
  /// Block l's forward, its parameters gathered around it when `residency` is set.
  Var forward_block(size_t l, const Var& x, const Index* key_keep, Tensor* attn_in, Var* attn_out) const;
  /// Block l's forward, recomputed in backward when recompute_blocks asks for it.
  Var run_block(size_t l, const Var& x, const Index* key_keep, Tensor* attn_in, Var* attn_out) const;
  Var head(const Var& x) const { return lm_head_packed ? linear_packed(x, *lm_head_packed) : linear(x, lm_head); }
  GPTConfig cfg_;
  std::shared_ptr<Rng> rng_;
  std::shared_ptr<Dropout> drop_;
};

/// Block parameters held in 16 bits between uses (the frozen weights of `trainable: attention | kv`,
/// whose values are the source's bf16 or f16 ones): gather(l) widens block l's into float32 and
/// release(l) frees the float32 copy, so one block's are float32 at a time. Local to the process.
class NarrowedBlocks : public BlockResidency {
 public:
  /// What a block parameter is held in, by its name ("blocks.L.…") and value: bf16 or f16, or f32
  /// to leave it as it is.
  using HeldAs = std::function<WeightType(const std::string& name, const Tensor& value)>;
  /// Narrows each block parameter of `model` to the type held_as gives (rounded to nearest even)
  /// and frees its float32 values; set the result as model.residency. The parameters must have
  /// values (none released).
  NarrowedBlocks(const GPT& model, const HeldAs& held_as);
  /// Nothing narrowed yet, for a model of `layers` blocks: narrow() narrows them one at a time
  /// (as a conversion fills them).
  explicit NarrowedBlocks(size_t layers);
  /// Narrows block l of `model` as the constructor does; a parameter held already is left as it is.
  void narrow(const GPT& model, size_t l, const HeldAs& held_as);
  /// Block l's held parameters that hold float32 values again (read anew, as a resumed run reads
  /// its checkpoint's) are narrowed again into their types, replacing what was held, and freed.
  void renarrow(size_t l);
  /// Whether block l holds any parameter narrowed here.
  bool holds_any(size_t l) const { return !layers_.at(l).empty(); }
  /// What is held becomes the same parameters of `other` (a model of the same shapes, whose
  /// narrowed parameters then hold no float32 values): a model taking over another's weights.
  void rebind(const GPT& other);
  void gather(size_t layer) override;
  void release(size_t layer) override;
  bool collective() const override { return false; }
  /// Every narrowed block released, the freed float32 storage returned to the system.
  void release_all();
  /// p's values in float32: widened from the 16 bits when p is narrowed (a new tensor), else p.val().
  Tensor value(const Var& p) const;
  /// Whether p is held narrowed here.
  bool holds(const Var& p) const;
  int64_t values() const { return values_; }    // narrowed, in all blocks
  int64_t largest_block() const;                 // narrowed, in the block that has the most
  int64_t inexact() const { return inexact_; }  // of them, changed by the rounding (0: exactly the values)
  /// "bf16" or "f16", or "bf16 and f16" when both hold some.
  std::string types() const;

 private:
  struct Held {
    Var p;
    size_t index;  // p's place in its block's named_parameters()
    std::string name;  // "blocks.L.…"
    Shape shape;
    WeightType type;
    std::vector<uint16_t> bits;
  };
  const Held* find(const Var& p) const;
  /// h.p's float32 values into h.bits (an overflow refused, naming it), then freed.
  void store(Held& h);
  std::vector<std::vector<Held>> layers_;
  std::vector<char> whole_;
  int64_t values_ = 0, inexact_ = 0;
};

/// The block of a parameter named "blocks.L.…": L; -1 for any other name.
int64_t block_index(const std::string& name);

/// The 16-bit type (bf16, else f16) that holds every value of t exactly, or f32 when neither does.
WeightType exact_16bit_type(const Tensor& t);

/// Every parameter's name and shape for config c, in named_parameters() order, without building
/// the model (what a file's tensors are checked against before any memory is committed).
std::vector<std::pair<std::string, Shape>> parameter_shapes(const GPTConfig& c);

/// Whether pack_weights(type) packs a linear weight of shape w (q8_0: rows of a multiple of 32).
bool packs(WeightType type, const Shape& w);
/// Bytes of c's weights once pack_weights(type) has packed them (f32: every weight in float32).
double packed_weight_bytes(const GPTConfig& c, WeightType type);

}  // namespace tapelm
