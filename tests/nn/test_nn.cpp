// The model: whole-model gradients, cached decoding against the full forward, configs, names,
// init, accounting and sampling. (The attention and RoPE ops are tested in test_attention.cpp.)
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <map>

#include "autograd/autocast.h"
#include "autograd/float16.h"
#include "nn/accounting.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "test_util.h"
#include "train/train_config.h"

using namespace tapelm;
using tapelm::test::check_grad;
namespace tt = boost::test_tools;
namespace bdata = boost::unit_test::data;

namespace {

GPTConfig tiny(int64_t KV, PosKind pos = PosKind::Learned) {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = KV;
  c.n_embd = 16;
  c.mlp_hidden = 24;
  c.pos = pos;
  return c;
}

Index random_ids(int64_t B, int64_t T, int32_t V, uint64_t seed) {
  Rng r(seed);
  Index ids;
  ids.shape = {B, T};
  for (int64_t i = 0; i < B * T; i++) ids.data.push_back(static_cast<int32_t>(r.below(V)));
  return ids;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(nn)

BOOST_AUTO_TEST_CASE(whole_model_gradients) {
  const GPTConfig c{.vocab_size = 7, .block_size = 4, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 8,
                    .mlp_hidden = 8};
  for (const char* variant : {"plain", "llama", "bias", "neox", "opt", "qwen3", "olmo2", "gemma"}) {
    GPTConfig v = c;
    if (std::string(variant) == "gemma") {  // (1 + w) norms, GeGLU, embeddings times √d, heads of width 4
      v.norm = NormKind::RMSNorm1p;
      v.pos = PosKind::Rope;
      v.mlp = MlpKind::GeGLU;
      v.embed_scale = std::sqrt(8.0);
      v.head_size = 4;
    } else if (std::string(variant) == "qwen3" || std::string(variant) == "olmo2") {
      // q and k RMS-normalised per head (Qwen3) or over the projection (OLMo-2), heads of width 4
      // where d / H is 2
      v.norm = NormKind::RMSNorm;
      v.pos = PosKind::Rope;
      v.mlp = MlpKind::SwiGLU;
      v.head_size = 4;
      v.qk_norm = std::string(variant) == "qwen3" ? QkNorm::head : QkNorm::all;
      if (std::string(variant) == "olmo2") v.norm_position = NormPosition::post, v.head_size = 0;  // norms on the outputs
    } else if (std::string(variant) == "opt") {  // OPT's ReLU MLP with biases
      v.mlp = MlpKind::Relu;
      v.bias = true;
    } else if (std::string(variant) == "neox") {  // GPT-NeoX's: RoPE on half of each head, attention and MLP side by side
      v.pos = PosKind::Rope;
      v.rotary_dims = 2;
      v.parallel_residual = true;
      v.bias = true;
      v.tie_embeddings = false;
    } else if (std::string(variant) == "llama") {
      v.norm = NormKind::RMSNorm;
      v.pos = PosKind::Rope;
      v.mlp = MlpKind::SwiGLU;
      v.tie_embeddings = false;
    } else if (std::string(variant) == "bias") {
      v.bias = true;
    }
    GPT model(v, 3);
    Index ids = random_ids(2, 4, 7, 1), tg = random_ids(2, 4, 7, 2);
    tg.data[3] = -1;
    std::vector<Var> params;
    uint64_t sd = 40;
    for (auto& [n, p] : model.named_parameters()) {
      p.val() = randn(p.shape(), sd++, 0.5f);  // away from init so every parameter matters
      params.push_back(p);
    }
    GradCheckResult r = gradcheck_vars([&] { return model.loss(ids, tg); }, params, {.eps = 1e-2, .atol = 3e-3});
    BOOST_TEST(r.ok, variant << ": worst ratio " << r.worst_ratio << " at " << r.detail);
  }
}

// Recomputing each block in backward (activation checkpointing) gives the stored run's loss and
// gradients bit for bit — with dropout (its masks drawn again where they were drawn), per-layer KV
// heads, q/k/v biases, in float32 and under bf16 — leaves the dropout stream where the stored run
// leaves it, and keeps one op per block on the tape instead of every op of every block.
BOOST_AUTO_TEST_CASE(recomputed_blocks_give_the_stored_gradients_bit_for_bit) {
  GPTConfig c{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 4, .n_kv_head = 4, .n_embd = 16, .mlp_hidden = 24,
              .dropout = 0.2};
  c.norm = NormKind::RMSNorm, c.pos = PosKind::Rope, c.mlp = MlpKind::SwiGLU, c.qkv_bias = true, c.tie_embeddings = false;
  c.set_kv_heads({4, 2, 1});
  const Index ids = random_ids(3, 8, 11, 5), tg = random_ids(3, 8, 11, 6);
  std::vector<Precision> precisions{Precision::f32, Precision::bf16_emulated};
  if (precision_unavailable(Precision::bf16).empty()) precisions.push_back(Precision::bf16);  // the CPU's bf16 products
  for (Precision p : precisions) {
    std::map<bool, std::vector<Tensor>> grads;
    std::map<bool, float> losses;
    std::map<bool, uint64_t> stream;
    std::map<bool, size_t> ops;
    for (bool recompute : {false, true}) {
      GPT model(c, 9);
      model.train();
      model.recompute_blocks = recompute;
      const Autocast ac(p);
      for (int step = 0; step < 2; step++) {  // the second step reads the first's dropout stream
        for (auto& [n, q] : model.named_parameters()) q.zero_grad();
        const Var loss = model.loss(ids, tg);
        ops[recompute] = tape_size();
        losses[recompute] = loss.item();
        backward(loss);
      }
      stream[recompute] = model.dropout_rng().state();
      for (auto& [n, q] : model.named_parameters()) grads[recompute].push_back(q.grad().clone());
    }
    const std::string what = to_string(p);
    BOOST_TEST(losses[true] == losses[false], what);
    BOOST_TEST(stream[true] == stream[false], what);
    BOOST_TEST_REQUIRE(grads[true].size() == grads[false].size());
    for (size_t i = 0; i < grads[true].size(); i++) BOOST_TEST(same_bits(grads[true][i], grads[false][i]), what << ": parameter " << i);
    BOOST_TEST(ops[true] + 3 * 10 < ops[false], what << ": " << ops[true] << " ops on the tape against " << ops[false]);
  }
}

// A block's parameters held only while it runs (ZeRO stage 3's residency, here a copy put back
// instead of another rank's): with and without recomputed blocks, forward and backward have one
// block whole at a time, each block gathered twice a step (its forward, its backward) and released
// as often, every block released when backward is done, and the loss and every gradient are the
// whole model's bit for bit. A release that came too early (before the block's backward read its
// weights) would read a freed value, and one that never came would leave a block whole.
namespace {
class CopyResidency : public BlockResidency {
 public:
  explicit CopyResidency(const GPT& m) {
    for (const auto& b : m.blocks) {
      std::vector<std::pair<Var, Tensor>> layer;
      for (const auto& [name, p] : b->named_parameters()) layer.emplace_back(p, p.val().clone());
      layers.push_back(layer);
    }
    whole.assign(layers.size(), 1);
  }
  void gather(size_t l) override {
    if (whole.at(l)) return;
    for (auto& [p, kept] : layers[l]) p.val() = kept.clone();
    whole[l] = 1;
    gathers++;
    most_whole = std::max(most_whole, static_cast<int>(std::count(whole.begin(), whole.end(), 1)));
  }
  void release(size_t l) override {
    if (!whole.at(l)) return;
    for (auto& [p, kept] : layers[l]) p.release_value();
    whole[l] = 0;
    releases++;
  }
  bool collective() const override { return false; }
  std::vector<std::vector<std::pair<Var, Tensor>>> layers;
  std::vector<char> whole;
  int gathers = 0, releases = 0, most_whole = 0;
};
}  // namespace

// A model built drawing only some parameters (a rank's share under ZeRO stage 3) gives each of
// them the whole model's init bit for bit, whichever others are left: skipping a parameter moves
// the stream as its draws would (Rng::skip_normals is n normal() draws, checked directly too).
BOOST_AUTO_TEST_CASE(a_partly_drawn_model_draws_what_the_whole_one_does) {
  Rng a(42), b(42);
  for (int i = 0; i < 1001; i++) a.normal();
  b.skip_normals(1001);
  BOOST_TEST(a.state() == b.state());
  BOOST_TEST(a.normal() == b.normal());
  GPTConfig c{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .mlp_hidden = 24};
  c.qkv_bias = true;
  const GPT whole(c, 5);
  for (int parity : {0, 1}) {
    int i = 0;  // every other parameter, then the others
    const GPT part(c, 5, [&, n = std::make_shared<std::map<std::string, int>>()](const std::string& name) {
      if (!n->count(name)) (*n)[name] = static_cast<int>(n->size());
      return (*n)[name] % 2 == parity;
    });
    const auto w = whole.named_parameters(), p = part.named_parameters();
    BOOST_TEST_REQUIRE(w.size() == p.size());
    for (size_t k = 0; k < w.size(); k++)
      if (static_cast<int>(k % 2) == parity) {
        BOOST_TEST(same_bits(w[k].second.val(), p[k].second.val()), w[k].first);
        i++;
      }
    BOOST_TEST(i >= 10);
  }
}

BOOST_AUTO_TEST_CASE(blocks_held_only_while_they_run_give_the_whole_models_gradients) {
  GPTConfig c{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .mlp_hidden = 24,
              .dropout = 0.2};
  c.norm = NormKind::RMSNorm, c.pos = PosKind::Rope, c.mlp = MlpKind::SwiGLU, c.tie_embeddings = false;
  const Index ids = random_ids(3, 8, 11, 5), tg = random_ids(3, 8, 11, 6);
  for (bool recompute : {false, true}) {
    std::vector<std::vector<Tensor>> grads(2);
    std::vector<float> losses(2);
    for (int held : {0, 1}) {
      GPT model(c, 9);
      model.train();
      model.recompute_blocks = recompute;
      std::shared_ptr<CopyResidency> r;
      if (held) {
        r = std::make_shared<CopyResidency>(model);
        for (size_t l = 0; l < model.blocks.size(); l++) r->release(l);
        model.residency = r;
      }
      const Var loss = model.loss(ids, tg);
      losses[held] = loss.item();
      backward(loss);
      if (r) {
        const std::string what = recompute ? "recomputed" : "stored";
        BOOST_TEST(r->most_whole == 1, what);
        BOOST_TEST(r->gathers == 2 * 3, what);
        BOOST_TEST(r->releases == 3 + 2 * 3, what);  // the start's, then after each forward and backward
        BOOST_TEST(std::count(r->whole.begin(), r->whole.end(), 1) == 0, what);
        for (const auto& layer : r->layers)
          for (const auto& [p, kept] : layer) BOOST_TEST(!p.val().defined(), what);
        model.residency.reset();
        for (size_t l = 0; l < model.blocks.size(); l++) r->gather(l);
      }
      for (auto& [n, q] : model.named_parameters()) grads[held].push_back(q.grad().clone());
    }
    BOOST_TEST(losses[0] == losses[1]);
    BOOST_TEST_REQUIRE(grads[0].size() == grads[1].size());
    for (size_t i = 0; i < grads[0].size(); i++) BOOST_TEST(same_bits(grads[0][i], grads[1][i]), "parameter " << i << " recompute " << recompute);
  }
}

// Frozen block weights held in 16 bits (NarrowedBlocks): for a model whose frozen weights are
// bf16 (or f16) values, as a 16-bit source's are, the 16-bit copy widens back to them exactly, so
// with and without recomputed blocks the loss and every trained gradient are the float32 model's
// bit for bit, and between uses the narrowed parameters hold no float32 values. For values the
// type does not hold, narrowing to bf16 rounds to nearest: |change| at most half a unit in the last
// place, which for 8 significant bits is 2^-8 of the power of two below |w|, so at most 2^-8·|w|.
BOOST_AUTO_TEST_CASE(frozen_weights_held_in_16_bits_give_the_float32_models_gradients) {
  GPTConfig c{.vocab_size = 11, .block_size = 8, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .mlp_hidden = 24,
              .dropout = 0.2};
  c.norm = NormKind::RMSNorm, c.pos = PosKind::Rope, c.mlp = MlpKind::SwiGLU, c.tie_embeddings = false;
  const Index ids = random_ids(3, 8, 11, 5), tg = random_ids(3, 8, 11, 6);
  const auto frozen = [](const std::string& name) { return name.rfind("blocks.", 0) == 0 && name.find(".attn.") == std::string::npos; };
  for (WeightType type : {WeightType::bf16, WeightType::f16})
    for (bool recompute : {false, true}) {
      const std::string what = to_string(type) + (recompute ? " recomputed" : " stored");
      std::vector<std::vector<Tensor>> grads(2);
      std::vector<float> losses(2);
      for (int narrowed : {0, 1}) {
        GPT model(c, 9);
        for (auto& [name, p] : model.named_parameters())  // every weight a 16-bit value, as a 16-bit source's
          for (int64_t i = 0; i < p.numel(); i++)
            p.val().data()[i] = type == WeightType::bf16 ? bf16_to_f32(f32_to_bf16(p.val().data()[i])) : f16_to_f32(f32_to_f16(p.val().data()[i]));
        for (auto& [name, p] : model.named_parameters())  // the norms' weights are 1, a bf16 value
          if (frozen(name)) BOOST_TEST((exact_16bit_type(p.val()) == (p.ndim() == 1 ? WeightType::bf16 : type)), what << " " << name);
        model.train();
        model.recompute_blocks = recompute;
        for (auto& [name, p] : model.named_parameters()) p.set_requires_grad(!frozen(name));
        std::shared_ptr<NarrowedBlocks> r;
        if (narrowed) {
          // what frozen_weights `auto` holds them in: each the type that holds its values exactly
          r = std::make_shared<NarrowedBlocks>(model, [&frozen](const std::string& name, const Tensor& v) {
            return frozen(name) ? exact_16bit_type(v) : WeightType::f32;
          });
          BOOST_TEST(r->inexact() == 0, what);
          BOOST_TEST(r->types() == (type == WeightType::bf16 ? "bf16" : "bf16 and f16"), what);
          BOOST_TEST(r->largest_block() == 2 * 16 + 3 * 16 * 24, what);
          BOOST_TEST(r->values() == 3 * (2 * 16 + 3 * 16 * 24), what);  // per block: 2 norms of d, 3 MLP matrices d × hidden
          model.residency = r;
        }
        const Var loss = model.loss(ids, tg);
        losses[narrowed] = loss.item();
        backward(loss);
        for (auto& [name, p] : model.named_parameters()) {
          if (r) BOOST_TEST(p.val().defined() == !frozen(name), what << " " << name);
          if (!frozen(name)) grads[narrowed].push_back(p.grad().clone());
        }
      }
      BOOST_TEST(losses[0] == losses[1], what);
      BOOST_TEST_REQUIRE(grads[0].size() == grads[1].size());
      BOOST_TEST(grads[0].size() == 3 + 3 * 4);  // wte, ln_f, lm_head, and each block's 4 projections
      for (size_t i = 0; i < grads[0].size(); i++) BOOST_TEST(same_bits(grads[0][i], grads[1][i]), what << " trained parameter " << i);
    }
  // values a 16-bit type does not hold: rounded to nearest, within half a unit in the last place
  GPT model(c, 9);
  std::vector<Tensor> before;
  for (const auto& [name, p] : model.named_parameters()) before.push_back(p.val().clone());
  BOOST_TEST((exact_16bit_type(model.blocks[0]->named_parameters().back().second.val()) == WeightType::f32));
  const NarrowedBlocks r(model, [&frozen](const std::string& name, const Tensor&) { return frozen(name) ? WeightType::bf16 : WeightType::f32; });
  BOOST_TEST(r.inexact() > r.values() / 2);  // normal(0, 0.02) draws are almost never bf16 values
  size_t k = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor w = r.value(p), was = before[k++];
    BOOST_TEST(r.holds(p) == frozen(name));
    for (int64_t i = 0; i < w.numel(); i++)
      BOOST_TEST_REQUIRE(std::fabs(w.data()[i] - was.data()[i]) <= std::ldexp(std::fabs(was.data()[i]), -8), name << " " << i);
  }
  // a value past what the type holds (f16's largest is 65504) is refused, naming the weight, not
  // turned into infinity
  GPT big(c, 9);
  for (auto& [name, p] : big.named_parameters())
    if (name == "blocks.1.mlp.down.weight") p.val().data()[5] = 1e6f;
  test::expect_throw([&] { NarrowedBlocks(big, [&frozen](const std::string& name, const Tensor&) { return frozen(name) ? WeightType::f16 : WeightType::f32; }); },
                     ErrorKind::data, {"blocks.1.mlp.down.weight: value 1000000", "at index 5", "beyond what f16 holds"});
}

// KV ∈ {4 (MHA), 2 (GQA), 1 (MQA)} × {learned positions, RoPE, GPT-NeoX's partial RoPE with the
// parallel residual, Qwen3's q/k norms with heads of width 6 where d / H is 4, OLMo-2's norms on
// the sublayers' outputs with q/k norms over the projections, Gemma's (1 + w) norms, GeGLU and
// scaled embeddings}.
BOOST_DATA_TEST_CASE(cached_decoding_equals_full_forward, bdata::make({4, 2, 1}) * bdata::make({0, 1, 2, 3, 4, 5}), KV, variant) {
  const PosKind pos = variant ? PosKind::Rope : PosKind::Learned;
  GPTConfig tc = tiny(KV, pos);
  if (variant == 2) tc.rotary_dims = 2, tc.parallel_residual = true;
  if (variant == 3) tc.head_size = 6, tc.qk_norm = QkNorm::head;  // Qwen3's: heads of their own width, q/k norms
  if (variant == 4) tc.norm_position = NormPosition::post, tc.qk_norm = QkNorm::all;  // OLMo-2's
  if (variant == 5) tc.norm = NormKind::RMSNorm1p, tc.mlp = MlpKind::GeGLU, tc.embed_scale = 4, tc.head_size = 8;  // Gemma's
  GPT model(tc, 7);
  model.eval();
  const int64_t B = 3, T = 12;
  Index ids = random_ids(B, T, 11, KV);
  Tensor full;
  {
    NoGrad ng;
    full = model.forward(ids).val();  // [B, T, V]
  }
  KVCache cache = model.make_cache(B, T);
  BOOST_TEST(cache.bytes() == 2 * 2 * B * T * KV * tc.head_dim() * 4);  // layers · (k, v) · B · T · KV · hd · 4
  double worst = 0;
  const int64_t prefill = 4;
  for (int64_t p = prefill - 1; p < T; p++) {
    Index step;
    const int64_t from = p == prefill - 1 ? 0 : p, n = p == prefill - 1 ? prefill : 1;
    step.shape = {B, n};
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = from; t < from + n; t++) step.data.push_back(ids.data[b * T + t]);
    Tensor logits = model.decode_step(step, cache);
    for (int64_t b = 0; b < B; b++)
      for (int64_t v = 0; v < 11; v++)
        worst = std::max(worst, double(std::fabs(logits[b * 11 + v] - full[(b * T + p) * 11 + v])));
  }
  BOOST_TEST(worst < 1e-5, "KV=" << KV << " pos=" << to_string(pos) << ": max |cached - full| " << worst);
  BOOST_TEST(cache.len == T);
}

