#pragma once
// A model run one block at a time from an opened file (train/formats/model_source.h): what a
// conversion, an evaluation or a sample of a model larger than memory holds is the tensors
// outside the blocks, one block, and the hidden states (or the KV cache) of the tokens it runs. Each step is the op GPT::forward
// runs, on the same shapes: the results are GPT's, bit for bit.
#include <functional>
#include <vector>

#include "nn/gpt.h"
#include "train/formats/model_source.h"

namespace tapelm {

/// Whether a command reads m one block at a time rather than whole: when asked, or when the
/// float32 model and `beside` bytes (what the command holds besides: a batch's activations, a KV
/// cache) would take more than 90 % of the memory available. MemAvailable is an estimate: a
/// 23.7 GB model on a machine reporting 24 GB was killed by the OOM killer.
bool read_streamed(const formats::OpenedModel& m, double beside, bool asked);

/// How `sample` holds a model to decode from it.
enum class DecodeHold {
  whole,     // loaded whole in float32 (then packed as --weights asks)
  kept,      // StreamedModel::keep_blocks: the matrices packed (mapped where the file holds them so)
  streamed,  // StreamedModel: every token reads each block from the file
};
template <> struct EnumNames<DecodeHold> {
  static constexpr std::array<std::pair<DecodeHold, const char*>, 3> values{
      {{DecodeHold::whole, "whole"}, {DecodeHold::kept, "kept"}, {DecodeHold::streamed, "streamed"}}};
};
struct DecodePlan {
  DecodeHold hold = DecodeHold::whole;
  WeightType weights = WeightType::f32;  // what the matrices are multiplied in
  double bytes = 0;                      // the estimate checked against the memory available (beside included)
  double mapped = 0;                     // kept: the bytes of matrices to be mapped from the file (not in bytes, but under an address-space limit)
};
/// The plan for decoding m with `beside` bytes held besides the weights (the KV cache, the
/// prefill) when `available` bytes are: whole in float32 when that takes at most 90 % of it (and
/// not asked to stream); else kept when the packed form does (in `weights`, or with "auto" the
/// matrices' own 16-bit type, or q8_0 for a q8_0 GGUF file), the mapped bytes not counted
/// unless an address-space limit applies; else streamed. `weights`: auto, f32, bf16, f16 or q8_0.
DecodePlan plan_decode(const formats::OpenedModel& m, double beside, bool stream_asked, const std::string& weights, double available,
                       bool address_space_limited);

class StreamedModel : public Decoder {
 public:
  /// Reads the tensors outside the blocks (embeddings, final norm, head).
  explicit StreamedModel(const formats::OpenedModel& m);
  const GPTConfig& config() const { return m_.config; }
  /// The bytes it holds of c's weights: the tensors outside the blocks and one block, in float32.
  static double resident_bytes(const GPTConfig& c);
  /// The embedding of ids [B, T] at positions pos0.. (GPT::forward's first step; dropout is off
  /// in evaluation).
  Tensor embed(const Index& idx, int64_t pos0 = 0) const;
  /// Reads each block in turn into an eval-mode Block and calls f(block, layer). The Block is
  /// reused: its tensors are overwritten by the next layer's, so f copies what it keeps.
  void for_each_block(const std::function<void(const Block&, int64_t)>& f) const;
  /// GPT::decode_step, reading every block from the file at each step: sampling from a model
  /// larger than memory (each token costs a read of the whole model, from the page cache when it
  /// fits there).
  Tensor decode_step(const Index& idx, KVCache& cache) const override;
  const GPTConfig& decoder_config() const override { return m_.config; }
  /// Logits [B, T, V] of the last block's output, as GPT::forward ends.
  Var logits(const Tensor& x) const;
  /// The tensors outside the blocks, by parameter name.
  const formats::TensorMap& outer() const { return outer_; }
  /// Frees them (embed and logits then throw): a conversion needs them only at the start.
  void drop_outer() { outer_.clear(); }
  /// Linear weights packed as `type` from now on, as GPT::pack_weights holds them in memory: each
  /// block's matrices packed as they are read, an untied head once (streamed sampling of a q8_0
  /// GGUF file ran float32 weights where the in-memory run used q8_0, and the texts differed).
  void pack_weights(WeightType type);
  /// Reads every block once, packed (pack_weights first), and keeps them: decoding then reads no
  /// file, and a model whose float32 form does not fit in memory runs from its 16-bit or q8_0 form
  /// at the speed of those bytes. What it holds: resident_bytes(c, packed type), of which
  /// mapped_bytes() are the file's own pages (the page cache's), not a copy.
  void keep_blocks();
  bool keeps_blocks() const { return !kept_.empty(); }
  /// The bytes of the matrices it holds mapped from the file (read_block), not copied.
  double mapped_bytes() const;
  /// The bytes keep_blocks holds: every weight as pack_weights(type) holds it.
  static double resident_bytes(const GPTConfig& c, WeightType type) { return packed_weight_bytes(c, type); }

 private:
  /// Reads layer l's tensors into b (a Block of that layer's shape), packed when asked: a matrix
  /// the file stores in the packed type is mapped from it, its bytes not copied.
  void read_block(Block& b, int64_t l) const;
  /// Layer l's mapped files are as they were opened (a data Error otherwise).
  void check_windows(int64_t l) const;

  const formats::OpenedModel& m_;
  formats::TensorMap outer_;
  std::shared_ptr<Norm> ln_f_;
  mutable std::unique_ptr<Block> block_;  // the block being run, its tensors read anew for each layer
  mutable int64_t block_kv_ = 0;          // its key/value heads (layers may differ: a new block then)
  WeightType packed_ = WeightType::f32;
  std::shared_ptr<const PackedMatrix> head_packed_;
  std::vector<std::unique_ptr<Block>> kept_;  // keep_blocks: every block, packed
  mutable std::vector<std::vector<std::shared_ptr<const MappedFile>>> windows_;  // by layer: what its mapped matrices map
  std::shared_ptr<const MappedFile> head_window_;
};

}  // namespace tapelm
