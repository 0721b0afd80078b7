#include "train/study/convert/convert.h"

#include <cmath>
#include <unordered_set>

#include "train/study/convert/align.h"
#include "train/study/convert/merge.h"

namespace tapelm {

namespace {

void check_calibration(const GPT& m, const Calibration* c, const Variant& v) {
  if (!c) throw Error(ErrorKind::usage, "conversion " + v.name() + " needs calibration data");
  const int64_t d = m.config().n_embd;
  if (static_cast<int64_t>(c->gram.size()) != m.config().n_layer || c->gram[0].rows != d + 1)
    throw Error(ErrorKind::internal, "calibration statistics do not match the model's layers");
}

/// Every parameter of src into dst's, but for those in `skip` (matched by dst's tensor).
void copy_parameters(const Module& src, const Module& dst, const std::unordered_set<const float*>& skip = {}) {
  auto d = dst.named_parameters(), s = src.named_parameters();
  for (size_t i = 0; i < s.size(); i++)
    if (!skip.count(d[i].second.val().data())) d[i].second.val() = s[i].second.val().clone();
}

/// The tensors of an attention's K and V projections: what pooling writes (and k_norm's weight
/// when it spans the key heads: qk_norm "all").
std::unordered_set<const float*> kv_tensors(const Attention& a, const GPTConfig& c) {
  std::unordered_set<const float*> kv;
  for (const auto& lin : {a.wk, a.wv}) {
    kv.insert(lin->weight.val().data());
    if (lin->bias.defined()) kv.insert(lin->bias.val().data());
  }
  if (c.qk_norm == QkNorm::all) kv.insert(a.k_norm->weight.val().data());
  return kv;
}

}  // namespace

namespace {

void convert_attention_unchecked(const Attention& src, const Attention& out, const GPTConfig& c, int64_t G, const Variant& v,
                                 const la::Mat* S, Rng& rng) {
  const MethodRow& m = *v.method;
  const int64_t rep = c.n_kv_head / G, hd = c.head_dim();
  if (rep > 1 && c.qk_norm != QkNorm::none && (m.aligns || m.fits))
    throw Error(ErrorKind::usage, "conversion " + v.name() + " with qk_norm: its rotations and least-squares merges act on the keys "
                                  "before k_norm's per-dimension weight, which neither commutes with; convert by mean, first, mean-norm or random");
  if (rep == 1 && !m.fresh) {
    copy_parameters(src, out);
    return;
  }
  // The function-preserving steps work on a copy of the source's attention.
  std::unique_ptr<Attention> work;
  const bool similar = v.grouping == Grouping::Similar && rep > 1;
  if (similar || m.aligns) {
    if (!S) throw Error(ErrorKind::internal, "convert_attention: " + v.name() + " without calibration statistics");
    work = std::make_unique<Attention>(c, std::make_shared<Rng>(0));
    copy_parameters(src, *work);
    if (similar) permute_kv_heads(*work, c, similar_order(*work, c, rep, *S));
    if (m.aligns) align_kv_heads(*work, c, rep, *S);
  }
  const Attention& from = work ? *work : src;
  copy_parameters(from, out, kv_tensors(out, c));
  pool_kv(from, out, m, rep, hd, rng);
  if (m.fits) fit_kv(from, out, rep, hd, *S);
}

}  // namespace

void convert_attention(const Attention& src, const Attention& out, const GPTConfig& c, int64_t G, const Variant& v,
                       const la::Mat* S, Rng& rng, int64_t layer) {
  const std::string at = "layer " + std::to_string(layer) + ": converting by " + v.name();
  // A finite source can still overflow float32 in the calibration forward (one weight of 3e38):
  // LAPACK then refused the statistics with "info -5", naming no layer.
  if (S)
    for (const double x : S->a)
      if (!std::isfinite(x))
        throw Error(ErrorKind::data, at + ": the calibration activations at the attention's input are not finite (weights beyond "
                                          "float32's range in the products before it?); convert by mean, which needs none");
  try {
    convert_attention_unchecked(src, out, c, G, v, S, rng);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::internal || std::string(e.what()).rfind("la::", 0) != 0) throw;
    throw Error(ErrorKind::data, at + ": " + e.what());
  }
  for (const auto& [n, p] : out.named_parameters()) {
    const Tensor& t = p.val();
    for (int64_t i = 0; i < t.numel(); i++)
      if (!std::isfinite(t[i]))
        throw Error(ErrorKind::data, at + ": attn." + n + " came out non-finite at element " + std::to_string(i) +
                                          " (weights beyond float32's range in the source?)");
  }
}

GPTConfig converted_config(const GPTConfig& c, const std::vector<int64_t>& G) {
  if (G.size() != 1 && static_cast<int64_t>(G.size()) != c.n_layer)
    throw Error(ErrorKind::config, "cannot convert to " + std::to_string(G.size()) + " layers' key/value heads: the model has " +
                                       std::to_string(c.n_layer) + " layers");
  std::vector<int64_t> per_layer;
  for (int64_t l = 0; l < c.n_layer; l++) {
    const int64_t g = G.size() == 1 ? G[0] : G[static_cast<size_t>(l)], from = c.kv_heads(l);
    if (g <= 0 || from % g != 0)
      throw Error(ErrorKind::config, "cannot convert " + std::to_string(from) + " kv heads to " + std::to_string(g) +
                                         (c.per_layer_kv() || G.size() > 1 ? " in layer " + std::to_string(l) : "") +
                                         ": the new count must divide the old");
    per_layer.push_back(g);
  }
  GPTConfig nc = c;
  nc.set_kv_heads(per_layer);
  return nc;
}

std::unique_ptr<GPT> convert_kv_heads(const GPT& src, int64_t G, const ConvertOptions& o) {
  return convert_kv_heads(src, std::vector<int64_t>{G}, o);
}

std::unique_ptr<GPT> convert_kv_heads(const GPT& src, const std::vector<int64_t>& G, const ConvertOptions& o) {
  const GPTConfig& c = src.config();
  const GPTConfig nc = converted_config(c, G);
  auto out = std::make_unique<GPT>(nc, o.seed);
  const bool calibrates = conversion_calibrates(c, nc, o.variant);
  if (calibrates) check_calibration(src, o.calib, o.variant);
  // Outside the attentions everything is copied; each attention is converted on its own, the
  // method's random draws in layer order.
  std::unordered_set<const float*> attention_tensors;
  for (const auto& b : out->blocks)
    for (const auto& [n, p] : b->attn->named_parameters()) attention_tensors.insert(p.val().data());
  copy_parameters(src, *out, attention_tensors);
  Rng rng(o.seed ^ 0xC0DE);
  for (int64_t l = 0; l < c.n_layer; l++)
    convert_attention(*src.blocks[l]->attn, *out->blocks[l]->attn, c.layer(l), nc.kv_heads(l), o.variant,
                      o.calib && calibrates ? &o.calib->gram[l] : nullptr, rng, l);
  return out;
}

}  // namespace tapelm