// A forward that rounds K and V as a cache of each type stores them gives what decoding with that
// cache gives (how the study evaluates a 16-bit or 8-bit cache); the rounding moves the logits.
BOOST_AUTO_TEST_CASE(a_forward_with_rounded_kv_equals_decoding_with_that_cache) {
  GPTConfig c = tiny(1, PosKind::Rope);
  c.n_embd = 64;
  c.n_head = 2;  // head dim 32: a q8_0 block per row
  c.mlp_hidden = 128;
  GPT model(c, 7);
  model.eval();
  NoGrad ng;
  const int64_t B = 2, T = 12, V = c.vocab_size;
  const Index ids = random_ids(B, T, V, 3);
  const Tensor plain = model.forward(ids).val();
  for (KvType t : {KvType::f16, KvType::bf16, KvType::q8}) {
    model.round_kv_as(t);
    const Tensor full = model.forward(ids).val();
    KVCache cache = model.make_cache(B, T, t);
    double worst = 0, moved = 0;
    for (int64_t p = 0; p < T; p++) {
      Index step({}, {B, 1});
      for (int64_t b = 0; b < B; b++) step.data.push_back(ids.data[b * T + p]);
      const Tensor logits = model.decode_step(step, cache);
      for (int64_t b = 0; b < B; b++)
        for (int64_t v = 0; v < V; v++) {
          worst = std::max(worst, double(std::fabs(logits[b * V + v] - full[(b * T + p) * V + v])));
          moved = std::max(moved, double(std::fabs(plain[(b * T + p) * V + v] - full[(b * T + p) * V + v])));
        }
    }
    BOOST_TEST(worst < 1e-5, to_string(t) << ": max |cached - rounded forward| " << worst);
    BOOST_TEST(moved > 0.0, to_string(t) << ": the rounding changes nothing");
  }
  model.round_kv_as(KvType::f32);
  BOOST_TEST(model.forward(ids).val().to_vector() == plain.to_vector(), tt::per_element());
}

