#include "train/study/sweep/plan.h"
#include "train/train_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace tapelm {

std::vector<int64_t> sweep_kv_heads(int64_t H) {
  std::vector<int64_t> kv;
  for (int64_t k = H; k >= 1; k /= 2) {
    kv.push_back(k);
    if (k % 2) break;
  }
  if (kv.back() != 1) kv.push_back(1);
  return kv;
}

SweepPreset sweep_preset(const std::string& name) {
  SweepPreset p;
  p.name = name;
  nlohmann::json j;
  if (name == "micro") {  // for tests: seconds
    j = {{"n_layer", 1},  {"n_head", 4},        {"n_embd", 16},     {"block_size", 16}, {"batch_size", 4},
         {"max_iters", 20}, {"warmup_iters", 2}, {"eval_interval", 10}, {"eval_iters", 1}, {"log_interval", 10},
         {"learning_rate", 3e-3}, {"min_lr", 3e-4}};
    p.decode_iters = 1;
    p.decode_batches = {1, 4};
    p.calib_tokens = 256;  // its test corpus is a few hundred tokens
    p.smaller = true;      // so that the tests run every kind of cell
  } else if (name == "tiny") {  // nanoGPT's CPU model, half its steps: about 10 minutes on 2 cores
    j = {{"n_layer", 4},      {"n_head", 4},          {"n_embd", 128},       {"block_size", 64},
         {"batch_size", 12},  {"max_iters", 1000},    {"warmup_iters", 100}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 250}, {"eval_iters", 20},    {"log_interval", 100}};
    p.decode_iters = 9;  // a 0.8M model decodes a sample in milliseconds: more runs to order them
  } else if (name == "small") {  // eight query heads, so KV runs 8, 4, 2, 1: about an hour
    j = {{"n_layer", 4},      {"n_head", 8},          {"n_embd", 256},       {"block_size", 128},
         {"batch_size", 16},  {"max_iters", 1000},    {"warmup_iters", 100}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 300}, {"eval_iters", 10},    {"log_interval", 100}};
    p.smaller = true;
  } else if (name == "paper") {  // the long run: nanoGPT shakespeare-char size with 8 heads
    j = {{"n_layer", 6},      {"n_head", 8},           {"n_embd", 384},       {"block_size", 256},
         {"batch_size", 32},  {"max_iters", 5000},     {"warmup_iters", 200}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 500},  {"eval_iters", 20},    {"log_interval", 100},
         {"dropout", 0.1}};
    p.headline_seeds = 3;
    p.smaller = true;
  } else {
    throw Error(ErrorKind::usage, "unknown sweep preset \"" + name + "\" (expected tiny, small or paper)");
  }
  j["beta2"] = 0.99;
  j["weight_decay"] = 0.1;
  j["grad_clip"] = 1.0;
  j["checkpoint_interval"] = 250;
  p.pretrain = TrainConfig::from_json(j);
  return p;
}

std::vector<Variant> sweep_variants(const SweepPreset& p) {
  std::vector<Variant> v;
  for (const std::string& g : p.groupings)
    for (const std::string& m : p.methods) {
      const Variant one{&method(m), enum_from_name<Grouping>(g, "grouping")};
      if (one.grouping != Grouping::Contiguous && one.method->fresh) continue;
      v.push_back(one);
    }
  return v;
}

std::string cell_kind_name(CellKind k) {
  switch (k) {
    case CellKind::pretrain: return "pretrain";
    case CellKind::convert: return "convert";
    case CellKind::scratch: return "scratch";
    case CellKind::smaller: return "smaller";
  }
  throw Error(ErrorKind::internal, "bad cell kind");
}

CellKind parse_cell_kind(const std::string& s) {
  for (CellKind k : {CellKind::pretrain, CellKind::convert, CellKind::scratch, CellKind::smaller})
    if (cell_kind_name(k) == s) return k;
  throw Error(ErrorKind::data, "unknown sweep cell kind \"" + s + "\"");
}

std::string Cell::id() const {
  switch (kind) {
    case CellKind::pretrain: return "pretrain_mha";
    case CellKind::smaller: return "pretrain_mha_smaller";
    case CellKind::scratch: return "scratch_kv" + std::to_string(kv) + (distill ? "_kd" : "") + "_s" + std::to_string(seed);
    case CellKind::convert: {
      char a[32];
      std::snprintf(a, sizeof a, "%g", alpha);
      return "kv" + std::to_string(kv) + "_" + variant.name() + "_a" + a + (distill ? "_kd" : "") +
             (trainable == Trainable::all ? "" : "_t" + to_string(trainable)) + "_s" + std::to_string(seed);
    }
  }
  throw Error(ErrorKind::internal, "bad cell kind");
}

