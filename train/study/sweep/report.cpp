#include "train/study/sweep/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>

#include "train/study/plot.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// A number as the cell files spell it (results.csv copies them).
std::string num(double v) { return nlohmann::json(v).dump(); }

/// The results looked up by the plan's coordinates.
struct Table {
  const SweepPlan& plan;
  const std::vector<CellResult>& results;

  const CellResult& of(const Cell& c) const {
    for (const CellResult& r : results)
      if (r.cell == c) return r;
    throw Error(ErrorKind::internal, "no result for sweep cell " + c.id());
  }
  /// The variant whose cells stand for v at kv heads: per-layer at one head per layer is the
  /// contiguous conversion (MQA's budget allows no other allocation; the plan runs no such cells).
  static Variant as_run(int64_t kv, const Variant& v) {
    return v.grouping == Grouping::PerLayer && kv == 1 ? Variant{v.method, Grouping::Contiguous} : v;
  }
  /// Val loss by seed of a converted model (distilled or not, every parameter uptrained or some).
  std::map<int, double> by_seed(int64_t kv, const Variant& variant, double a, bool distill = false,
                                Trainable trainable = Trainable::all) const {
    std::map<int, double> out;
    const Variant v = as_run(kv, variant);
    for (const CellResult& r : results)
      if (r.cell.kind == CellKind::convert && r.cell.kv == kv && r.cell.variant == v && std::fabs(r.cell.alpha - a) < 1e-12 &&
          r.cell.distill == distill && r.cell.trainable == trainable)
        out[r.cell.seed] = r.val_loss;
    return out;
  }
  /// Val loss over the seeds of a converted model.
  Stat losses(int64_t kv, const Variant& v, double a, bool distill = false) const {
    std::vector<double> out;
    for (const auto& [seed, loss] : by_seed(kv, v, a, distill)) out.push_back(loss);
    return stat(out);
  }
  /// Val loss over the seeds of the reference conversion, the paper's mean pooling.
  Stat mean_losses(int64_t kv, double a) const { return losses(kv, Variant{}, a); }
  /// Whether the plan converts with this variant.
  bool has(const Variant& v) const { return std::find(plan.variants.begin(), plan.variants.end(), v) != plan.variants.end(); }
  /// The cell whose costs (parameters, cache, decoding time) stand for every model with kv heads.
  const CellResult& costs(int64_t kv) const { return of(plan.find(CellKind::convert, kv, Variant{}, 0)); }
  /// Decoding time per sample of a kv at a batch size.
  double ms_per_sample(int64_t kv, int64_t batch) const { return costs(kv).decode.at(batch).ms_per_sample; }
};

const char* yes(bool b) { return b ? "**yes**" : "**no**"; }

}  // namespace

Stat stat(const std::vector<double>& v) {
  Stat s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= s.n;
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = s.n > 1 ? std::sqrt(s.sd / (s.n - 1)) : 0;
  return s;
}

std::string fmt_stat(const Stat& s) {
  if (s.n == 0) return "–";
  if (s.n == 1) return fmt("%.4f", s.mean);
  return fmt("%.4f", s.mean) + " ± " + fmt("%.4f", s.sd) + " (n=" + std::to_string(s.n) + ")";
}

void write_results_csv(std::ostream& csv, const SweepPlan& plan, const std::vector<CellResult>& results) {
  csv << "id,kind,kv_heads,kv_heads_per_layer,method,distill,train,alpha,seed,steps,schedule,val_loss,perplexity,loss_before,train_seconds,params,"
         "forward_flops_per_token,kv_cache_bytes_per_token,val_loss_kv_f16,val_loss_kv_q8";
  for (int64_t b : plan.preset.decode_batches)
    csv << ",decode_ms_per_token_step_b" << b << ",decode_ms_per_sample_b" << b;
  // a RoPE model's decoding at 4·T, the serving batch (the same context in every row)
  const int64_t L = results.empty() ? 0 : results.front().decode_long_context, b_hi = plan.preset.decode_batches.back();
  if (L > 0) csv << ",decode_ms_per_token_step_b" << b_hi << "_ctx" << L << ",decode_ms_per_sample_b" << b_hi << "_ctx" << L;
  const std::string lowkv = results.empty() ? "" : results.front().decode_lowkv_cache;
  if (!lowkv.empty()) csv << ",decode_ms_per_token_step_b" << b_hi << "_kv_" << lowkv << ",decode_ms_per_sample_b" << b_hi << "_kv_" << lowkv;
  csv << "\n";
  for (const CellResult& r : results) {
    const Cell& c = r.cell;
    std::string layers;  // "8;4;2;2": one field
    for (int64_t k : r.kv_layers) layers += (layers.empty() ? "" : ";") + std::to_string(k);
    csv << c.id() << "," << cell_kind_name(c.kind) << "," << c.kv << "," << layers << "," << c.method_name() << "," << (c.distill ? 1 : 0) << ","
        << (c.kind == CellKind::convert ? to_string(c.trainable) : "") << "," << num(c.alpha) << ","
        << c.seed << "," << c.steps << "," << r.schedule << "," << num(r.val_loss) << "," << num(r.perplexity) << ","
        << (r.loss_before ? num(*r.loss_before) : "") << "," << num(r.train_seconds) << "," << r.params << ","
        << num(r.forward_flops_per_token) << "," << r.kv_cache_bytes_per_token;
    for (const char* type : {"f16", "q8"}) csv << "," << (r.val_loss_kv.count(type) ? num(r.val_loss_kv.at(type)) : "");
    for (int64_t b : plan.preset.decode_batches)
      csv << "," << num(r.decode.at(b).ms_per_token_step) << "," << num(r.decode.at(b).ms_per_sample);
    if (L > 0) csv << "," << num(r.decode_long.at(b_hi).ms_per_token_step) << "," << num(r.decode_long.at(b_hi).ms_per_sample);
    if (!lowkv.empty())
      csv << "," << num(r.decode_lowkv.at(b_hi).ms_per_token_step) << "," << num(r.decode_lowkv.at(b_hi).ms_per_sample);
    csv << "\n";
  }
}