BOOST_AUTO_TEST_CASE(gqa_equals_mha_with_repeated_heads) {
  // A GQA model equals the MHA model whose K/V heads are its heads repeated per group.
  GPTConfig g = tiny(2), m = tiny(4);
  GPT gqa(g, 5), mha(m, 6);
  auto gp = gqa.named_parameters(), mp = mha.named_parameters();
  const int64_t hd = g.head_dim();
  for (size_t i = 0; i < gp.size(); i++) {
    const std::string& n = gp[i].first;
    Tensor& dst = mp[i].second.val();
    const Tensor& src = gp[i].second.val();
    if (n.find("attn.wk") != std::string::npos || n.find("attn.wv") != std::string::npos) {
      const int64_t cols = src.numel() / src.dim(0);
      for (int64_t h = 0; h < 4; h++)
        std::copy(src.data() + (h / 2) * hd * cols, src.data() + (h / 2 + 1) * hd * cols, dst.data() + h * hd * cols);
    } else {
      dst = src.clone();
    }
  }
  Index ids = random_ids(2, 12, 11, 3);
  NoGrad ng;
  Tensor a = gqa.forward(ids).val(), b = mha.forward(ids).val();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  BOOST_TEST(worst < 1e-5);
}

// Layers with different numbers of KV heads: the config's n_kv_head as a list, one per layer.
BOOST_AUTO_TEST_CASE(kv_heads_per_layer) {
  const std::string base = R"("n_layer": 3, "n_head": 4, "n_embd": 16, "vocab_size": 11, "block_size": 12, "mlp_hidden": 24)";
  const GPTConfig c = GPTConfig::from_json_string("{" + base + R"(, "n_kv_head": [4, 1, 2]})");
  BOOST_TEST(c.per_layer_kv());
  BOOST_TEST(c.n_kv_head == 4);  // the largest
  BOOST_TEST(c.kv_heads(1) == 1);
  BOOST_TEST(c.total_kv_heads() == 7);
  BOOST_TEST(c.kv_heads_str() == "4,1,2");
  BOOST_TEST(c.to_json()["n_kv_head"] == nlohmann::json({4, 1, 2}));
  BOOST_TEST((GPTConfig::from_json(c.to_json()) == c));
  BOOST_TEST(c.layer(2).n_kv_head == 2);
  BOOST_TEST(!c.layer(2).per_layer_kv());
  // one count in every layer is that count
  const GPTConfig u = GPTConfig::from_json_string("{" + base + R"(, "n_kv_head": [2, 2, 2]})");
  BOOST_TEST(!u.per_layer_kv());
  BOOST_TEST(u.to_json()["n_kv_head"] == 2);
  for (auto [list, part] : std::vector<std::pair<std::string, std::string>>{
           {"[4, 1]", "n_kv_head lists 2 layers' key/value heads for n_layer 3"},
           {"[4, 3, 2]", "n_head 4 is not divisible by n_kv_head[1] 3"},
           {"[4, 0, 2]", "n_kv_head[1] must be positive"},
           {R"([4, "1", 2])", "'n_kv_head[1]' must be an integer"},
           {"[]", "n_kv_head: an empty list"}})
    test::expect_throw([&] { GPTConfig::from_json_string("{" + base + R"(, "n_kv_head": )" + list + "}"); }, ErrorKind::config, {part});

  GPT m(c, 3);
  const int64_t hd = c.head_dim();  // 4
  for (int64_t l = 0; l < 3; l++) BOOST_TEST(m.blocks[l]->attn->wk->weight.val().dim(0) == c.kv_heads(l) * hd);
  BOOST_TEST(m.num_parameters() == model_cost(c).params);
  // the MHA model's parameters less the K and V rows layers 1 and 2 lack: (3 + 2) heads · 2 · hd · d
  GPTConfig mha_c = c.layer(0);
  BOOST_TEST(model_cost(c).params == model_cost(mha_c).params - 5 * 2 * hd * 16);
  BOOST_TEST(model_cost(c).kv_cache_bytes_per_token == 2 * 7 * hd * 4);  // K and V, 7 heads of hd floats
  // each layer is the GQA layer it says it is: the MHA model with every layer's K/V heads repeated
  // over its groups computes the same logits
  GPT mha(mha_c, 4);
  auto gp = m.named_parameters(), mp = mha.named_parameters();
  for (size_t i = 0; i < gp.size(); i++) {
    const std::string& n = gp[i].first;
    const Tensor& src = gp[i].second.val();
    Tensor& dst = mp[i].second.val();
    if (n.find("attn.wk") == std::string::npos && n.find("attn.wv") == std::string::npos) {
      dst = src.clone();
      continue;
    }
    const int64_t rep = 4 / (src.dim(0) / hd), cols = src.numel() / src.dim(0);
    for (int64_t h = 0; h < 4; h++)
      std::copy(src.data() + (h / rep) * hd * cols, src.data() + (h / rep + 1) * hd * cols, dst.data() + h * hd * cols);
  }
  m.eval();
  mha.eval();
  NoGrad ng;
  const int64_t B = 2, T = 12, V = c.vocab_size;
  const Index ids = random_ids(B, T, V, 5);
  const Tensor a = m.forward(ids).val(), b = mha.forward(ids).val();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  BOOST_TEST(worst < 1e-5, "per-layer model against MHA with repeated heads: " << worst);
  // decoding: each layer's cache holds its own heads, and step by step gives the forward's logits
  KVCache cache = m.make_cache(B, T);
  BOOST_TEST(cache.bytes() == B * T * 2 * 7 * hd * 4);
  worst = 0;
  for (int64_t p = 0; p < T; p++) {
    Index step({}, {B, 1});
    for (int64_t r = 0; r < B; r++) step.data.push_back(ids.data[r * T + p]);
    const Tensor logits = m.decode_step(step, cache);
    for (int64_t r = 0; r < B; r++)
      for (int64_t v = 0; v < V; v++) worst = std::max(worst, double(std::fabs(logits[r * V + v] - a[(r * T + p) * V + v])));
  }
  BOOST_TEST(worst < 1e-5, "decoded against the forward: " << worst);
}

