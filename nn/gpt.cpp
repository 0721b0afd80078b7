#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

namespace tapelm {

int64_t KVCache::bytes() const {
  int64_t n = 0;
  for (const LayerCache& l : layers) n += l.k.bytes() + l.v.bytes();
  return n;
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed, const Keep& init_only) : cfg_(cfg), rng_(std::make_shared<Rng>(seed ^ 0xD50D0u)) {
  cfg_.validate();
  std::optional<UnzeroedWeights> untouched;  // the weights init_only leaves are never written
  if (init_only) untouched.emplace();
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd));
  if (cfg.pos == PosKind::Learned) wpe = register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd));
  drop_ = register_module("drop", std::make_shared<Dropout>(cfg.dropout, rng_));
  for (int64_t i = 0; i < cfg.n_layer; i++)
    blocks.push_back(register_module("blocks." + std::to_string(i), std::make_shared<Block>(cfg.layer(i), rng_)));
  ln_f = register_module("ln_f", std::make_shared<Norm>(cfg.n_embd, cfg.norm, cfg.bias, cfg.norm_eps));
  if (cfg.tie_embeddings)
    lm_head = wte->weight;
  else
    lm_head = register_parameter("lm_head.weight", Tensor::zeros({cfg.vocab_size, cfg.n_embd}));
  init_weights(seed, init_only);
}

void GPT::init_weights(uint64_t seed, const Keep& only) {
  Rng rng(seed);
  const double std_res = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  for (auto& [name, p] : named_parameters()) {
    Tensor& t = p.val();
    const bool drawn = !name.ends_with(".bias") && t.ndim() != 1;
    if (only && !only(name)) {
      if (drawn) rng.skip_normals(static_cast<uint64_t>(t.numel()));  // the stream where drawing them leaves it
      continue;
    }
    if (name.ends_with(".bias")) {
      t.zero();
    } else if (t.ndim() == 1) {  // norm weights: a scale of one (Gemma's (1 + w): w = 0; its q/k norms are plain)
      const bool one_plus = cfg_.norm == NormKind::RMSNorm1p && name.find("_norm.") == std::string::npos;
      t.fill(one_plus ? 0.f : 1.f);
    } else {
      const bool residual =
          name.ends_with("attn.wo.weight") || name.ends_with("mlp.proj.weight") || name.ends_with("mlp.down.weight");
      const double sd = residual ? std_res : 0.02;
      for (int64_t i = 0; i < t.numel(); i++) t[i] = static_cast<float>(rng.normal() * sd);
    }
  }
}

Var GPT::embed(const Index& idx, int64_t pos0) const {
  if (idx.shape.size() != 2)
    throw Error(ErrorKind::shape, "gpt: token ids must be [B, T], got " + shape_str(idx.shape));
  const int64_t T = idx.shape[1];
  if (pos0 + T > cfg_.block_size)
    throw Error(ErrorKind::shape, "gpt: sequence of " + std::to_string(pos0 + T) + " positions exceeds block_size " +
                     std::to_string(cfg_.block_size));
  Var x = wte->forward(idx);
  if (cfg_.embed_scale != 0) x = mul(x, static_cast<float>(cfg_.embed_scale));  // Gemma's √d (the head reads wte unscaled)
  if (wpe) x = add(x, slice(wpe->weight, 0, pos0, pos0 + T));  // [T, d] broadcast over the batch
  return x;
}

Var GPT::forward(const Index& idx, const Index* key_keep, std::vector<Var>* attn_outs) const {
  Var x = drop_->forward(embed(idx, 0));
  if (key_keep && key_keep->shape != idx.shape)
    throw Error(ErrorKind::shape, "gpt: attention mask " + shape_str(key_keep->shape) + " for ids " + shape_str(idx.shape));
  if (attn_outs) attn_outs->assign(blocks.size(), Var());
  for (size_t l = 0; l < blocks.size(); l++) x = forward_block(l, x, key_keep, nullptr, attn_outs ? &(*attn_outs)[l] : nullptr);
  return head(ln_f->forward(x));
}

Var GPT::forward_block(size_t l, const Var& x, const Index* key_keep, Tensor* attn_in, Var* attn_out) const {
  const std::shared_ptr<BlockResidency> r = residency;
  if (!r) return run_block(l, x, key_keep, attn_in, attn_out);
  // backward runs these in reverse: gather before the block's ops, release after them
  on_backward([r, l] { r->release(l); });
  r->gather(l);
  const Var y = run_block(l, x, key_keep, attn_in, attn_out);
  r->release(l);
  on_backward([r, l] { r->gather(l); });
  return y;
}