std::string Cell::method_name() const {
  switch (kind) {
    case CellKind::pretrain: return "";
    case CellKind::smaller: return "smaller";
    case CellKind::scratch: return "scratch";
    case CellKind::convert: return variant.name();
  }
  throw Error(ErrorKind::internal, "bad cell kind");
}

namespace {

/// The distilled cells of a plan (preset.distill_lambda > 0); bad distillation settings are usage Errors.
void add_distilled_cells(SweepPlan& plan) {
  const SweepPreset& p = plan.preset;
  if (!plan.distills()) return;
  if (!(p.distill_lambda <= 1) || !(p.distill_temperature >= min_distill_temperature && p.distill_temperature <= max_distill_temperature))
    throw Error(ErrorKind::usage, "sweep --distill: lambda must be in (0, 1] and the temperature " + distill_temperature_range() + " (got " +
                                      std::to_string(p.distill_lambda) + ", " + std::to_string(p.distill_temperature) + ")");
  for (const std::string& m : p.distill_methods) {
    const Variant v{&method(m), Grouping::Contiguous};  // an unknown name is refused here
    if (std::find(plan.variants.begin(), plan.variants.end(), v) != plan.variants.end() && !v.method->fresh)
      plan.distill_variants.push_back(v);
  }
  if (plan.distill_variants.empty())
    throw Error(ErrorKind::usage, "sweep --distill: none of the distilled methods is among the study's methods (or each starts fresh)");
  const int64_t steps = std::llround(p.headline_fraction * plan.pretrain_steps);
  for (int64_t kv : plan.kv_heads) {
    const std::vector<Variant> vs = kv == plan.n_head ? std::vector<Variant>{Variant{}} : plan.distill_variants;
    for (const Variant& v : vs)
      for (int s = 1; s <= p.headline_seeds; s++) plan.cells.push_back({CellKind::convert, kv, v, p.headline_fraction, s, steps, true});
  }
}

/// The partial cells of a plan (preset.partial): the headline α, every seed, each KV count below H.
void add_partial_cells(SweepPlan& plan) {
  const SweepPreset& p = plan.preset;
  if (!plan.partial()) return;
  const Variant v{&method(p.partial_method), Grouping::Contiguous};  // an unknown name is refused here
  if (std::find(plan.variants.begin(), plan.variants.end(), v) == plan.variants.end())
    throw Error(ErrorKind::usage, "sweep --train: the method of the partial cells, " + p.partial_method + ", is not among the study's methods");
  plan.partial_variant = v;
  const int64_t steps = std::llround(p.headline_fraction * plan.pretrain_steps);
  for (const Trainable t : p.partial) {
    if (t == Trainable::all) throw Error(ErrorKind::usage, "sweep --train: \"all\" is every plain cell already; give attention, kv");
    for (int64_t kv : plan.kv_heads)
      if (kv < plan.n_head)
        for (int s = 1; s <= p.headline_seeds; s++)
          plan.cells.push_back({CellKind::convert, kv, v, p.headline_fraction, s, steps, false, t});
  }
}

}  // namespace