BOOST_AUTO_TEST_CASE(parameter_names_shapes_and_counts) {
  GPTConfig c = tiny(2);
  c.bias = true;
  GPT m(c, 1);
  auto np = m.named_parameters();
  std::map<std::string, Shape> got;
  for (auto& [n, p] : np) got[n] = p.shape();
  BOOST_TEST(got.at("wte.weight") == Shape({11, 16}));
  BOOST_TEST(got.at("wpe.weight") == Shape({12, 16}));
  BOOST_TEST(got.at("blocks.0.ln1.weight") == Shape({16}));
  BOOST_TEST(got.at("blocks.0.ln1.bias") == Shape({16}));
  BOOST_TEST(got.at("blocks.1.attn.wq.weight") == Shape({16, 16}));
  BOOST_TEST(got.at("blocks.1.attn.wk.weight") == Shape({8, 16}));
  BOOST_TEST(got.at("blocks.1.attn.wv.bias") == Shape({8}));
  BOOST_TEST(got.at("blocks.0.attn.wo.weight") == Shape({16, 16}));
  BOOST_TEST(got.at("blocks.0.mlp.fc.weight") == Shape({24, 16}));
  BOOST_TEST(got.at("blocks.0.mlp.proj.weight") == Shape({16, 24}));
  BOOST_TEST(got.at("ln_f.bias") == Shape({16}));
  BOOST_TEST(got.count("lm_head.weight") == 0u);  // tied: one parameter
  BOOST_TEST(np.size() == 2u + 2 * 16 + 2);
  BOOST_TEST(m.num_parameters() == model_cost(c).params);

  GPTConfig l = tiny(1, PosKind::Rope);
  l.norm = NormKind::RMSNorm;
  l.mlp = MlpKind::SwiGLU;
  l.tie_embeddings = false;
  l.bias = true;  // rmsnorm has no bias; linears do
  GPT lm(l, 1);
  std::map<std::string, Shape> g2;
  for (auto& [n, p] : lm.named_parameters()) g2[n] = p.shape();
  BOOST_TEST(g2.count("wpe.weight") == 0u);
  BOOST_TEST(g2.count("blocks.0.ln1.bias") == 0u);
  BOOST_TEST(g2.at("blocks.0.mlp.gate.weight") == Shape({24, 16}));
  BOOST_TEST(g2.at("blocks.0.mlp.down.weight") == Shape({16, 24}));
  BOOST_TEST(g2.at("lm_head.weight") == Shape({11, 16}));
  BOOST_TEST(lm.num_parameters() == model_cost(l).params);

  // heads of their own width (6, where d / H is 4) with q/k norms: per head (one hd weight each)
  // or over the projection (H·hd and KV·hd), counted as the model holds them
  for (QkNorm qk : {QkNorm::head, QkNorm::all}) {
    GPTConfig q = l;
    q.head_size = 6, q.qk_norm = qk;
    GPT qm(q, 1);
    std::map<std::string, Shape> g3;
    for (auto& [n, p] : qm.named_parameters()) g3[n] = p.shape();
    BOOST_TEST(g3.at("blocks.1.attn.wq.weight") == Shape({24, 16}));
    BOOST_TEST(g3.at("blocks.1.attn.wk.weight") == Shape({6, 16}));
    BOOST_TEST(g3.at("blocks.1.attn.wo.weight") == Shape({16, 24}));
    BOOST_TEST(g3.at("blocks.0.attn.q_norm.weight") == Shape({qk == QkNorm::head ? 6 : 24}));
    BOOST_TEST(g3.at("blocks.0.attn.k_norm.weight") == Shape({6}));  // one KV head: both forms 6
    BOOST_TEST(qm.num_parameters() == model_cost(q).params);
    const auto shapes = parameter_shapes(q);
    BOOST_TEST(shapes.size() == g3.size());
    for (const auto& [n, sh] : shapes) BOOST_TEST((g3.at(n) == sh), n);
  }
}