namespace {

/// The study's shape in one paragraph: data, model, recipe, how losses and decoding were measured.
void write_header(std::ostream& md, const SweepPlan& plan, const Table& t, const ReportContext& ctx) {
  const SweepPreset& p = plan.preset;
  const TrainConfig& cfg = p.pretrain;
  const int64_t P = plan.pretrain_steps;
  md << "# GQA/MQA uptraining trade-off — preset `" << p.name << "`\n\n";
  md << "Measured " << ctx.date << " on `" << ctx.data_name << "` (" << ctx.train_tokens << " train / "
     << ctx.val_tokens << " val tokens). MHA model: " << cfg.model.n_layer << " layers, " << plan.n_head << " heads, d "
     << cfg.model.n_embd << ", T " << cfg.model.block_size;
  if (p.from.empty()) md << ", pretrained " << P << " steps of batch " << cfg.batch_size;
  else md << ", `" << std::filesystem::path(p.from).filename().string() << "` as given (P = " << P
          << " steps of batch " << cfg.batch_size << " from the training config" << (p.scratch ? "" : "; no models from scratch") << ")";
  md << ". Uptraining: α × " << P
     << " steps with the pretraining recipe, fresh AdamW, short warmup then cosine (`rewarm`). Val loss: "
     << (cfg.final_eval_tokens > 0 ? "the windows holding the val split's first " + std::to_string(cfg.final_eval_tokens) + " tokens (`final_eval_tokens`)"
                                   : std::string("the whole val split"))
     << " in non-overlapping windows. Decode, at a serving shape: a prompt of "
     << std::max<int64_t>(1, cfg.model.block_size / 2) << " tokens prefilled, then greedy KV-cache generation to T = "
     << cfg.model.block_size << "; every KV count timed in turn, run after run (at least " << std::max(3, p.decode_iters)
     << " runs each, more until neighbouring KV counts' interquartile ranges separate, within a minute per batch size); the median; ms "
        "per sample = (prefill + generation time) / batch; batch "
     << p.decode_batches.back() << " is the serving batch of the findings, also timed with the smallest KV cache that "
        "costs no quality (q8 where the head dimension is a multiple of 32, else f16; the KV-cache section below) in "
        "Table 1's last decode column.";
  const std::string& with = t.costs(plan.n_head).decode_timed_with;
  md << " Decoding ran on " << (with.empty() ? "a thread count and OpenMP wait policy not recorded (an older sweep's times)" : with)
     << ".";
  if (cfg.model.pos == PosKind::Rope)
    md << " The model has RoPE, so decoding is also timed at 4 × T = " << 4 * cfg.model.block_size << " (a prompt of "
       << 2 * cfg.model.block_size << " tokens, batch " << p.decode_batches.back()
       << "): positions it was not trained on, a speed measurement only.";
  if (p.smaller) {
    const GPTConfig sm = plan.model_for(plan.smaller());
    md << " A smaller MHA model (d " << sm.n_embd << ", MLP " << sm.mlp_hidden << ", otherwise the same model and recipe) is "
       << "pretrained too, for the frontier across sizes (the paper's Table 1).";
  }
  if (std::any_of(plan.variants.begin(), plan.variants.end(), [](const Variant& v) { return v.grouping == Grouping::PerLayer; }))
    md << " `per-layer`: a KV count's budget (that count in every layer) placed layer by layer where the calibrated conversion "
          "error is largest (docs/guide/uptraining.md), contiguous groups within a layer; its models are timed as the uniform "
          "model of that count (the same KV-cache bytes when the budget is spent).";
  if (cfg.precision != Precision::f32)
    md << " Training and uptraining ran the linear layers' products in " << to_string(cfg.precision)
       << " (bf16 inputs, f32 sums; docs/guide/precision.md); every val loss is evaluated in f32.";
  md << " ± is the sample standard deviation over seeds.\n\n";
}

/// Table 1: quality and decoding time per kv-head count (mean pooling), and from scratch.
void write_table1(std::ostream& md, const Table& t) {
  const SweepPlan& plan = t.plan;
  const SweepPreset& p = plan.preset;
  const int64_t H = plan.n_head, b_lo = p.decode_batches.front(), b_hi = p.decode_batches.back();
  const double ha = p.headline_fraction;
  md << "## Table 1 — quality and decoding time after uptraining with α = " << ha << " (mean pooling)\n\n";
  const int64_t L = t.costs(H).decode_long_context;
  md << "| model | KV heads | val loss | perplexity | decode ms/sample (batch " << b_lo << ") | decode ms/sample (batch "
     << b_hi << ") |";
  if (L > 0) md << " decode ms/sample (batch " << b_hi << ", context " << L << ") |";
  const std::string lowkv = t.costs(H).decode_lowkv_cache;
  if (!lowkv.empty()) md << " decode ms/sample (batch " << b_hi << ", " << lowkv << " cache) |";
  md << " KV cache bytes/token | params |\n";
  md << "|---|---|---|---|---|---|" << (L > 0 ? "---|" : "") << (lowkv.empty() ? "" : "---|") << "---|---|\n";
  auto cost_row = [&](const std::string& name, int64_t kv, const Stat& s, const CellResult& c) {
    md << "| " << name << " | " << kv << " | " << fmt_stat(s) << " | " << fmt("%.3f", std::exp(s.mean)) << " | "
       << fmt("%.1f", c.decode.at(b_lo).ms_per_sample) << " | " << fmt("%.2f", c.decode.at(b_hi).ms_per_sample) << " | ";
    if (L > 0) md << fmt("%.2f", c.decode_long.at(b_hi).ms_per_sample) << " | ";
    if (!lowkv.empty())  // a model whose heads q8 cannot hold (the smaller one's) says which cache it ran
      md << fmt("%.2f", c.decode_lowkv.at(b_hi).ms_per_sample) << (c.decode_lowkv_cache != lowkv ? " (" + c.decode_lowkv_cache + ")" : "") << " | ";
    md << c.kv_cache_bytes_per_token << " | " << c.params << " |\n";
  };
  auto row = [&](const std::string& name, int64_t kv, const Stat& s) { cost_row(name, kv, s, t.costs(kv)); };
  row("MHA (pretrained, α = 0)", H, stat({t.of(plan.pretrain()).val_loss}));
  for (int64_t kv : plan.kv_heads)
    row(plan.kv_name(kv) + (kv == H ? " + α uptraining (same compute)" : ""), kv, t.mean_losses(kv, ha));
  for (int64_t kv : plan.kv_heads)
    if (kv < H && p.scratch)
      row(plan.kv_name(kv) + " from scratch (" + std::to_string(plan.scratch_steps) + " steps)", kv,
          stat({t.of(plan.scratch(kv)).val_loss}));
  if (p.smaller) {
    const CellResult& sm = t.of(plan.smaller());
    cost_row("smaller MHA (d " + std::to_string(plan.model_for(plan.smaller()).n_embd) + ", pretrained, " +
                 std::to_string(plan.pretrain_steps) + " steps)",
             H, stat({sm.val_loss}), sm);
  }
}

/// A row per variant, a column per converted kv-head count; `cell` writes one entry.
void write_method_table(std::ostream& md, const Table& t, const std::function<std::string(const Variant&, int64_t)>& cell) {
  const SweepPlan& plan = t.plan;
  md << "| method | grouping |";
  for (int64_t kv : plan.kv_heads)
    if (kv < plan.n_head) md << " " << plan.kv_name(kv) << " |";
  md << "\n|---|---|";
  for (int64_t kv : plan.kv_heads)
    if (kv < plan.n_head) md << "---|";
  md << "\n";
  for (const Variant& v : plan.variants) {
    md << "| " << v.method->name << " | " << to_string(v.grouping) << " |";
    for (int64_t kv : plan.kv_heads)
      if (kv < plan.n_head) md << " " << cell(v, kv) << " |";
    md << "\n";
  }
}

/// Figure 4 as tables: every variant's loss after uptraining (and before), and its conversion time.
void write_method_tables(std::ostream& md, const Table& t) {
  const double ha = t.plan.preset.headline_fraction;
  md << "\n## Figure 4 — conversion methods (val loss after uptraining with α = " << ha << ", over seeds; α = 0, "
        "before uptraining, in brackets)\n\n";
  write_method_table(md, t, [&](const Variant& v, int64_t kv) {
    return fmt_stat(t.losses(kv, v, ha)) + " (" + fmt("%.4f", t.losses(kv, v, 0).mean) + ")";
  });
  md << "\nConversion wall time, calibration included (s, the α = 0 cell):\n\n";
  write_method_table(md, t, [&](const Variant& v, int64_t kv) {
    const CellResult& r = t.of(t.plan.find(CellKind::convert, kv, Table::as_run(kv, v), 0));
    return r.convert_seconds ? fmt("%.3f", *r.convert_seconds) : std::string("–");
  });
}

/// Figure 5 as a table: mean pooling's loss per α and kv-head count.
void write_alpha_table(std::ostream& md, const Table& t) {
  const SweepPlan& plan = t.plan;
  md << "\n## Figure 5 — uptraining proportion α (mean pooling, val loss)\n\n| α | steps |";
  for (int64_t kv : plan.kv_heads) md << " " << plan.kv_name(kv) << " |";
  md << "\n|---|---|";
  for (size_t i = 0; i < plan.kv_heads.size(); i++) md << "---|";
  md << "\n";
  for (double a : plan.preset.fractions) {
    md << "| " << a << " | " << std::llround(a * plan.pretrain_steps) << " |";
    for (int64_t kv : plan.kv_heads) md << " " << fmt("%.4f", t.mean_losses(kv, a).mean) << " |";
    md << "\n";
  }
}

/// The variant with the lowest mean loss at α, with or without the reference (mean pooling).
std::pair<std::string, double> best_variant(const Table& t, int64_t kv, double a, bool with_reference) {
  std::string best;
  double best_loss = INFINITY;
  for (const Variant& v : t.plan.variants)
    if ((with_reference || !(v == Variant{})) && t.losses(kv, v, a).mean < best_loss)
      best_loss = t.losses(kv, v, a).mean, best = v.name();
  return {best, best_loss};
}

/// Heads per layer against the same budget spread evenly, for each method the study allocates by:
/// better at α = 0, and at the headline α by more than a seed-sd.
void write_per_layer_findings(std::ostream& md, const Table& t, int64_t kv) {
  const double ha = t.plan.preset.headline_fraction;
  for (const Variant& v : t.plan.variants) {
    if (v.grouping != Grouping::PerLayer || kv == 1) continue;  // MQA: one allocation
    const Variant uniform{v.method, Grouping::Contiguous};
    std::string alloc;
    for (int64_t k : t.of(t.plan.find(CellKind::convert, kv, v, 0)).kv_layers) alloc += (alloc.empty() ? "" : ",") + std::to_string(k);
    const double p0 = t.losses(kv, v, 0).mean, u0 = t.losses(kv, uniform, 0).mean;
    const Stat p1 = t.losses(kv, v, ha), u1 = t.losses(kv, uniform, ha);
    md << "- " << t.plan.kv_name(kv) << ": " << v.method->name << " with its " << kv * t.plan.preset.pretrain.model.n_layer
       << " KV heads placed per layer (" << (alloc.empty() ? "as uniform" : alloc) << ") beats them spread evenly at α = 0: "
       << yes(p0 < u0) << " (" << fmt("%.4f", p0) << " vs " << fmt("%.4f", u0) << "); at α = " << ha << " by more than a seed-sd: "
       << yes(u1.mean - p1.mean > std::max(u1.sd, p1.sd)) << " (" << fmt_stat(p1) << " vs " << fmt_stat(u1) << ")\n";
  }
}

/// The findings about one converted kv-head count: the paper's Fig. 4 and 5, and against from scratch.
void write_kv_findings(std::ostream& md, const Table& t, int64_t kv) {
  const SweepPlan& plan = t.plan;
  const SweepPreset& p = plan.preset;
  const double ha = p.headline_fraction;
  const std::string name = plan.kv_name(kv);
  const double mean = t.mean_losses(kv, ha).mean;
  const Variant first{&method("first")}, rnd{&method("random")};
  if (t.has(first) && t.has(rnd)) {
    const double lf = t.losses(kv, first, ha).mean, lr = t.losses(kv, rnd, ha).mean;
    md << "- " << name << ": mean pooling beats first head and random init (Fig. 4): " << yes(mean < lf && mean < lr)
       << " (" << fmt("%.4f", mean) << " vs " << fmt("%.4f", lf) << ", " << fmt("%.4f", lr) << ")\n";
  }
  if (plan.variants.size() > 1)
    for (double a : {0.0, ha}) {  // the best other conversion, at each α on its own
      const auto [best, best_loss] = best_variant(t, kv, a, false);
      const double m = t.mean_losses(kv, a).mean;
      md << "- " << name << ": the best conversion method beats mean pooling at α = " << a << ": " << yes(best_loss < m)
         << " (" << best << " " << fmt("%.4f", best_loss) << " vs mean " << fmt("%.4f", m) << ")\n";
    }
  if (p.scratch) {
    const auto [best, best_loss] = best_variant(t, kv, ha, true);
    const double scratch = t.of(plan.scratch(kv)).val_loss;
    md << "- " << name << ": an uptrained model matches one trained from scratch at equal compute (best conversion "
       << "at α = " << ha << " within 0.01 of it or better): " << yes(best_loss <= scratch + 0.01) << " (" << best << " "
       << fmt("%.4f", best_loss) << " vs from scratch " << fmt("%.4f", scratch) << ")\n";
  }
  write_per_layer_findings(md, t, kv);
  const double a0 = t.mean_losses(kv, 0).mean, a1 = t.mean_losses(kv, ha).mean, a2 = t.mean_losses(kv, p.fractions.back()).mean;
  md << "- " << name << ": uptraining with α = " << ha << " lowers the loss of the converted model (Fig. 5): "
     << yes(a1 < a0) << " (" << fmt("%.4f", a0) << " → " << fmt("%.4f", a1) << "); going to α = " << p.fractions.back()
     << " adds less than the first step did: " << yes(std::fabs(a1 - a2) < std::fabs(a0 - a1)) << " (→ " << fmt("%.4f", a2) << ")\n";
}

/// A decoding time as the findings quote it: the median, and the interquartile range when kept.
std::string fmt_time(const DecodeTime& d) {
  return fmt("%.2f", d.ms_per_sample) + (d.runs > 0 ? " [" + fmt("%.2f", d.sample_q1) + "–" + fmt("%.2f", d.sample_q3) + "]" : "");
}

/// How decoding time b compares with a: -1 faster, +1 slower, 0 not resolved (interquartile ranges
/// overlap). Times from before ranges were kept (runs 0) compare medians (a tie counts as faster);
/// medians_only says so.
int compare_times(const DecodeTime& a, const DecodeTime& b, bool& medians_only) {
  if (a.runs == 0 || b.runs == 0) {
    medians_only = true;
    return b.ms_per_sample > a.ms_per_sample ? 1 : -1;
  }
  return b.sample_q3 < a.sample_q1 ? -1 : b.sample_q1 > a.sample_q3 ? 1 : 0;
}

/// Whether each KV count decodes faster than the one above it: yes when every neighbouring pair's
/// ranges of per-sample times are apart with the smaller KV faster; no when a pair's are apart the
/// other way; otherwise not resolved (the spread does not order them). The ranges are interquartile
/// (a run the machine slowed down once does not decide it). Times from before ranges were kept
/// (runs 0) compare medians and say so. at picks the time (batch, context) from a cell's result.
std::string decode_falls(const Table& t, const std::function<const DecodeTime&(const CellResult&)>& at) {
  const std::vector<int64_t>& kvs = t.plan.kv_heads;
  std::string detail, verdict = "**yes**";
  bool medians_only = false;
  for (size_t i = 0; i < kvs.size(); i++) {
    const DecodeTime& d = at(t.costs(kvs[i]));
    detail += (i ? ", " : "") + t.plan.kv_name(kvs[i]) + " " + fmt_time(d);
    if (i == 0) continue;
    const int c = compare_times(at(t.costs(kvs[i - 1])), d, medians_only);
    if (c > 0) verdict = "**no**";
    else if (c == 0 && verdict == "**yes**") verdict = "not resolved (interquartile ranges overlap)";
  }
  return verdict + " (ms per sample, median [interquartile range]: " + detail + (medians_only ? "; medians only, no ranges recorded" : "") + ")";
}

/// The frontier across sizes (the paper's Table 1): does a converted model (its best conversion at
/// the headline α) have a lower loss than the smaller MHA model while decoding at least as fast at
/// the serving batch (faster, or interquartile ranges overlapping)?
std::string frontier(const Table& t, int64_t b) {
  const SweepPlan& plan = t.plan;
  const double ha = plan.preset.headline_fraction;
  const CellResult& sm = t.of(plan.smaller());
  const DecodeTime& ds = sm.decode.at(b);
  std::vector<std::string> winners;
  std::string detail;
  bool medians_only = false;
  for (int64_t kv : plan.kv_heads) {
    if (kv == plan.n_head) continue;
    const auto [best, loss] = best_variant(t, kv, ha, true);
    const DecodeTime& d = t.costs(kv).decode.at(b);
    const int c = compare_times(ds, d, medians_only);
    const bool better = loss < sm.val_loss;
    detail += "; " + plan.kv_name(kv) + " (" + best + ") " + fmt("%.4f", loss) + " at " + fmt_time(d) + ": " +
              (better ? "better" : "worse") + ", " + (c < 0 ? "faster" : c > 0 ? "slower" : "as fast within the spread");
    if (better && c <= 0) winners.push_back(plan.kv_name(kv));
  }
  std::string w;
  for (const std::string& x : winners) w += (w.empty() ? "" : ", ") + x;
  return std::string(winners.empty() ? "**no**" : "**yes**, " + w) + " (smaller MHA " + fmt("%.4f", sm.val_loss) + " at " +
         fmt_time(ds) + " ms per sample" + detail + (medians_only ? "; medians only, no ranges recorded" : "") + ")";
}

/// The paper's findings checked on these numbers: per kv-head count, GQA against MQA, decoding time.
void write_findings(std::ostream& md, const Table& t) {
  const SweepPlan& plan = t.plan;
  const std::vector<int64_t>& kvs = plan.kv_heads;
  const double ha = plan.preset.headline_fraction, pre = t.of(plan.pretrain()).val_loss;
  const int64_t b_hi = plan.preset.decode_batches.back();
  md << "\n## The paper's findings, checked here\n\n";
  for (int64_t kv : kvs)
    if (kv != plan.n_head) write_kv_findings(md, t, kv);
  if (kvs.size() >= 3) {
    const int64_t g = kvs[1];
    const double gap_g0 = t.mean_losses(g, 0).mean - pre, gap_m0 = t.mean_losses(1, 0).mean - pre;
    md << "- At α = 0 the converted " << plan.kv_name(g) << " loses less than MQA (GQA is usable before uptraining, Fig. 5): "
       << yes(gap_g0 < gap_m0) << " (+" << fmt("%.4f", gap_g0) << " vs +" << fmt("%.4f", gap_m0) << " over MHA)\n";
    const double mha = t.mean_losses(plan.n_head, ha).mean, gq = t.mean_losses(g, ha).mean, mq = t.mean_losses(1, ha).mean;
    md << "- After uptraining, " << plan.kv_name(g) << " sits between MQA and MHA in quality (Table 1): "
       << yes(gq <= mq && gq >= mha - 0.01) << " (MHA " << fmt("%.4f", mha) << ", " << plan.kv_name(g) << " "
       << fmt("%.4f", gq) << ", MQA " << fmt("%.4f", mq) << ")\n";
  }
  md << "- Decoding time per sample falls as KV heads are removed (batch " << b_hi << ", Fig. 6): "
     << decode_falls(t, [&](const CellResult& r) -> const DecodeTime& { return r.decode.at(b_hi); }) << "\n";
  const int64_t L = t.costs(plan.n_head).decode_long_context;
  if (L > 0)
    md << "- ... and at 4 × the trained context (" << L << " tokens, batch " << b_hi << "; speed only): "
       << decode_falls(t, [&](const CellResult& r) -> const DecodeTime& { return r.decode_long.at(b_hi); }) << "\n";
  if (plan.preset.smaller)
    md << "- A converted model beats the smaller MHA model at equal or lower decoding time (batch " << b_hi
       << "; the frontier across sizes, Table 1): " << frontier(t, b_hi) << "\n";
}

/// a − b seed by seed, over the seeds both have.
Stat paired(const std::map<int, double>& a, const std::map<int, double>& b) {
  std::vector<double> d;
  for (const auto& [seed, x] : a)
    if (b.count(seed)) d.push_back(x - b.at(seed));
  return stat(d);
}

/// "+0.0123 ± 0.0040" (a paired difference; its sd when over more than one seed).
std::string fmt_diff(const Stat& s) {
  if (s.n == 0) return "–";
  return fmt("%+.4f", s.mean) + (s.n > 1 ? " ± " + fmt("%.4f", s.sd) : "");
}

/// The distilled variant with the lowest mean loss at kv heads (MHA: its own row).
std::pair<Variant, double> best_distilled(const Table& t, int64_t kv) {
  const double ha = t.plan.preset.headline_fraction;
  if (kv == t.plan.n_head) return {Variant{}, t.losses(kv, Variant{}, ha, true).mean};
  std::pair<Variant, double> best{Variant{}, INFINITY};
  for (const Variant& v : t.plan.distill_variants)
    if (t.losses(kv, v, ha, true).mean < best.second) best = {v, t.losses(kv, v, ha, true).mean};
  return best;
}

/// Distillation from the MHA model (sweep --distill): each distilled conversion beside the same
/// conversion uptrained plainly, paired by seed, and its gap to the MHA model treated alike; the
/// models from scratch at the distilled rows' compute; whether GQA/MQA come within one seed-sd of MHA.
void write_distillation(std::ostream& md, const Table& t) {
  const SweepPlan& plan = t.plan;
  const SweepPreset& p = plan.preset;
  const double ha = p.headline_fraction;
  const int64_t H = plan.n_head;
  md << "\n## Distillation — uptraining with the MHA model as teacher (α = " << ha << ", λ = " << p.distill_lambda << ", T = "
     << p.distill_temperature << ")\n\n"
     << "Each distilled model is uptrained like its plain row (same conversion, steps, batches and seeds) with the loss (1 − λ)·CE + "
        "λ·T²·KL(teacher ‖ model), the teacher being the pretrained MHA model (docs/guide/uptraining.md). A distilled step also "
        "runs the teacher's forward, about a third of a training step, so it costs "
     << fmt("%.2f", kDistilledStepCost) << " plain steps: at equal compute stand the MHA model uptrained and distilled alike (same "
        "steps, same teacher) and the models from scratch trained "
     << plan.distill_scratch_steps << " steps (1 + " << fmt("%.2f", kDistilledStepCost) << " α of " << plan.pretrain_steps
     << "). Differences are paired by seed (mean ± sd).\n\n"
     << "| KV heads | method | plain | distilled | distilled − plain | − MHA plain | − MHA distilled (equal compute) |\n"
     << "|---|---|---|---|---|---|---|\n";
  const auto mha_plain = t.by_seed(H, Variant{}, ha), mha_kd = t.by_seed(H, Variant{}, ha, true);
  for (int64_t kv : plan.kv_heads)
    for (const Variant& v : kv == H ? std::vector<Variant>{Variant{}} : plan.distill_variants) {
      const auto plain = t.by_seed(kv, v, ha), kd = t.by_seed(kv, v, ha, true);
      md << "| " << plan.kv_name(kv) << " | " << (kv == H ? "–" : v.name()) << " | " << fmt_stat(t.losses(kv, v, ha)) << " | "
         << fmt_stat(t.losses(kv, v, ha, true)) << " | " << fmt_diff(paired(kd, plain)) << " | "
         << (kv == H ? "–" : fmt_diff(paired(plain, mha_plain))) << " | " << (kv == H ? "–" : fmt_diff(paired(kd, mha_kd))) << " |\n";
    }
  if (p.scratch) {
    md << "\nFrom scratch (one seed): ";
    for (int64_t kv : plan.kv_heads)
      if (kv < H)
        md << (kv == plan.kv_heads[1] ? "" : "; ") << plan.kv_name(kv) << " " << fmt("%.4f", t.of(plan.scratch(kv)).val_loss) << " at "
           << plan.scratch_steps << " steps, " << fmt("%.4f", t.of(plan.scratch(kv, true)).val_loss) << " at "
           << plan.distill_scratch_steps;
    md << ".\n";
  }
  md << "\n";
  const Stat mha = t.losses(H, Variant{}, ha, true);
  for (int64_t kv : plan.kv_heads) {
    if (kv == H) continue;
    const auto [v, loss] = best_distilled(t, kv);
    md << "- " << plan.kv_name(kv) << " distilled (" << v.name() << ") within one seed-sd of MHA distilled alike (equal compute): "
       << yes(loss <= mha.mean + mha.sd) << " (" << fmt("%.4f", loss) << " vs " << fmt_stat(mha) << "; plain " << v.name() << " "
       << fmt("%.4f", t.losses(kv, v, ha).mean) << ")";
    if (p.scratch) {
      const double sc = t.of(plan.scratch(kv, true)).val_loss;
      md << "; matches the model from scratch at equal compute (within 0.01 or better): " << yes(loss <= sc + 0.01) << " (vs "
         << fmt("%.4f", sc) << ")";
    }
    md << "\n";
  }
}

/// Partial uptraining (sweep --train): each KV count's conversion uptrained training only some
/// parameters, beside the same conversion uptrained whole, paired by seed, and the share of its
/// recovery kept.
void write_partial(std::ostream& md, const Table& t) {
  const SweepPlan& plan = t.plan;
  const SweepPreset& p = plan.preset;
  const double ha = p.headline_fraction;
  const Variant& v = plan.partial_variant;
  md << "\n## Partial uptraining — only the attention, or only K and V, trained (α = " << ha << ", " << v.name() << ")\n\n"
     << "Each row is uptrained like the plain row of the same conversion (same steps, batches and seeds), training only "
        "the attention projections (`attention`: q, k, v and output) or only the key and value projections the conversion made "
        "(`kv`); the other parameters stay as converted, with no gradient and no optimizer state (docs/guide/uptraining.md). "
        "− all is paired by seed; kept = (converted − this) / (converted − all), the share of full uptraining's recovery, seed by "
        "seed (mean ± sd).\n\n"
     << "| KV heads | trains | val loss | − all | kept |\n|---|---|---|---|---|\n";
  for (int64_t kv : plan.kv_heads) {
    if (kv == plan.n_head) continue;
    const auto all = t.by_seed(kv, v, ha);
    md << "| " << plan.kv_name(kv) << " | all | " << fmt_stat(t.losses(kv, v, ha)) << " | – | 1 |\n";
    for (const Trainable tr : p.partial) {
      const auto part = t.by_seed(kv, v, ha, false, tr);
      std::vector<double> kept, losses;
      for (const auto& [seed, loss] : part) {
        losses.push_back(loss);
        const auto before = t.of(plan.find(CellKind::convert, kv, v, ha, seed)).loss_before;
        if (all.count(seed) && before && *before != all.at(seed)) kept.push_back((*before - loss) / (*before - all.at(seed)));
      }
      const Stat k = stat(kept);
      md << "| " << plan.kv_name(kv) << " | " << to_string(tr) << " | " << fmt_stat(stat(losses)) << " | " << fmt_diff(paired(part, all))
         << " | " << (k.n == 0 ? "–" : fmt("%.2f", k.mean) + (k.n > 1 ? " ± " + fmt("%.2f", k.sd) : "")) << " |\n";
    }
  }
}

/// Bytes per token as a whole number, or with one decimal when they are not one.
std::string bytes_str(double b) { return fmt(b == std::floor(b) ? "%.0f" : "%.1f", b); }

/// One point of the study in bytes per token: a KV count's best conversion at the headline α (MHA:
/// its uptrained row) with the cache stored as one type.
struct KvPoint {
  int64_t kv;
  std::string type, label;  // "f32", "f16", "q8"; "GQA-2 f16"
  double bytes;             // KV cache per token
  Stat loss;                // over seeds
};

/// Every (KV count, cache type) the cells measured; empty for sweeps from before the cache types.
std::vector<KvPoint> kv_points(const Table& t) {
  const SweepPlan& plan = t.plan;
  const double ha = plan.preset.headline_fraction;
  std::vector<KvPoint> out;
  for (int64_t kv : plan.kv_heads) {
    const std::string best = kv < plan.n_head ? best_variant(t, kv, ha, true).first : Variant{}.name();
    const double f32_bytes = static_cast<double>(t.costs(kv).kv_cache_bytes_per_token);
    // f16 and bf16 halve the bytes; q8 keeps 34 bytes per 32 values of 4
    for (auto [type, scale] : {std::pair{"f32", 1.0}, {"f16", 0.5}, {"q8", 34.0 / 128.0}}) {
      std::vector<double> losses;
      for (const CellResult& r : t.results)
        if (r.cell.kind == CellKind::convert && !r.cell.distill && r.cell.trainable == Trainable::all && r.cell.kv == kv &&
            r.cell.variant.name() == best && std::fabs(r.cell.alpha - ha) < 1e-12) {
          if (std::string(type) == "f32") losses.push_back(r.val_loss);
          else if (r.val_loss_kv.count(type)) losses.push_back(r.val_loss_kv.at(type));
        }
      if (!losses.empty()) out.push_back({kv, type, plan.kv_name(kv) + " " + type, f32_bytes * scale, stat(losses)});
    }
  }
  return out;
}

/// The study's other way to shrink the cache: its precision beside its head count, on one axis.
void write_kv_bytes(std::ostream& md, const Table& t) {
  std::vector<KvPoint> pts = kv_points(t);
  if (std::none_of(pts.begin(), pts.end(), [](const KvPoint& p) { return p.type != "f32"; })) return;
  const SweepPlan& plan = t.plan;
  md << "\n## KV-cache bytes per token — head count and precision (α = " << plan.preset.headline_fraction
     << ", each count's best conversion)\n\n"
     << "The val loss with K and V rounded as the cache would store them: f16 (half the bytes) and q8 (q8_0 blocks of 32 "
        "along each head: 34 bytes per 32 values), beside f32; a forward that rounds K and V gives what decoding with that "
        "cache gives (tests/nn/test_nn.cpp).\n\n| KV heads | f32 | f16 | q8 |\n|---|---|---|---|\n";
  for (int64_t kv : plan.kv_heads) {
    md << "| " << plan.kv_name(kv);
    for (const char* type : {"f32", "f16", "q8"}) {
      auto it = std::find_if(pts.begin(), pts.end(), [&](const KvPoint& p) { return p.kv == kv && p.type == type; });
      md << " | " << (it == pts.end() ? "–" : bytes_str(it->bytes) + " B: " + fmt_stat(it->loss));
    }
    md << " |\n";
  }
  // the best configuration within each budget: the frontier, cheapest first
  std::sort(pts.begin(), pts.end(), [](const KvPoint& a, const KvPoint& b) {
    return a.bytes != b.bytes ? a.bytes < b.bytes : a.loss.mean < b.loss.mean;
  });
  md << "\nBest at each budget (the lowest loss within that many bytes per token):";
  double best = INFINITY;
  const char* sep = " ";
  for (const KvPoint& p : pts)
    if (p.loss.mean < best) {
      best = p.loss.mean;
      md << sep << bytes_str(p.bytes) << " B: " << p.label << " (" << fmt("%.4f", p.loss.mean) << ")";
      sep = "; ";
    }
  md << ".\n\n";
  for (size_t i = 0; i + 1 < pts.size(); i++)
    for (size_t j = i + 1; j < pts.size() && pts[j].bytes == pts[i].bytes; j++) {
      const KvPoint &a = pts[i], &b = pts[j];  // a has the lower loss
      const double sd = std::max(a.loss.sd, b.loss.sd);
      md << "- Same bytes (" << bytes_str(a.bytes) << " per token): " << a.label << " " << fmt("%.4f", a.loss.mean) << " against "
         << b.label << " " << fmt("%.4f", b.loss.mean) << ": " << a.label
         << (b.loss.mean - a.loss.mean > sd ? " better by more than a seed-sd" : " no better than a seed-sd (not resolved)") << "\n";
    }
}

}  // namespace