Var GPT::run_block(size_t l, const Var& x, const Index* key_keep, Tensor* attn_in, Var* attn_out) const {
  if (!recompute_blocks || attn_in || attn_out || !grad_enabled()) return blocks[l]->forward(x, key_keep, attn_in, attn_out);
  // the block computed again in backward from its input, its dropout masks drawn again from the
  // stream where they were drawn, the stream then left where the forward had it
  std::vector<Var> params;
  for (const auto& [name, p] : blocks[l]->named_parameters()) params.push_back(p);
  const std::optional<Index> keep = key_keep ? std::optional<Index>(*key_keep) : std::nullopt;
  auto first = std::make_shared<bool>(true);
  return checkpoint(x, params, [block = blocks[l], rng = rng_, at = rng_->state(), keep, first](const Var& in) {
    const uint64_t now = rng->state();
    rng->set_state(at);
    Var out = block->forward(in, keep ? &*keep : nullptr);
    if (!*first) rng->set_state(now);
    *first = false;
    return out;
  });
}

std::vector<Tensor> GPT::attention_inputs(const Index& idx) const {
  std::vector<Tensor> out(blocks.size());
  Var x = drop_->forward(embed(idx, 0));
  for (size_t l = 0; l < blocks.size(); l++) x = forward_block(l, x, nullptr, &out[l], nullptr);
  return out;
}

Var GPT::loss(const Index& idx, const Index& targets, const Index* key_keep) const {
  if (targets.shape != idx.shape)
    throw Error(ErrorKind::shape, "gpt: targets " + shape_str(targets.shape) + " for ids " + shape_str(idx.shape));
  return cross_entropy(forward(idx, key_keep), targets);
}

KVCache make_kv_cache(const GPTConfig& cfg, int64_t batch, int64_t max_len, KvType type) {
  if (batch <= 0 || max_len <= 0 || max_len > cfg.block_size)
    throw Error(ErrorKind::shape, "gpt: cache for batch " + std::to_string(batch) + " and " + std::to_string(max_len) +
                     " positions (block_size " + std::to_string(cfg.block_size) + ")");
  KVCache c;
  c.batch = batch;
  c.max_len = max_len;
  c.type = type;
  const int64_t hd = cfg.head_dim();
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    const int64_t KV = cfg.kv_heads(l);
    c.layers.push_back({KvStore(type, batch, KV, max_len, hd), KvStore(type, batch, KV, max_len, hd)});
  }
  return c;
}

KVCache GPT::make_cache(int64_t batch, int64_t max_len, KvType type) const {
  return make_kv_cache(cfg_, batch, max_len, type);
}

Tensor GPT::decode_step(const Index& idx, KVCache& cache) const {
  NoGrad ng;
  if (idx.shape.size() != 2 || idx.shape[0] != cache.batch)
    throw Error(ErrorKind::shape, "gpt: decode ids " + shape_str(idx.shape) + " for a cache of batch " + std::to_string(cache.batch));
  const int64_t B = idx.shape[0], t = idx.shape[1], pos = cache.len;
  Var x = embed(idx, pos);
  for (size_t l = 0; l < blocks.size(); l++) x = blocks[l]->forward_cached(x, cache.layers[l], pos);
  cache.len += t;
  Var last = reshape(slice(x, 1, t - 1, t), {B, cfg_.n_embd});
  return head(ln_f->forward(last)).val();
}

bool packs(WeightType type, const Shape& w) { return type != WeightType::f32 && (type != WeightType::q8_0 || w[1] % kQ8Block == 0); }

void GPT::pack_weights(WeightType type) {
  for (size_t l = 0; l < blocks.size(); l++)
    for (const auto& [name, lin] : blocks[l]->linears())
      if (packs(type, lin->weight.shape())) lin->pack(type, "blocks." + std::to_string(l) + "." + name);
  if (!cfg_.tie_embeddings && packs(type, lm_head.shape())) {
    lm_head_packed = std::make_shared<const PackedMatrix>(PackedMatrix::pack(lm_head.val(), type, "lm_head"));
    lm_head.val() = Tensor();
  }
}