BOOST_AUTO_TEST_CASE(accounting_hand_computed) {
  // baby (L4 H4 d128 T64 V65, tied, no bias): wte 8320 + wpe 8192 + 4 · (2·128 + 4·16384 + 2·65536)
  // + ln_f 128 = 804,096 parameters (the PyTorch reference's num_params() gives the same).
  GPTConfig baby;
  ModelCost b = model_cost(baby);
  BOOST_TEST(b.params == 804096);
  // forward per token and layer: attention matmuls 2·4·16384 = 131072, MLP 2·2·65536 = 262144,
  // attention core 4·64·128 = 32768 -> 425984 · 4 = 1703936, + head 2·128·65 = 16640
  BOOST_TEST(b.forward_flops_per_token == 1720576.0);
  BOOST_TEST(b.train_flops_per_token == 3 * 1720576.0);
  BOOST_TEST(b.kv_cache_bytes_per_token == 2 * 4 * 128 * 4);
  // mid MQA (L6 H8 KV1 d256 T128): K and V are one head of 32 each.
  GPTConfig mid{.block_size = 128, .n_layer = 6, .n_head = 8, .n_kv_head = 1, .n_embd = 256, .mlp_hidden = 1024};
  ModelCost m = model_cost(mid);
  // per layer: 2·256 + 65536 + 2·8192 + 65536 + 2·262144 = 672,256; · 6 = 4,033,536
  // + wte 16640 + wpe 32768 + ln_f 256 (the reference's num_params() gives the same)
  BOOST_TEST(m.params == 4083200);
  // per layer: 2·(65536 + 16384 + 65536) + 4·262144 + 4·128·256 = 294912 + 1048576 + 131072
  BOOST_TEST(m.forward_flops_per_token == 6 * 1474560.0 + 2 * 256 * 65);
  BOOST_TEST(m.kv_cache_bytes_per_token == 2 * 6 * 32 * 4);
}