void write_report_md(std::ostream& md, const SweepPlan& plan, const std::vector<CellResult>& results,
                     const ReportContext& ctx) {
  const Table t{plan, results};
  write_header(md, plan, t, ctx);
  write_table1(md, t);
  write_method_tables(md, t);
  write_alpha_table(md, t);
  write_findings(md, t);
  if (plan.distills()) write_distillation(md, t);
  if (plan.partial()) write_partial(md, t);
  write_kv_bytes(md, t);
  md << "\nPlots: `fig_tradeoff.png` (val loss against decode time per sample, Fig. 1/6), `fig_alpha.png` (Fig. 5), "
        "`fig_methods.png` (Fig. 4)"
     << (kv_points(t).size() > plan.kv_heads.size() ? ", `fig_kvbytes.png` (val loss against KV-cache bytes per token)" : "")
     << ". Every cell: `results.csv`.\n";
}

namespace {

// The best conversion's method of every GQA/MQA count, each once: "aligned-fit" or "fit, aligned-fit".
std::string best_methods(const Table& t) {
  std::vector<std::string> names;
  for (int64_t kv : t.plan.kv_heads)
    if (kv < t.plan.n_head) {
      const std::string b = best_variant(t, kv, t.plan.preset.headline_fraction, true).first;
      if (std::find(names.begin(), names.end(), b) == names.end()) names.push_back(b);
    }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The data files the plots read.
struct PlotFiles {
  fs::path tradeoff, alpha, methods, smaller, kvbytes;
  explicit PlotFiles(const fs::path& out)
      : tradeoff(out / "tradeoff.dat"), alpha(out / "alpha.dat"), methods(out / "methods.dat"), smaller(out / "smaller.dat"),
        kvbytes(out / "kvbytes.dat") {}
};

// Val loss against KV-cache bytes per token: one series per cache type (gnuplot data blocks split
// by two blank lines), each point labelled with its KV count.
void kvbytes_plot(std::ostream& gp, const PlotFiles& files, const Table& t, const fs::path& png) {
  const std::vector<KvPoint> pts = kv_points(t);
  std::ofstream f(files.kvbytes);
  std::vector<std::string> types;  // the cache types measured, one data block each
  for (const char* type : {"f32", "f16", "q8"}) {
    if (std::none_of(pts.begin(), pts.end(), [&](const KvPoint& p) { return p.type == type; })) continue;
    types.push_back(type);
    for (const KvPoint& p : pts)
      if (p.type == type) f << p.bytes << " " << p.loss.mean << " " << t.plan.kv_name(p.kv) << "\n";
    f << "\n\n";
  }
  gp << "set terminal pngcairo size 1000,640 font 'sans,11'\nset output " << gp_quote(png.string()) << "\n"
     << "set title 'Quality vs KV-cache bytes per token (alpha = " << t.plan.preset.headline_fraction << ", best conversion)'\n"
     << "set xlabel 'KV-cache bytes per token'\nset ylabel 'val loss (nats/token)'\nset logscale x 2\nset key top right\n"
     << "set offsets graph 0.05, graph 0.05, graph 0.08, graph 0.08\nplot ";
  for (size_t i = 0; i < types.size(); i++)
    gp << (i ? ", " : "") << gp_quote(files.kvbytes.string()) << " index " << i << " using 1:2 with linespoints lw 2 pt 7 ps 1.3 title '"
       << types[i] << " cache', '' index " << i << " using 1:2:3 with labels offset 0,1 font ',9' notitle";
  gp << "\nunset offsets\nunset logscale x\n";
}

void write_plot_data(const PlotFiles& files, const Table& t) {
  const SweepPlan& plan = t.plan;
  const SweepPreset& p = plan.preset;
  const double ha = p.headline_fraction;
  std::ofstream f(files.tradeoff);
  // columns: decode ms/sample at the smallest and largest batch, mean pooling's loss, the KV
  // name, the best conversion's loss and its label (MHA: mean pooling's own row): the KV name,
  // with the method when the best method differs between KV counts (the key names a single one)
  const std::string single = best_methods(t);
  for (int64_t kv : plan.kv_heads) {
    const auto [best, best_loss] =
        kv < plan.n_head ? best_variant(t, kv, ha, true) : std::make_pair(std::string("mean"), t.mean_losses(kv, ha).mean);
    f << t.ms_per_sample(kv, p.decode_batches.front()) << " " << t.ms_per_sample(kv, p.decode_batches.back()) << " "
      << t.mean_losses(kv, ha).mean << " " << plan.kv_name(kv) << " " << best_loss << " "
      << plan.kv_name(kv) << (single.find(',') == std::string::npos ? "" : ":" + best);
    if (plan.distills()) f << " " << best_distilled(t, kv).second;  // column 7
    f << "\n";
  }
  if (p.smaller) {
    const CellResult& sm = t.of(plan.smaller());
    std::ofstream sf(files.smaller);
    sf << sm.decode.at(p.decode_batches.front()).ms_per_sample << " " << sm.decode.at(p.decode_batches.back()).ms_per_sample << " "
       << sm.val_loss << " smaller-MHA\n";
  }
  std::ofstream a(files.alpha);
  for (double al : p.fractions) {
    a << al;
    for (int64_t kv : plan.kv_heads) a << " " << t.mean_losses(kv, al).mean;
    a << "\n";
  }
  std::ofstream m(files.methods);
  m << "kv";
  for (const Variant& v : plan.variants) m << " " << v.name();
  m << "\n";
  for (int64_t kv : plan.kv_heads)
    if (kv < plan.n_head) {
      m << plan.kv_name(kv);
      for (const Variant& v : plan.variants) m << " " << t.losses(kv, v, ha).mean;
      m << "\n";
    }
}

// Quality against decoding time: mean pooling at the smallest and the largest batch, the best
// conversion at the largest, each point of it labelled with its method; the key below the frame.
void tradeoff_script(std::ostream& gp, const PlotFiles& files, const Table& t, const fs::path& png) {
  const SweepPreset& p = t.plan.preset;
  gp << "set terminal pngcairo size 1000,640 font 'sans,11'\nset grid\nset output " << gp_quote(png.string()) << "\n";
  gp << "set title 'Quality vs decoding time (uptrained, alpha = " << p.headline_fraction << ")'\n"
     << "set xlabel 'decode time per sample (ms)'\nset ylabel 'val loss (nats/token)'\nset logscale x\n"
     << "set key below horizontal\nset offsets graph 0.08, graph 0.08, graph 0.1, graph 0.1\n";
  const std::string td = gp_quote(files.tradeoff.string());
  // mean pooling's labels above its batch-1 points and right of its large-batch ones; the best
  // conversion's (which sit below the large-batch curve, close together) left of its points,
  // alternately below and above them, so that neighbours' labels do not overlap
  gp << "plot " << td << " using 1:3 with linespoints pt 7 ps 1.5 title 'mean pooling, batch " << p.decode_batches.front() << "', "
     << "'' using 1:3:4 with labels offset 0,1.2 notitle, "
     << "'' using 2:3 with linespoints pt 5 ps 1.5 title 'mean pooling, batch " << p.decode_batches.back() << "', "
     << "'' using 2:3:4 with labels left offset 1.2,0 notitle, "
     << "'' every ::1 using 2:5 with linespoints dt 2 lw 2 lc rgb '#c0392b' pt 9 ps 1.5 title 'best conversion (" << best_methods(t)
     << "), batch " << p.decode_batches.back() << "', '' every 2::1 using 2:5:6 with labels right offset -1.2,-0.8 font ',9' tc rgb '#c0392b' notitle"
     << ", '' every 2::2 using 2:5:6 with labels right offset -1.2,0.8 font ',9' tc rgb '#c0392b' notitle";
  if (t.plan.distills())
    gp << ", '' using 2:7 with linespoints dt 3 lw 2 lc rgb '#8e44ad' pt 11 ps 1.5 title 'best conversion distilled (lambda "
       << p.distill_lambda << ", T " << p.distill_temperature << "), batch " << p.decode_batches.back() << "'";
  if (p.smaller)
    gp << ", " << gp_quote(files.smaller.string()) << " using 1:3 with points pt 6 ps 2 lw 2 lc rgb '#2e8b57' title 'smaller MHA, batch "
       << p.decode_batches.front() << "', '' using 2:3 with points pt 7 ps 2 lc rgb '#2e8b57' title 'smaller MHA, batch "
       << p.decode_batches.back() << "', '' using 2:3:4 with labels offset 0,-1.2 font ',9' notitle";
  gp << "\nunset offsets\n";
}

void alpha_script(std::ostream& gp, const PlotFiles& files, const SweepPlan& plan, const fs::path& png) {
  gp << "unset logscale x\nset key inside top right vertical\nset output " << gp_quote(png.string()) << "\n";
  gp << "set title 'Uptraining proportion (mean pooling)'\nset xlabel 'alpha (fraction of pretraining steps)'\nplot ";
  for (size_t i = 0; i < plan.kv_heads.size(); i++)
    gp << (i ? ", " : "") << gp_quote(files.alpha.string()) << " using 1:" << i + 2 << " with linespoints lw 2 pt 7 title '"
       << plan.kv_name(plan.kv_heads[i]) << "'";
  gp << "\n";
}

// One colour per method, whatever its grouping; the similar grouping hatched. The key stands
// outside the bars: a study of every method has up to 13 of them per cluster.
void methods_script(std::ostream& gp, const PlotFiles& files, const SweepPlan& plan, const fs::path& png) {
  static const char* const colours[] = {"#7f3fbf", "#2a9d8f", "#8ecae6", "#e9a23b", "#d4c22a", "#2f6fb0", "#d7301f", "#555555"};
  const SweepPreset& p = plan.preset;
  gp << "set output " << gp_quote(png.string()) << "\nset terminal pngcairo size 1100,560 font 'sans,11'\n";
  gp << "set title 'Conversion methods after uptraining (alpha = " << p.headline_fraction << ")'\nset xlabel ''\n"
     << "set style data histograms\nset style histogram clustered gap 1\nset key outside right top\nset yrange [*:*]\nplot ";
  for (size_t i = 0; i < plan.variants.size(); i++) {
    const Variant& v = plan.variants[i];
    const size_t c = static_cast<size_t>(std::find(p.methods.begin(), p.methods.end(), v.method->name) - p.methods.begin());
    gp << (i ? ", " : "") << gp_quote(files.methods.string()) << " using " << i + 2 << (i ? "" : ":xtic(1)")
       << " title columnheader lc rgb '" << colours[c % std::size(colours)] << "' fill "
       << (v.grouping == Grouping::Contiguous ? "solid 0.85" : "pattern 4") << " border -1";
  }
  gp << "\n";
}

}  // namespace

void write_plots(const std::string& out_dir, const SweepPlan& plan, const std::vector<CellResult>& results) {
  const Table t{plan, results};
  const fs::path out(out_dir);
  const ScratchDir d;  // the data files and images, until each image is put in place
  const PlotFiles files(d.path());
  write_plot_data(files, t);
  std::ostringstream gp;
  std::vector<std::pair<fs::path, fs::path>> images;
  for (const char* name : {"fig_tradeoff.png", "fig_alpha.png", "fig_methods.png", "fig_kvbytes.png"}) images.emplace_back(d / name, out / name);
  tradeoff_script(gp, files, t, images[0].first);
  alpha_script(gp, files, plan, images[1].first);
  methods_script(gp, files, plan, images[2].first);
  if (kv_points(t).size() > plan.kv_heads.size()) kvbytes_plot(gp, files, t, images[3].first);
  run_gnuplot(gp.str());
  place_images(images);
}

}  // namespace tapelm