void GPT::round_kv_as(KvType t) {
  check_kv_type(t, cfg_.head_dim());
  for (auto& b : blocks) b->attn->kv_round = t;
}

int64_t GPT::weight_bytes() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters())
    if (p.val().defined()) n += p.numel() * static_cast<int64_t>(sizeof(float));
  for (const auto& b : blocks)
    for (const auto& [name, lin] : b->linears())
      if (lin->packed) n += lin->packed->bytes();
  if (lm_head_packed) n += lm_head_packed->bytes();
  return n;
}

double packed_weight_bytes(const GPTConfig& c, WeightType type) {
  double n = 0;
  for (const auto& [name, shape] : parameter_shapes(c)) {
    const double count = static_cast<double>(shape_numel(shape));
    // a block's matrices are its linear weights; outside the blocks only an untied head is packed
    const bool linear = shape.size() == 2 && (name.rfind("blocks.", 0) == 0 || name == "lm_head.weight");
    if (!linear || !packs(type, shape))
      n += 4 * count;
    else
      n += static_cast<double>(packed_bytes(type, shape[0], shape[1]));
  }
  return n;
}

std::vector<std::pair<std::string, Shape>> parameter_shapes(const GPTConfig& c) {
  c.validate();
  std::vector<std::pair<std::string, Shape>> out;
  const int64_t d = c.n_embd, hd = c.head_dim(), hid = c.mlp_hidden;
  auto norm = [&](const std::string& n) {
    out.push_back({n + ".weight", {d}});
    if (c.bias && c.norm == NormKind::LayerNorm) out.push_back({n + ".bias", {d}});
  };
  auto linear = [&](const std::string& n, int64_t in, int64_t o, bool bias) {
    out.push_back({n + ".weight", {o, in}});
    if (bias) out.push_back({n + ".bias", {o}});
  };
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  out.push_back({"wte.weight", {c.vocab_size, d}});
  if (c.pos == PosKind::Learned) out.push_back({"wpe.weight", {c.block_size, d}});
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    norm(b + "ln1");
    const bool qkv_bias = c.bias || c.qkv_bias;
    linear(b + "attn.wq", d, c.n_head * hd, qkv_bias);
    linear(b + "attn.wk", d, c.kv_heads(i) * hd, qkv_bias);
    linear(b + "attn.wv", d, c.kv_heads(i) * hd, qkv_bias);
    linear(b + "attn.wo", c.n_head * hd, d, c.bias);
    if (c.qk_norm != QkNorm::none) {
      const bool head = c.qk_norm == QkNorm::head;
      out.push_back({b + "attn.q_norm.weight", {head ? hd : c.n_head * hd}});
      out.push_back({b + "attn.k_norm.weight", {head ? hd : c.kv_heads(i) * hd}});
    }
    norm(b + "ln2");
    if (c.gated()) {
      linear(b + "mlp.gate", d, hid, c.bias);
      linear(b + "mlp.up", d, hid, c.bias);
      linear(b + "mlp.down", hid, d, c.bias);
    } else {
      linear(b + "mlp.fc", d, hid, c.bias);
      linear(b + "mlp.proj", hid, d, c.bias);
    }
  }
  norm("ln_f");
  return out;
}

}  // namespace tapelm

