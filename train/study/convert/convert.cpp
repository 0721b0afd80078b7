#include "train/study/convert/convert.h"

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
void copy_parameters(const GPT& src, GPT& dst, const std::unordered_set<const float*>& skip = {}) {
  auto d = dst.named_parameters(), s = src.named_parameters();
  for (size_t i = 0; i < s.size(); i++)
    if (!skip.count(d[i].second.val().data())) d[i].second.val() = s[i].second.val().clone();
}

/// A copy of a model with the same config and weights.
std::unique_ptr<GPT> clone_model(const GPT& src) {
  auto out = std::make_unique<GPT>(src.config(), 0);
  copy_parameters(src, *out);
  return out;
}

/// The tensors of every attention's K and V projections: what pooling writes.
std::unordered_set<const float*> kv_tensors(const GPT& m) {
  std::unordered_set<const float*> kv;
  for (const auto& b : m.blocks)
    for (const auto& lin : {b->attn->wk, b->attn->wv}) {
      kv.insert(lin->weight.val().data());
      if (lin->bias.defined()) kv.insert(lin->bias.val().data());
    }
  return kv;
}

}  // namespace

std::unique_ptr<GPT> convert_kv_heads(const GPT& src_in, int64_t G, const ConvertOptions& o) {
  const GPTConfig& c = src_in.config();
  if (G <= 0 || c.n_kv_head % G != 0)
    throw Error(ErrorKind::config, "cannot convert " + std::to_string(c.n_kv_head) + " kv heads to " + std::to_string(G) +
                                       ": the new count must divide the old");
  const MethodRow& m = *o.variant.method;
  const int64_t rep = c.n_kv_head / G, hd = c.head_dim();
  GPTConfig nc = c;
  nc.n_kv_head = G;
  auto out = std::make_unique<GPT>(nc, o.seed);
  if (rep == 1 && !m.fresh) {  // groups of one: the model as it is
    copy_parameters(src_in, *out);
    return out;
  }
  if (conversion_calibrates(c.n_kv_head, G, o.variant)) check_calibration(src_in, o.calib, o.variant);
  // The function-preserving steps work on a copy of the source.
  std::unique_ptr<GPT> work;
  const bool similar = o.variant.grouping == Grouping::Similar && rep > 1;
  if (similar || m.aligns) {
    work = clone_model(src_in);
    if (similar)
      for (int64_t l = 0; l < c.n_layer; l++) permute_kv_heads(*work, l, similar_order(*work, l, rep, *o.calib));
    if (m.aligns) align_kv_heads(*work, rep, *o.calib);
  }
  const GPT& src = work ? *work : src_in;
  copy_parameters(src, *out, kv_tensors(*out));
  Rng rng(o.seed ^ 0xC0DE);
  for (int64_t l = 0; l < c.n_layer; l++) pool_kv(*src.blocks[l]->attn, *out->blocks[l]->attn, m, rep, hd, rng);
  if (m.fits)
    for (int64_t l = 0; l < c.n_layer; l++) fit_kv(*src.blocks[l]->attn, *out->blocks[l]->attn, rep, hd, o.calib->gram[l]);
  return out;
}

}  // namespace tapelm