BOOST_AUTO_TEST_CASE(init_follows_spec_and_seed) {
  GPTConfig c = tiny(2);
  c.n_embd = 128;
  c.mlp_hidden = 512;
  c.n_layer = 4;
  GPT a(c, 42), b(c, 42), d(c, 43);
  auto stdev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t.numel(); i++) s += t[i], s2 += double(t[i]) * t[i];
    const double m = s / t.numel();
    return std::sqrt(s2 / t.numel() - m * m);
  };
  BOOST_TEST(stdev(a.blocks[0]->mlp->fc->weight.val()) == 0.02, tt::tolerance(0.05));
  BOOST_TEST(stdev(a.blocks[0]->mlp->proj->weight.val()) == 0.02 / std::sqrt(8.0), tt::tolerance(0.05));
  BOOST_TEST(stdev(a.blocks[1]->attn->wo->weight.val()) == 0.02 / std::sqrt(8.0), tt::tolerance(0.05));
  BOOST_TEST(a.ln_f->weight.val()[5] == 1.f);
  BOOST_TEST(a.wte->weight.val().to_vector() == b.wte->weight.val().to_vector(), tt::per_element());
  BOOST_TEST(a.wte->weight.val()[0] != d.wte->weight.val()[0]);
}

BOOST_AUTO_TEST_CASE(config_errors) {
  auto expect = [](const std::string& json, const std::string& part) {
    test::expect_throw([&] { GPTConfig::from_json_string(json); }, ErrorKind::config, {part});
  };
  expect(R"({"n_layers": 4})", "unknown model config key 'n_layers'");
  expect(R"({"n_embd": 100, "n_head": 3})", "n_embd 100 is not divisible by n_head 3");
  expect(R"({"n_head": 4, "n_kv_head": 3})", "n_head 4 is not divisible by n_kv_head 3");
  expect(R"({"n_embd": 12, "n_head": 4, "pos": "rope"})", "even head dim");
  expect(R"({"n_embd": 16, "n_head": 2, "pos": "rope", "rotary_dims": 3})", "rotary_dims 3 must be even and at most the head dim 8");
  expect(R"({"n_embd": 16, "n_head": 2, "pos": "rope", "rotary_dims": 10})", "rotary_dims 10 must be even");
  expect(R"({"n_embd": 16, "n_head": 2, "rotary_dims": 4})", "rotary_dims 4 with pos \"learned\": only RoPE rotates");
  expect(R"({"rotary_dims": -2})", "rotary_dims");
  expect(R"({"qk_norm": "layer"})", "config qk_norm must be \"none\" or \"head\" or \"all\"");
  expect(R"({"norm_position": "post", "parallel_residual": true})", "parallel_residual with norm_position \"post\"");
  expect(R"({"n_embd": 100, "n_head": 3, "head_size": -1})", "head_size");
  // a head width of its own lifts n_embd's divisibility: 3 heads of 32 over d 100
  const GPTConfig w = GPTConfig::from_json_string(R"({"n_embd": 100, "n_head": 3, "head_size": 32, "qk_norm": "head"})");
  BOOST_TEST(w.head_dim() == 32);
  BOOST_TEST((GPTConfig::from_json(w.to_json()) == w));
  expect(R"({"norm": "batchnorm"})", "norm");
  expect(R"({"n_layer": "4"})", "'n_layer' must be an integer");
  expect(R"({"bias": 1})", "'bias' must be true or false");
  expect(R"({"dropout": 1.5})", "dropout");
  expect(R"([1, 2])", "JSON object");
  expect("{not json", "not valid JSON");
  GPTConfig c = GPTConfig::from_json_string(R"({"n_head": 8, "n_embd": 256})");
  BOOST_TEST(c.n_kv_head == 8);
  BOOST_TEST(c.mlp_hidden == 1024);
  BOOST_TEST((GPTConfig::from_json(c.to_json()) == c));
  // the GPT-NeoX keys are written only when they say something, so that other configs stay as they were
  BOOST_TEST(!c.to_json().contains("rotary_dims"));
  BOOST_TEST(!c.to_json().contains("parallel_residual"));
  BOOST_TEST(!c.to_json().contains("head_size"));
  BOOST_TEST(!c.to_json().contains("qk_norm"));
  BOOST_TEST(!c.to_json().contains("norm_position"));
  BOOST_TEST(!c.to_json().contains("embed_scale"));
  const GPTConfig n = GPTConfig::from_json_string(R"({"n_head": 8, "n_embd": 256, "pos": "rope", "rotary_dims": 8, "parallel_residual": true})");
  BOOST_TEST(n.rope_dims() == 8);
  BOOST_TEST(c.rope_dims() == 32);
  BOOST_TEST((GPTConfig::from_json(n.to_json()) == n));
}

BOOST_AUTO_TEST_CASE(every_integer_key_is_range_checked_before_arithmetic) {
  auto expect = [](const nlohmann::json& j, const std::vector<std::string>& parts) {
    test::expect_throw([&] { TrainConfig::from_json(j); }, ErrorKind::config, parts);
  };
  // 4·n_embd wrapped to 0 and blamed mlp_hidden
  expect({{"n_embd", 4611686018427387904LL}}, {"n_embd", "at most", "4611686018427387904"});
  expect({{"n_layer", int64_t{1} << 40}}, {"n_layer", "at most"});
  expect({{"batch_size", 1e30}}, {"batch_size", "out of range"});
  expect({{"max_iters", -1e30}}, {"max_iters", "out of range"});
  expect({{"vocab_size", 1048577}}, {"vocab_size", "at most 1048576"});
  // one rule for seeds and threads, as the flags have: seeds 0..2^63-1, threads 0..max_threads
  expect({{"seed", 18446744073709551615ULL}}, {"seed", "18446744073709551615"});
  expect({{"seed", -1}}, {"seed", ">= 0"});
  expect({{"threads", -1}}, {"threads", ">= 0"});
  expect({{"threads", max_threads + 1}}, {"threads", "at most"});
  BOOST_TEST(TrainConfig::from_json({{"seed", max_seed}}).seed == max_seed);
  // bf16 moments are AdamW's; SGD's momentum buffer stays float32, said rather than ignored
  expect({{"optimizer", "sgd"}, {"moments", "bf16"}}, {"moments \"bf16\" is AdamW's", "\"sgd\""});
  expect({{"moments", "int8"}}, {"moments", "int8"});
  BOOST_TEST(TrainConfig::from_json({{"moments", "bf16"}}).optimizer_hparams_json().find(R"("moments":"bf16")") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(config_json_parsing_is_bounded) {
  auto expect = [](const std::string& text, const std::vector<std::string>& parts) {
    test::expect_throw([&] { parse_config_json(text, "cfg.json"); }, ErrorKind::config, parts);
  };
  expect(R"({"n_layer": 1, "batch_size": 2, "n_layer": 2})", {"cfg.json", "duplicate key 'n_layer'"});
  BOOST_TEST(parse_config_json(R"({"a": {"x": 1}, "b": {"x": 2}})", "cfg.json").size() == 2u);  // per object
  // 100,000 levels: rejected while parsing, before anything recurses over the value
  const size_t deep = 100000;
  expect(R"({"n_layer": )" + std::string(deep, '[') + std::string(deep, ']') + "}", {"cfg.json", "nested deeper"});
  test::expect_throw([&] { GPTConfig::from_json_string(std::string(deep, '[') + std::string(deep, ']')); },
                     ErrorKind::config, {"nested deeper"});
  // echoed values are cut: a huge value or key never fills the message
  const std::string huge(1 << 20, 'x');
  for (const nlohmann::json& j : {nlohmann::json{{"norm", huge}}, nlohmann::json{{"n_layer", huge}},
                                  nlohmann::json{{huge, 1}}, nlohmann::json{{"optimizer", huge}}}) {
    try {
      TrainConfig::from_json(j);
      BOOST_ERROR("accepted");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).size() < 200u, std::string(e.what()).substr(0, 200));
    }
  }
  BOOST_TEST(cut_for_message("h\u00e9llo", 5) == "h...");  // never half a UTF-8 sequence
  BOOST_TEST(echo_json(nlohmann::json::parse("[[1], 2]")) == "an array of 2 elements");
}