namespace tapelm {

NarrowedBlocks::NarrowedBlocks(size_t layers) : layers_(layers), whole_(layers, 1) {}

NarrowedBlocks::NarrowedBlocks(const GPT& model, const HeldAs& held_as) : NarrowedBlocks(model.blocks.size()) {
  for (size_t l = 0; l < model.blocks.size(); l++) narrow(model, l, held_as);
}

void NarrowedBlocks::narrow(const GPT& model, size_t l, const HeldAs& held_as) {
  if (model.blocks.size() != layers_.size()) throw Error(ErrorKind::internal, "narrowing a model of another number of blocks");
  const auto named = model.blocks.at(l)->named_parameters();
  const size_t held_before = layers_[l].size();
  release(l);  // a gathered block's widened copies go first: what is held here has no float32 values
  for (size_t i = 0; i < named.size(); i++) {
    const auto& [name, p] = named[i];
    if (holds(p)) continue;
    const std::string full = "blocks." + std::to_string(l) + "." + name;
    const WeightType type = held_as(full, p.val());
    if (type == WeightType::f32) continue;
    if (!p.val().defined()) throw Error(ErrorKind::internal, "narrowing " + full + ": it holds no values");
    if (type != WeightType::bf16 && type != WeightType::f16)
      throw Error(ErrorKind::internal, full + " held in " + to_string(type) + ": only bf16 and f16 are");
    Held h{p, i, full, p.shape(), type, std::vector<uint16_t>(static_cast<size_t>(p.numel()))};
    store(h);
    values_ += shape_numel(h.shape);
    layers_[l].push_back(std::move(h));
    whole_[l] = 0;  // at once: a refusal of a later tensor leaves the block consistent
  }
  if (layers_[l].size() > held_before) release_cached_storage();
}

void NarrowedBlocks::store(Held& h) {
  int64_t overflow = -1;
  inexact_ += narrow_values(h.type, h.bits.data(), h.p.val().data(), shape_numel(h.shape), &overflow);
  if (overflow >= 0)
    throw Error(ErrorKind::data, h.name + ": value " + std::to_string(h.p.val().data()[overflow]) + " at index " + std::to_string(overflow) +
                                     " is beyond what " + to_string(h.type) + " holds (" +
                                     (h.type == WeightType::f16 ? "65504" : "3.39e38") + "): keep it in f32");
  h.p.release_value();  // one tensor in both forms at a time: the start holds 4 bytes a weight, not 6
}

void NarrowedBlocks::renarrow(size_t l) {
  for (Held& h : layers_.at(l))
    if (h.p.val().defined()) store(h);
  whole_[l] = 0;
  release_cached_storage();
}

void NarrowedBlocks::rebind(const GPT& other) {
  if (other.blocks.size() != layers_.size()) throw Error(ErrorKind::internal, "narrowed weights rebound to a model of another number of blocks");
  for (size_t l = 0; l < layers_.size(); l++) {
    const auto named = other.blocks[l]->named_parameters();
    for (Held& h : layers_[l]) {
      const Var& to = named.at(h.index).second;  // of h.shape: the caller's config is this model's
      if (whole_[l]) to.val() = h.p.val();
      h.p.release_value();
      h.p = to;
    }
  }
}

void NarrowedBlocks::gather(size_t l) {
  if (whole_.at(l)) return;
  for (Held& h : layers_[l]) {
    h.p.val() = Tensor::empty(h.shape);
    widen_values(h.type, h.p.val().data(), h.bits.data(), shape_numel(h.shape));
  }
  whole_[l] = 1;
}

void NarrowedBlocks::release(size_t l) {
  if (!whole_.at(l)) return;
  for (Held& h : layers_[l]) h.p.release_value();
  whole_[l] = 0;
}

void NarrowedBlocks::release_all() {
  for (size_t l = 0; l < layers_.size(); l++) release(l);
  release_cached_storage();
}

const NarrowedBlocks::Held* NarrowedBlocks::find(const Var& p) const {
  for (const auto& layer : layers_)
    for (const Held& h : layer)
      if (h.p.same(p)) return &h;
  return nullptr;
}

bool NarrowedBlocks::holds(const Var& p) const { return find(p) != nullptr; }

Tensor NarrowedBlocks::value(const Var& p) const {
  const Held* h = find(p);
  if (!h) return p.val();
  Tensor t = Tensor::empty(h->shape);
  widen_values(h->type, t.data(), h->bits.data(), shape_numel(h->shape));
  return t;
}

int64_t NarrowedBlocks::largest_block() const {
  int64_t most = 0;
  for (const auto& layer : layers_) {
    int64_t n = 0;
    for (const Held& h : layer) n += shape_numel(h.shape);
    most = std::max(most, n);
  }
  return most;
}

std::string NarrowedBlocks::types() const {
  bool bf16 = false, f16 = false;
  for (const auto& layer : layers_)
    for (const Held& h : layer) (h.type == WeightType::bf16 ? bf16 : f16) = true;
  return bf16 && f16 ? "bf16 and f16" : f16 ? "f16" : "bf16";
}

int64_t block_index(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  const size_t dot = name.find('.', 7);
  const std::string n = name.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
  if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(n);
}

WeightType exact_16bit_type(const Tensor& t) {
  if (holds_exactly(WeightType::bf16, t.data(), t.numel())) return WeightType::bf16;
  if (holds_exactly(WeightType::f16, t.data(), t.numel())) return WeightType::f16;
  return WeightType::f32;
}

}  // namespace tapelm