SweepPlan::SweepPlan(const SweepPreset& p)
    : preset(p),
      n_head(p.pretrain.model.n_head),
      pretrain_steps(p.pretrain.max_iters),
      scratch_steps(std::llround((1.0 + p.headline_fraction) * p.pretrain.max_iters)),
      distill_scratch_steps(std::llround((1.0 + kDistilledStepCost * p.headline_fraction) * p.pretrain.max_iters)),
      kv_heads(sweep_kv_heads(p.pretrain.model.n_head)) {
  variants = sweep_variants(p);  // refuses unknown names
  if (std::find(p.methods.begin(), p.methods.end(), "mean") == p.methods.end())
    throw Error(ErrorKind::usage, "the sweep's methods must include mean (the reference of its tables)");
  if (std::find(p.groupings.begin(), p.groupings.end(), "contiguous") == p.groupings.end())
    throw Error(ErrorKind::usage, "the sweep's groupings must include contiguous");
  const int64_t H = n_head, P = pretrain_steps;
  if (!p.from.empty() && p.pretrain.model.n_kv_head != H)
    throw Error(ErrorKind::usage, p.from + ": " + std::to_string(p.pretrain.model.n_kv_head) + " key/value heads for " +
                                      std::to_string(H) + " query heads; the study starts from an MHA model (as many key/value heads as query heads)");
  cells.push_back({CellKind::pretrain, H, {}, 0, 1, p.from.empty() ? P : 0});
  for (int64_t kv : kv_heads) {
    // Converting MHA to MHA changes nothing whatever the method: only uptraining is measured.
    const std::vector<Variant> methods = kv == H ? std::vector<Variant>{Variant{}} : variants;
    for (const Variant& m : methods) {
      // per-layer at one head per layer: MQA's budget has one allocation, the uniform one
      if (m.grouping == Grouping::PerLayer && kv == 1) continue;
      for (double a : p.fractions) {
        const bool headline = std::fabs(a - p.headline_fraction) < 1e-12;
        // Every α for mean pooling (Fig. 5); the others at α = 0 and the headline α (Fig. 4).
        if (!(m == Variant{}) && !headline && a != 0) continue;
        for (int s = 1; s <= (headline ? p.headline_seeds : 1); s++)
          cells.push_back({CellKind::convert, kv, m, a, s, std::llround(a * P)});
      }
    }
  }
  add_distilled_cells(*this);
  add_partial_cells(*this);
  for (bool distilled : {false, true})  // from scratch: at plain, then at distilled compute
    if (p.scratch && (!distilled || distills()))
      for (int64_t kv : kv_heads)
        if (kv < H) cells.push_back({CellKind::scratch, kv, {}, 0, 1, distilled ? distill_scratch_steps : scratch_steps, distilled});
  if (p.smaller) {
    if (!p.from.empty()) throw Error(ErrorKind::internal, "the smaller MHA model needs the study's own recipe, not --from");
    const GPTConfig& m = p.pretrain.model;
    if (m.n_embd % 2 || (m.n_embd / 2) % H || (m.pos == PosKind::Rope && (m.n_embd / 2 / H) % 2))
      throw Error(ErrorKind::usage, "the smaller MHA model halves n_embd " + std::to_string(m.n_embd) + ", which must leave a whole (and, with rope, even) head size for " +
                                        std::to_string(H) + " heads");
    cells.push_back({CellKind::smaller, H, {}, 0, 1, P});
  }
}

const Cell& SweepPlan::find(CellKind kind, int64_t kv, const Variant& v, double alpha, int seed, bool distill, Trainable trainable) const {
  for (const Cell& c : cells)
    if (c.kind == kind && c.kv == kv && c.variant == v && std::fabs(c.alpha - alpha) < 1e-12 && c.seed == seed && c.distill == distill &&
        c.trainable == trainable)
      return c;
  throw Error(ErrorKind::internal, "the sweep plan has no " + Cell{kind, kv, v, alpha, seed, 0, distill, trainable}.id());
}

TrainConfig SweepPlan::train_config_for(const Cell& c) const {
  if (c.kind == CellKind::convert) throw Error(ErrorKind::internal, "train_config_for: " + c.id() + " is uptrained");
  TrainConfig t = preset.pretrain;
  t.model = model_for(c);
  t.max_iters = c.steps;
  t.lr_decay_iters = c.steps;
  // a model trained from scratch draws its own init and batches
  if (c.kind == CellKind::scratch) t.seed = preset.pretrain.seed + 1000 * static_cast<uint64_t>(c.kv);
  return t;
}

GPTConfig SweepPlan::model_for(const Cell& c) const {
  GPTConfig m = preset.pretrain.model;
  m.n_kv_head = c.kv;
  if (c.kind == CellKind::smaller) {  // same depth, heads and recipe; half the width
    m.n_embd /= 2;
    m.mlp_hidden = std::max<int64_t>(1, m.mlp_hidden / 2);
  }
  return m;
}

UptrainOptions SweepPlan::uptrain_options_for(const Cell& c) const {
  if (c.kind != CellKind::convert) throw Error(ErrorKind::internal, "uptrain_options_for: " + c.id() + " is trained");
  UptrainOptions o;
  o.kv_heads = c.kv;
  o.variant = c.variant;
  o.calib_tokens = preset.calib_tokens;
  o.fraction = c.alpha;
  o.seed = static_cast<uint64_t>(c.seed);
  if (!preset.from.empty()) o.original = preset.pretrain;  // the imported model holds weights only
  o.precision = preset.pretrain.precision;                  // one precision for every run of the study
  if (c.distill) {
    o.distill_lambda = preset.distill_lambda;
    o.distill_temperature = preset.distill_temperature;
  }
  o.trainable = c.trainable;
  return o;
}

std::string SweepPlan::kv_name(int64_t kv) const {
  if (kv == n_head) return "MHA";
  if (kv == 1) return "MQA";
  return "GQA-" + std::to_string(kv);
}

}  // namespace tapelm