BOOST_AUTO_TEST_CASE(memory_is_checked_before_allocating) {
  const double gb = 1024.0 * 1024 * 1024;
  auto cfg = [](const nlohmann::json& j) { return TrainConfig::from_json(j); };
  auto expect = [&](const nlohmann::json& j, const std::vector<std::string>& parts) {
    test::expect_throw([&] { check_training_memory(cfg(j), 8 * gb); }, ErrorKind::config, parts);
  };
  check_training_memory(cfg(nlohmann::json::object()), 8 * gb);  // the baby config fits
  check_training_memory(cfg({{"n_layer", 6}, {"n_embd", 384}, {"n_head", 8}, {"block_size", 256}, {"batch_size", 32}}),
                        8 * gb);  // the paper preset fits
  expect({{"n_layer", 1000000000}}, {"parameters", "2.8 PB", "more than the 8 GB of memory available"});
  expect({{"batch_size", 1000000000}}, {"batch_size 1000000000", "activations"});
  expect({{"eval_iters", 1000000000}}, {"eval_iters 1000000000", "evaluation windows"});
  test::expect_throw([&] { check_training_memory(cfg({{"n_layer", 1000000000}})); }, ErrorKind::config, {"parameters"});
  // bf16 adds the buffer each weight is rounded into where a product uses it, as large as the
  // largest matrix (here the MLP's 4096 x 1024: vocab 65 x 1024 and q|k|v's 3072 x 1024 are
  // smaller), 2 bytes a value, 4 emulated (bf16 held in float32), and the linear layers' rounded
  // inputs: the emulated run needs more than the bf16 one, which needs more than f32
  TrainConfig big = cfg({{"n_layer", 24}, {"n_embd", 1024}, {"n_head", 16}, {"block_size", 64}, {"batch_size", 1}, {"eval_iters", 1}});
  const double P = static_cast<double>(model_cost(big.model).params), largest = 4096.0 * 1024;
  BOOST_TEST(training_memory(big).weights == 4 * P);
  big.precision = Precision::bf16;
  BOOST_TEST(training_memory(big).weights == 4 * P + 2 * largest);
  const TrainingMemory b16 = training_memory(big);
  const double room = b16.total();
  check_training_memory(big, room);
  big.precision = Precision::bf16_emulated;
  BOOST_TEST(training_memory(big).weights == 4 * P + 4 * largest);
  test::expect_throw([&] { check_training_memory(big, room); }, ErrorKind::config, {"training this config"});
  test::expect_throw([&] { check_training_memory(big, b16.weights + b16.gradients + b16.optimizer); }, ErrorKind::config,
                     {"the bf16-emulated copy of the largest weight"});
  big.precision = Precision::f32;
  check_training_memory(big, room);
  // on N ranks, unsharded: the flat all-reduce buffer of every gradient (4 bytes) and the half of it
  // OpenMPI's MPI_Allreduce allocates (bench/allreduce_memory.c), whatever N; none in one process,
  // none when the gradients are sharded (each reduced to its keeper)
  BOOST_TEST(training_memory(big, 1).reduce == 0);
  BOOST_TEST(training_memory(big, 2).reduce == 6 * P);
  BOOST_TEST(training_memory(big, 4).reduce == 6 * P);
  big.shard = Shard::gradients;
  BOOST_TEST(training_memory(big, 2).reduce == 0);
  // ZeRO stage 3 keeps a rank's share of the blocks' weights and one block gathered whole. This
  // config's block of d 1024 holds 12·d² + 2·d = 12,584,960 values (q|k|v 3·d², the projection d²,
  // the MLP's two 8·d², no biases; two layer norms' weights); besides the 24 blocks, the tied
  // embedding (65 × d), the positions (64 × d) and the final norm (d)
  const double block = 12.0 * 1024 * 1024 + 2.0 * 1024;
  BOOST_TEST(P == 24 * block + 65.0 * 1024 + 64.0 * 1024 + 1024.0);
  // Dealt out over 4 ranks, largest first, each to the least loaded: the 48 MLP matrices (12 a
  // rank), 24 q|k|v and 24 output projections (6 each), then the embedding (rank 0), the positions
  // (rank 1), and the 49 norm weights of d (48 in the blocks, ln_f last) to ranks 2 and 3 in turn,
  // still the lightest: ranks 2 and 3 keep 6 blocks' matrices and 24 block norms, 12 more norms
  // than 6 blocks hold. The estimate counts that heaviest rank's share and one block gathered.
  big.shard = Shard::parameters;
  BOOST_TEST(training_memory(big, 4).weights == 4 * (P - 24 * block + 6 * block + 12 * 1024.0 + block));
  BOOST_TEST(training_memory(big, 4).gradients == training_memory([&] { TrainConfig g = big; g.shard = Shard::gradients; return g; }(), 4).gradients);
  BOOST_TEST(training_memory(big, 1).weights == 4 * P);  // one process: nothing to share
  big.shard = Shard::none;
  // AdamW's two moments: 4 bytes each a trained parameter, 2 in bf16; a rank's share when sharded
  BOOST_TEST(training_memory(big).optimizer == 8 * P);
  big.moments = Moments::bf16;
  BOOST_TEST(training_memory(big).optimizer == 4 * P);
  big.shard = Shard::optimizer;
  BOOST_TEST(training_memory(big, 4).optimizer == P);
  big.shard = Shard::none;
  big.moments = Moments::f32;
  // distillation's teacher is held beside the model: its float32 weights, 4 bytes a parameter,
  // in the printed estimate (the check does not count it: the teacher is in memory before the run)
  big.precision = Precision::f32;
  const double teacher = static_cast<double>(model_cost(big.model).params);
  BOOST_TEST(training_memory(big, 1, teacher).teacher == 4 * teacher);
  BOOST_TEST(training_memory(big, 1, teacher).total() == training_memory(big).total() + 4 * teacher);

  // ... and every linear layer's rounded input, kept for the backward. The baby config at batch
  // 1000: f32 activations 4 bytes · (4·(16·128 + 2·512 + 4·64) + 2·65 = 13442 values) · 1000 · 64 =
  // 3.44 GB; the rounded inputs 4·(3·128 + 512) + 128 = 3712 values per token, 0.95 GB emulated
  // (4 bytes), 0.48 GB in bf16
  TrainConfig wide = cfg({{"batch_size", 1000}});
  const double acts = 4.0 * 13442 * 1000 * 64;
  check_training_memory(wide, acts + 0.3 * gb);
  wide.precision = Precision::bf16;
  check_training_memory(wide, acts + 0.6 * gb);
  test::expect_throw([&] { check_training_memory(wide, acts + 0.3 * gb); }, ErrorKind::config,
                     {"one step's activations with the bf16 copies of the linear layers' inputs"});
  wide.precision = Precision::bf16_emulated;
  test::expect_throw([&] { check_training_memory(wide, acts + 0.6 * gb); }, ErrorKind::config, {"bf16-emulated copies"});
  BOOST_TEST(available_memory_bytes() > 0);
  BOOST_TEST(byte_size_str(1536) == "1.5 KB");
}

