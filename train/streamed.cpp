#include "train/streamed.h"

#include <algorithm>
#include <map>
#include <set>

#include "autograd/ops.h"
#include "autograd/quant.h"
#include "nn/accounting.h"

namespace tapelm {

namespace {
// The float32 model and what is held beside it, which must take at most 90 % of what is available.
double whole_bytes(const formats::OpenedModel& m, double beside) { return 4.0 * static_cast<double>(model_cost(m.config).params) + beside; }
}  // namespace

bool read_streamed(const formats::OpenedModel& m, double beside, bool asked) {
  return asked || whole_bytes(m, beside) > 0.9 * available_memory_bytes();
}

DecodePlan plan_decode(const formats::OpenedModel& m, double beside, bool stream_asked, const std::string& weights, double available,
                       bool address_space_limited) {
  DecodePlan p;
  const bool stream = stream_asked || whole_bytes(m, beside) > 0.9 * available;
  const bool autow = weights == "auto";
  // a GGUF file's q8_0 matrices decode as q8_0: quantizing their widened values gives back the
  // file's blocks (the largest |value| of a block is 127 d, so d and every q come back as stored)
  p.weights = autow ? (m.dtypes.find("Q8_0") != std::string::npos ? WeightType::q8_0 : WeightType::f32)
                    : enum_from_name<WeightType>(weights, "--weights");
  p.hold = stream ? DecodeHold::streamed : DecodeHold::whole;
  p.bytes = stream ? StreamedModel::resident_bytes(m.config) + beside : whole_bytes(m, beside);
  if (!stream || stream_asked) return p;
  // too large in float32 and not asked to stream: a file of 16-bit matrices is held in its own
  // type (widening back gives the file's values exactly); the matrices the file stores in that
  // type are mapped from it (the page cache's, not copied: under an address-space limit they
  // count), the others read once and packed. Besides the packed model, the largest of: a block
  // in float32 while it is read, and an untied head in float32, read before it is packed or mapped.
  // (A q8_0 file's own blocks are multiplied as they are; the whole model requantizes its widened
  // values, which gives them back for blocks whose largest |q| is 127, as ggml and tapelm write them.)
  const WeightType kept = autow && p.weights == WeightType::f32 ? m.matrices_dtype() : p.weights;
  if (kept == WeightType::f32) return p;  // else streamed as asked: auto stays float32
  std::map<std::string, double> block_bytes;
  double head = 0;
  for (const auto& [name, shape] : parameter_shapes(m.config)) {
    const double bytes = 4.0 * static_cast<double>(shape_numel(shape));
    if (name.rfind("blocks.", 0) == 0)
      block_bytes[name.substr(0, name.find('.', 7))] += bytes;  // "blocks.L"
    else if (name == "lm_head.weight")
      head = bytes;
  }
  double largest = head;
  for (const auto& [b, n] : block_bytes) largest = std::max(largest, n);
  const double mapped = m.mappable_bytes(kept);
  const double keep_bytes = StreamedModel::resident_bytes(m.config, kept) - (address_space_limited ? 0.0 : mapped) + largest + beside;
  if (keep_bytes > 0.9 * available) return p;
  p.hold = DecodeHold::kept;
  p.weights = kept;
  p.bytes = keep_bytes;
  p.mapped = mapped;
  return p;
}

StreamedModel::StreamedModel(const formats::OpenedModel& m) : m_(m), windows_(static_cast<size_t>(m.config.n_layer)) {
  const GPTConfig& c = m.config;
  for (const auto& [name, shape] : parameter_shapes(c))
    if (name.rfind("blocks.", 0) != 0) outer_.emplace(name, Tensor::empty(shape));
  m.read(outer_);
  ln_f_ = std::make_shared<Norm>(c.n_embd, c.norm, c.bias, c.norm_eps);
  ln_f_->weight.val() = outer_.at("ln_f.weight");
  if (ln_f_->bias.defined()) ln_f_->bias.val() = outer_.at("ln_f.bias");
}

double StreamedModel::resident_bytes(const GPTConfig& c) {
  double outside = 0, blocks = 0;
  for (const auto& [name, shape] : parameter_shapes(c)) (name.rfind("blocks.", 0) == 0 ? blocks : outside) += static_cast<double>(shape_numel(shape));
  return 4.0 * (outside + blocks / static_cast<double>(c.n_layer));
}

Tensor StreamedModel::embed(const Index& idx, int64_t pos0) const {
  if (outer_.empty()) throw Error(ErrorKind::internal, "StreamedModel::embed after drop_outer");
  if (idx.shape.size() != 2) throw Error(ErrorKind::shape, "gpt: token ids must be [B, T], got " + shape_str(idx.shape));
  const int64_t T = idx.shape[1];
  if (pos0 + T > m_.config.block_size)
    throw Error(ErrorKind::shape, "gpt: sequence of " + std::to_string(pos0 + T) + " positions exceeds block_size " +
                                      std::to_string(m_.config.block_size));
  Var x = embedding(Var(outer_.at("wte.weight")), idx);
  if (m_.config.pos == PosKind::Learned) x = add(x, slice(Var(outer_.at("wpe.weight")), 0, pos0, pos0 + T));
  return x.val();
}

void StreamedModel::read_block(Block& b, int64_t l) const {
  const std::string prefix = "blocks." + std::to_string(l) + ".";
  std::vector<std::shared_ptr<const MappedFile>>& windows = windows_[static_cast<size_t>(l)];
  windows.clear();
  std::set<std::string> mapped;
  for (const auto& [n, lin] : b.linears()) {
    if (lin->packed) {  // the previous layer's packed matrix: float room again
      lin->weight.val() = Tensor::empty({lin->packed->rows, lin->packed->cols});
      lin->packed.reset();
    }
    // the file's own bytes when it stores the matrix in the packed type: mapped, not copied
    if (std::optional<formats::OpenedModel::MappedMatrix> mm = m_.map_matrix(prefix + n + ".weight", packed_)) {
      lin->packed = std::make_shared<const PackedMatrix>(std::move(mm->matrix));
      lin->weight.val() = Tensor();
      windows.push_back(std::move(mm->window));
      mapped.insert(n + ".weight");
    }
  }
  formats::TensorMap mine;
  for (const auto& [n, p] : b.named_parameters())
    if (!mapped.count(n)) mine.emplace(prefix + n, p.val());
  m_.read(mine);
  for (const auto& [n, lin] : b.linears())
    if (!lin->packed && packs(packed_, lin->weight.shape())) lin->pack(packed_, prefix + n);
}

void StreamedModel::for_each_block(const std::function<void(const Block&, int64_t)>& f) const {
  for (int64_t l = 0; l < m_.config.n_layer; l++) {
    if (!kept_.empty()) {
      f(*kept_[static_cast<size_t>(l)], l);
      check_windows(l);  // a mapped file written under the run: refused, not decoded from
      continue;
    }
    if (!block_ || block_kv_ != m_.config.kv_heads(l)) {
      UnzeroedWeights read_next;  // every weight is read or mapped before it is used
      block_ = std::make_unique<Block>(m_.config.layer(l), std::make_shared<Rng>(0));
      block_->eval();
      block_kv_ = m_.config.kv_heads(l);
    }
    read_block(*block_, l);
    f(*block_, l);
    check_windows(l);
    windows_[static_cast<size_t>(l)].clear();  // one block's mapping at a time (the Block holds it until the next read)
  }
}

double StreamedModel::mapped_bytes() const {
  double n = head_window_ ? static_cast<double>(head_window_->size()) : 0.0;
  for (const auto& layer : windows_)
    for (const auto& w : layer) n += static_cast<double>(w->size());
  return n;
}

void StreamedModel::check_windows(int64_t l) const {
  for (const auto& w : windows_[static_cast<size_t>(l)]) w->check_unchanged();
}

void StreamedModel::keep_blocks() {
  if (packed_ == WeightType::f32) throw Error(ErrorKind::internal, "StreamedModel::keep_blocks before pack_weights");
  block_.reset();
  kept_.clear();
  std::vector<std::unique_ptr<Block>> kept;  // kept_ only once whole: a failed read keeps nothing
  for (int64_t l = 0; l < m_.config.n_layer; l++) {
    UnzeroedWeights read_next;  // every weight is read or mapped before it is used
    auto b = std::make_unique<Block>(m_.config.layer(l), std::make_shared<Rng>(0));
    b->eval();
    read_block(*b, l);
    kept.push_back(std::move(b));
  }
  kept_ = std::move(kept);
}

Tensor StreamedModel::decode_step(const Index& idx, KVCache& cache) const {
  NoGrad ng;
  if (idx.shape.size() != 2 || idx.shape[0] != cache.batch)
    throw Error(ErrorKind::shape, "gpt: decode ids " + shape_str(idx.shape) + " for a cache of batch " + std::to_string(cache.batch));
  const int64_t B = idx.shape[0], t = idx.shape[1], pos = cache.len;
  Var x(embed(idx, pos));
  for_each_block([&](const Block& b, int64_t l) { x = b.forward_cached(x, cache.layers[static_cast<size_t>(l)], pos); });
  cache.len += t;
  return logits(reshape(slice(x, 1, t - 1, t), {B, m_.config.n_embd}).val()).val();
}

Var StreamedModel::logits(const Tensor& x) const {
  if (outer_.empty()) throw Error(ErrorKind::internal, "StreamedModel::logits after drop_outer");
  if (head_packed_) {
    Var y = linear_packed(ln_f_->forward(Var(x)), *head_packed_);
    if (head_window_) head_window_->check_unchanged();
    return y;
  }
  const Tensor& head = m_.config.tie_embeddings ? outer_.at("wte.weight") : outer_.at("lm_head.weight");
  return linear(ln_f_->forward(Var(x)), Var(head));
}

void StreamedModel::pack_weights(WeightType type) {
  packed_ = type;
  block_.reset();  // packed from the next read on
  if (!m_.config.tie_embeddings && outer_.count("lm_head.weight") && packs(type, outer_.at("lm_head.weight").shape())) {
    if (std::optional<formats::OpenedModel::MappedMatrix> mm = m_.map_matrix("lm_head.weight", type)) {
      head_packed_ = std::make_shared<const PackedMatrix>(std::move(mm->matrix));
      head_window_ = std::move(mm->window);
    } else {
      head_packed_ = std::make_shared<const PackedMatrix>(PackedMatrix::pack(outer_.at("lm_head.weight"), type, "lm_head"));
    }
    outer_.erase("lm_head.weight");
  }
}

}  // namespace tapelm