BOOST_AUTO_TEST_CASE(sampling_never_draws_ids_past_the_vocab_limit) {
  // ids 2 and 3 are the likeliest, but a tokenizer of two symbols cannot print them
  Tensor logits = Tensor::from({1, 4}, {0.f, 0.5f, 10.f, 10.f});
  Rng r(3);
  BOOST_TEST(sample_next(logits, {.greedy = true, .vocab_limit = 2}, r) == std::vector<int32_t>({1}));
  for (int i = 0; i < 200; i++) {
    BOOST_TEST(sample_next(logits, {.vocab_limit = 2}, r)[0] < 2);
    BOOST_TEST(sample_next(logits, {.top_k = 3, .vocab_limit = 2}, r)[0] < 2);
  }
}

BOOST_AUTO_TEST_CASE(sampling) {
  Tensor logits = Tensor::from({2, 4}, {0.1f, 2.f, 0.3f, -1.f, 5.f, 1.f, 4.9f, 0.f});
  Rng r(1);
  BOOST_TEST(sample_next(logits, {.greedy = true}, r) == std::vector<int32_t>({1, 0}));
  for (int i = 0; i < 20; i++) BOOST_TEST(sample_next(logits, {.top_k = 1}, r) == std::vector<int32_t>({1, 0}));
  // temperatures so small that logit / T overflows (5 / 1e-320 is inf) take the limit T -> 0, the
  // greedy choice; before, inf - inf made the probabilities NaN and the draw arbitrary. Logits of
  // both signs, so the largest scaled logit is +inf in one row and finite 1e-300 scaling is fine.
  Tensor mixed = Tensor::from({2, 4}, {-3.f, -0.5f, -2.f, -1.f, 5.f, 1.f, 4.9f, 0.f});
  for (double t : {1e-320, 4.9e-324, 1e-300})
    for (int i = 0; i < 20; i++) BOOST_TEST(sample_next(mixed, {.temperature = t}, r) == std::vector<int32_t>({1, 0}), t);
  // top-2 never picks outside the two largest
  for (int i = 0; i < 200; i++) {
    auto s = sample_next(logits, {.top_k = 2}, r);
    BOOST_TEST((s[0] == 1 || s[0] == 2));
    BOOST_TEST((s[1] == 0 || s[1] == 2));
  }
  // frequencies follow softmax(logits / T)
  Tensor two = Tensor::from({1, 2}, {0.f, std::log(3.f)});
  int ones = 0;
  for (int i = 0; i < 4000; i++) ones += sample_next(two, {}, r)[0];
  BOOST_TEST(ones / 4000.0 == 0.75, tt::tolerance(0.05));
  ones = 0;
  for (int i = 0; i < 4000; i++) ones += sample_next(two, {.temperature = 2.0}, r)[0];
  BOOST_TEST(ones / 4000.0 == std::sqrt(3.0) / (1 + std::sqrt(3.0)), tt::tolerance(0.05));
  // seeded generation is reproducible, and runs past block_size by cropping
  GPT m(tiny(2), 1);
  m.eval();
  auto g1 = generate(m, {{1, 2}, {3, 4}}, 20, {}, 5), g2 = generate(m, {{1, 2}, {3, 4}}, 20, {}, 5);
  BOOST_TEST(g1 == g2);
  BOOST_TEST(g1[0].size() == 22u);
  // a run that ends before block_size holds a cache of its own length: the same tokens as the
  // first of the long run's (whose cache has block_size positions)
  for (int64_t n : {1, 3, 6}) {
    auto short_run = generate(m, {{1, 2}, {3, 4}}, n, {}, 5);
    for (size_t b = 0; b < 2; b++) BOOST_TEST(short_run[b] == std::vector<int32_t>(g1[b].begin(), g1[b].begin() + 2 + n));
  }
  // greedy generation with the cache equals greedy argmax over full forwards
  auto gg = generate(m, {{1, 2, 3}}, 8, {.greedy = true}, 0);
  std::vector<int32_t> seq{1, 2, 3};
  for (int i = 0; i < 8; i++) {
    NoGrad ng;
    Index ids(seq, {1, static_cast<int64_t>(seq.size())});
    Tensor l = m.forward(ids).val();
    const float* last = l.data() + (seq.size() - 1) * 11;
    seq.push_back(static_cast<int32_t>(std::max_element(last, last + 11) - last));
  }
  BOOST_TEST(gg[0] == seq);
}

BOOST_AUTO_TEST_CASE(dropout_in_the_model) {
  GPTConfig c = tiny(2);
  c.dropout = 0.2;
  GPT m(c, 1);
  Index ids = random_ids(2, 12, 11, 4);
  NoGrad ng;
  m.train();
  Tensor a = m.forward(ids).val(), b = m.forward(ids).val();
  BOOST_TEST(a.to_vector() != b.to_vector());  // fresh masks each call
  m.eval();
  Tensor e1 = m.forward(ids).val(), e2 = m.forward(ids).val();
  BOOST_TEST(e1.to_vector() == e2.to_vector(), tt::per_element());
  // the stream restored gives the same masks again
  m.train();
  const uint64_t st = m.dropout_rng().state();
  Tensor r1 = m.forward(ids).val();
  m.dropout_rng().set_state(st);
  BOOST_TEST(m.forward(ids).val().to_vector() == r1.to_vector(), tt::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
