// The trade-off study: its plan (cells and their names), the cell files a re-run resumes from, the
// report written from hand-made results, and a whole micro sweep through the CLI.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "train/formats/checkpoint.h"
#include "train/formats/hf.h"
#include "train/study/plot.h"
#include "train/run_dir.h"
#include "train/study/sweep/plan.h"
#include "train/study/sweep/report.h"
#include "train/study/sweep/results.h"
#include "test_util.h"
#include "train/train_config.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

namespace {

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

/// The micro preset with the methods the hand-made results cover.
SweepPreset hand_preset() {
  SweepPreset p = sweep_preset("micro");
  p.methods = {"mean", "first", "random", "fit"};
  return p;
}

/// Val losses chosen by hand: mean pooling beats first head for GQA-2, first head wins for MQA, fit
/// beats both; seed s adds 0.01·(s−1).
double hand_loss(const Cell& c) {
  if (c.kind == CellKind::pretrain) return 3.0;
  if (c.kind == CellKind::smaller) return 3.2;
  if (c.kind == CellKind::scratch) return (c.kv == 2 ? 3.15 : 3.4) - (c.distill ? 0.01 : 0);
  static const std::map<std::pair<int64_t, std::string>, std::vector<double>> by_alpha = {
      {{4, "mean"}, {3.0, 2.9, 2.85}},  {{2, "mean"}, {3.2, 3.1, 3.05}},  {{2, "first"}, {3.4, 3.3, 3.2}},
      {{2, "random"}, {4.0, 3.6, 3.5}}, {{1, "mean"}, {3.5, 3.3, 3.25}},  {{1, "first"}, {3.3, 3.2, 3.1}},
      {{1, "random"}, {4.2, 3.8, 3.7}}, {{2, "fit"}, {3.1, 3.05, 0}},     {{1, "fit"}, {3.25, 3.15, 0}}};
  const size_t i = c.alpha == 0 ? 0 : c.alpha < 0.07 ? 1 : 2;
  if (c.variant.grouping == Grouping::PerLayer) {  // heads per layer: 0.05 better at α = 0, 0.02 after uptraining
    Cell uniform = c;
    uniform.variant.grouping = Grouping::Contiguous;
    return hand_loss(uniform) - (c.alpha == 0 ? 0.05 : 0.02);
  }
  // distilled (α = 0.05): MHA gains 0.02; the converted models 0.16, seed 3 a further 0.03
  const double kd = !c.distill ? 0 : c.kv == 4 ? 0.02 : 0.16 + (c.seed == 3 ? 0.03 : 0);
  // uptrained in part: the attention alone 0.01 lower, K and V alone 0.02 higher
  const double part = c.trainable == Trainable::attention ? -0.01 : c.trainable == Trainable::kv ? 0.02 : 0;
  return by_alpha.at({c.kv, c.method_name()})[i] + 0.01 * (c.seed - 1) - kd + part;
}

/// Every cell of the micro plan with hand_loss and, per KV, hand-picked costs and decoding times.
/// (Decoding at batch 4: median and interquartile range of ms per sample over 5 runs; MQA's and the
/// smaller MHA model's as given.)
std::vector<CellResult> hand_results(const SweepPlan& plan, DecodeTime mqa_b4 = {1.25, 5.0, 4.8, 5.2, 5},
                                     DecodeTime smaller_b4 = {1.5, 6.0, 5.7, 6.3, 5}) {
  const std::map<int64_t, int64_t> params = {{4, 3872}, {2, 3616}, {1, 3488}}, cache = {{4, 128}, {2, 64}, {1, 32}};
  const std::map<int64_t, DecodeTimes> decode = {{4, {{1, {1.5, 24.0}}, {4, {2.5, 10.0, 9.5, 10.5, 5}}}},
                                                 {2, {{1, {1.25, 20.0}}, {4, {1.625, 6.5, 6.2, 6.8, 5}}}},
                                                 {1, {{1, {1.0, 16.0}}, {4, mqa_b4}}}};
  std::vector<CellResult> rs;
  for (const Cell& c : plan.cells) {
    CellResult r;
    r.cell = c;
    r.schedule = c.kind == CellKind::convert ? "rewarm" : "cosine";
    r.val_loss = hand_loss(c);
    r.perplexity = std::exp(r.val_loss);
    r.params = params.at(c.kv);
    r.kv_cache_bytes_per_token = cache.at(c.kv);
    r.decode = decode.at(c.kv);
    if (c.kind == CellKind::smaller) {
      r.params = 1100;
      r.kv_cache_bytes_per_token = 64;
      r.decode = {{1, {1.25, 15.0}}, {4, smaller_b4}};
    }
    if (c.kind == CellKind::convert) r.convert_seconds = c.method_name() == "fit" ? 0.25 : 0.002;
    if (c.kind == CellKind::convert) r.val_loss_kv = {{"f16", r.val_loss + 0.001}, {"q8", r.val_loss + 0.02}};
    rs.push_back(r);
  }
  return rs;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sweep)

// ---- the plan -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(kv_heads_halve_down_to_one) {
  BOOST_TEST(sweep_kv_heads(8) == (std::vector<int64_t>{8, 4, 2, 1}), tt::per_element());
  BOOST_TEST(sweep_kv_heads(4) == (std::vector<int64_t>{4, 2, 1}), tt::per_element());
  BOOST_TEST(sweep_kv_heads(12) == (std::vector<int64_t>{12, 6, 3, 1}), tt::per_element());
  BOOST_TEST(sweep_kv_heads(6) == (std::vector<int64_t>{6, 3, 1}), tt::per_element());
  BOOST_TEST(sweep_kv_heads(5) == (std::vector<int64_t>{5, 1}), tt::per_element());
  BOOST_TEST(sweep_kv_heads(1) == (std::vector<int64_t>{1}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(plan_cells_and_ids) {
  const SweepPlan micro(sweep_preset("micro"));
  // pretrain + KV 4 (mean only: 3 α, 3 seeds of the headline α) + KV {2, 1} × (mean's 5 cells + 6
  // more methods at α = 0 and the headline α with 3 seeds) + from scratch KV 2 and 1 + the smaller MHA
  BOOST_TEST(micro.cells.size() == 1u + 5 + 2 * (5 + 6 * 4) + 2 + 1);
  BOOST_TEST(micro.cells.back().id() == "pretrain_mha_smaller");
  BOOST_TEST((micro.smaller() == Cell{CellKind::smaller, 4, {}, 0, 1, 20}));
  BOOST_TEST(micro.smaller().method_name() == "smaller");
  BOOST_TEST((parse_cell_kind("smaller") == CellKind::smaller));
  // the smaller model: half the width (and MLP) of the study's, the same depth, heads and recipe
  const TrainConfig st = micro.train_config_for(micro.smaller());
  BOOST_TEST(st.model.n_embd == 8);
  BOOST_TEST(st.model.mlp_hidden == 32);
  BOOST_TEST(st.model.n_head == 4);
  BOOST_TEST(st.model.n_kv_head == 4);
  BOOST_TEST(st.model.n_layer == 1);
  BOOST_TEST(st.max_iters == 20);
  BOOST_TEST(st.seed == micro.train_config_for(micro.pretrain()).seed);
  BOOST_TEST(micro.model_for(micro.pretrain()).n_embd == 16);
  {  // a width the halving cannot split into whole heads is refused, as is --from with a smaller model
    SweepPreset odd = sweep_preset("micro");
    odd.pretrain.model.n_embd = 12;  // 6 over 4 heads
    expect_throw([&] { SweepPlan x(odd); }, ErrorKind::usage, {"halves n_embd 12"});
    SweepPreset rope = sweep_preset("micro");
    rope.pretrain.model.pos = PosKind::Rope;
    rope.pretrain.model.n_embd = 24;  // 12 over 4 heads: 3, odd for RoPE's pairs
    expect_throw([&] { SweepPlan x(rope); }, ErrorKind::usage, {"even"});
  }
  std::vector<std::string> names;
  for (const Variant& v : micro.variants) names.push_back(v.name());
  BOOST_TEST(names == method_names(), tt::per_element());
  BOOST_TEST(micro.kv_heads == (std::vector<int64_t>{4, 2, 1}), tt::per_element());
  BOOST_TEST(micro.pretrain().id() == "pretrain_mha");
  BOOST_TEST(micro.pretrain().steps == 20);
  BOOST_TEST(micro.scratch_steps == 21);  // 20 × 1.05
  std::set<std::string> ids;
  for (const Cell& c : micro.cells) ids.insert(c.id());
  BOOST_TEST(ids.size() == micro.cells.size());
  // the names of existing sweep directories' files
  for (const char* id : {"kv4_mean_a0_s1", "kv4_mean_a0.05_s3", "kv2_mean_a0.1_s1", "kv1_random_a0_s1",
                         "kv1_mean_a0.05_s2", "scratch_kv2_s1", "scratch_kv1_s1", "kv2_first_a0.05_s2",
                         "kv1_mean-norm_a0.05_s3", "kv2_aligned_a0_s1", "kv1_fit_a0.05_s1",
                         "kv2_aligned-fit_a0.05_s3"})
    BOOST_TEST(ids.count(id) == 1u, id);
  BOOST_TEST(ids.count("kv4_first_a0_s1") == 0u);  // converting MHA to MHA: mean only
  BOOST_TEST(ids.count("kv2_first_a0.1_s1") == 0u);  // α beyond the headline: mean only
  const Cell& c = micro.find(CellKind::convert, 1, Variant::parse("mean"), 0.05, 2);
  BOOST_TEST(c.id() == "kv1_mean_a0.05_s2");
  BOOST_TEST(c.steps == 1);  // 0.05 × 20
  BOOST_TEST(micro.find(CellKind::convert, 2, Variant::parse("mean"), 0.1).steps == 2);
  BOOST_TEST(micro.scratch(1).id() == "scratch_kv1_s1");
  BOOST_CHECK_EXCEPTION(micro.find(CellKind::convert, 3, Variant::parse("mean"), 0), Error, test::is_kind(ErrorKind::internal));
  BOOST_TEST(micro.kv_name(4) == "MHA");
  BOOST_TEST(micro.kv_name(2) == "GQA-2");
  BOOST_TEST(micro.kv_name(1) == "MQA");
  // eight query heads: KV 8, 4, 2, 1
  const SweepPlan small(sweep_preset("small"));
  BOOST_TEST(small.cells.size() == 1u + 5 + 3 * 29 + 3 + 1);
  // about a quarter of the parameters (d 256 → 128), as the frontier across sizes asks
  BOOST_TEST(small.model_for(small.smaller()).n_embd == 128);
  BOOST_TEST(small.preset.decode_batches.back() == 16);  // the serving batch
  BOOST_TEST(!sweep_preset("tiny").smaller);
  BOOST_CHECK_EXCEPTION(sweep_preset("huge"), Error, test::is_kind(ErrorKind::usage));
  // groupings: every method but random once more with similar groups, named method+grouping
  SweepPreset p = sweep_preset("micro");
  p.methods = {"mean", "random", "fit"};
  p.groupings = {"contiguous", "similar"};
  const SweepPlan g(p);
  std::vector<std::string> gnames;
  for (const Variant& v : g.variants) gnames.push_back(v.name());
  BOOST_TEST(gnames == (std::vector<std::string>{"mean", "random", "fit", "mean+similar", "fit+similar"}), tt::per_element());
  const Cell& fs3 = g.find(CellKind::convert, 1, Variant::parse("fit+similar"), 0.05, 3);
  BOOST_TEST(fs3.id() == "kv1_fit+similar_a0.05_s3");
  BOOST_TEST(fs3.method_name() == "fit+similar");
  BOOST_TEST((fs3.variant == Variant{&method("fit"), Grouping::Similar}));
  // the one place that sets a cell's kv heads, steps and seed
  const UptrainOptions uo = g.uptrain_options_for(fs3);
  BOOST_TEST(uo.kv_heads == 1);
  BOOST_TEST(uo.seed == 3u);
  BOOST_TEST(uo.fraction == 0.05);
  BOOST_TEST(uo.calib_tokens == p.calib_tokens);
  BOOST_TEST((uo.variant == fs3.variant));
  const TrainConfig sc = g.train_config_for(g.scratch(2));
  BOOST_TEST(sc.model.n_kv_head == 2);
  BOOST_TEST(sc.max_iters == 21);
  BOOST_TEST(sc.lr_decay_iters == 21);
  BOOST_TEST(sc.seed == p.pretrain.seed + 2000);  // from scratch: its own init and batches
  BOOST_TEST(g.train_config_for(g.pretrain()).seed == p.pretrain.seed);
  BOOST_TEST(g.train_config_for(g.pretrain()).model.n_kv_head == 4);
  BOOST_CHECK_EXCEPTION(g.train_config_for(fs3), Error, test::is_kind(ErrorKind::internal));
  for (auto [methods, groupings, part] :
       std::vector<std::tuple<std::vector<std::string>, std::vector<std::string>, std::string>>{
           {{"mean", "median"}, {"contiguous"}, "unknown conversion method \"median\""},
           {{"fit"}, {"contiguous"}, "must include mean"},
           {{"mean"}, {"similar"}, "must include contiguous"},
           {{"mean"}, {"contiguous", "best"}, "grouping \"best\" is not one of contiguous, similar or per-layer"}}) {
    SweepPreset bad = sweep_preset("micro");
    bad.methods = methods;
    bad.groupings = groupings;
    expect_throw([&] { SweepPlan x(bad); }, ErrorKind::usage, {part});
  }
}

/// hand_preset with distillation (λ 0.5, T 2) of mean and fit, and 300 pretraining steps.
SweepPreset distilled_preset() {
  SweepPreset p = hand_preset();
  p.pretrain.max_iters = 300;
  p.distill_lambda = 0.5;
  p.distill_methods = {"mean", "aligned-fit", "random", "fit"};  // aligned-fit is not studied, random starts fresh
  return p;
}

BOOST_AUTO_TEST_CASE(distilled_cells_and_their_compute) {
  const SweepPlan plain(hand_preset()), plan(distilled_preset());
  std::vector<std::string> names;
  for (const Variant& v : plan.distill_variants) names.push_back(v.name());
  BOOST_TEST(names == (std::vector<std::string>{"mean", "fit"}), tt::per_element());
  BOOST_TEST(!plain.distills());
  BOOST_TEST(plain.distill_variants.empty());
  // the MHA row distilled alike (3 seeds), KV {2, 1} × {mean, fit} × 3 seeds, from scratch again for KV 2 and 1
  BOOST_TEST(plan.cells.size() == plain.cells.size() + 3 + 2 * 2 * 3 + 2);
  BOOST_TEST(plan.scratch_steps == 315);          // 300 × (1 + 0.05)
  BOOST_TEST(plan.distill_scratch_steps == 320);  // 300 × (1 + 4/3 × 0.05): a distilled step also runs the teacher's forward
  std::set<std::string> ids;
  for (const Cell& c : plan.cells) ids.insert(c.id());
  BOOST_TEST(ids.size() == plan.cells.size());
  for (const char* id : {"kv4_mean_a0.05_kd_s1", "kv2_fit_a0.05_kd_s3", "kv1_mean_a0.05_kd_s2", "scratch_kv1_kd_s1", "scratch_kv1_s1"})
    BOOST_TEST(ids.count(id) == 1u, id);
  for (const char* id : {"kv2_first_a0.05_kd_s1", "kv2_fit_a0_kd_s1", "kv4_fit_a0.05_kd_s1"}) BOOST_TEST(ids.count(id) == 0u, id);
  const Cell& kd = plan.find(CellKind::convert, 2, Variant::parse("fit"), 0.05, 3, true);
  BOOST_TEST(kd.steps == 15);
  const UptrainOptions o = plan.uptrain_options_for(kd), o_plain = plan.uptrain_options_for(plan.find(CellKind::convert, 2, kd.variant, 0.05, 3));
  BOOST_TEST(o.distill_lambda == 0.5);
  BOOST_TEST(o.distill_temperature == 2.0);
  BOOST_TEST(o.seed == 3u);  // paired with the plain cell of the same seed
  BOOST_TEST(o_plain.distill_lambda == 0.0);
  const TrainConfig sk = plan.train_config_for(plan.scratch(1, true)), sp = plan.train_config_for(plan.scratch(1));
  BOOST_TEST(sk.max_iters == 320);
  BOOST_TEST(sp.max_iters == 315);
  BOOST_TEST(sk.seed == sp.seed);  // the same model, trained longer
  // a distilled cell's file says so, and reads back as the same cell; a plain one has no key
  CellResult r;
  r.cell = kd;
  BOOST_TEST(r.to_json().at("distill") == true);
  BOOST_TEST((CellResult::from_json(r.to_json()).cell == kd));
  r.cell = plan.find(CellKind::convert, 2, kd.variant, 0.05, 3);
  BOOST_TEST(!r.to_json().contains("distill"));
  for (auto [lambda, temperature, methods, part] : std::vector<std::tuple<double, double, std::vector<std::string>, std::string>>{
           {1.5, 2.0, {"mean"}, "lambda must be in (0, 1]"},
           {0.5, 0.0, {"mean"}, "temperature from 0.1 to 100"},
           {0.5, 1e-30, {"mean"}, "temperature from 0.1 to 100"},
           {0.5, 2.0, {"random", "aligned"}, "none of the distilled methods"},
           {0.5, 2.0, {"median"}, "unknown conversion method \"median\""}}) {
    SweepPreset bad = distilled_preset();
    bad.distill_lambda = lambda;
    bad.distill_temperature = temperature;
    bad.distill_methods = methods;
    expect_throw([&] { SweepPlan x(bad); }, ErrorKind::usage, {part});
  }
}

/// hand_preset with partial uptraining (sweep --train attention,kv) of fit.
SweepPreset partial_preset() {
  SweepPreset p = hand_preset();
  p.partial = {Trainable::attention, Trainable::kv};
  p.partial_method = "fit";
  return p;
}

// sweep --train: at the headline α, every seed, each GQA/MQA count uptrained training only the
// attention or only K and V, by one conversion; their files say so; their section pairs them with
// the same conversion uptrained whole, and they stay out of every plain table.
BOOST_AUTO_TEST_CASE(partial_cells_their_files_and_their_section) {
  const SweepPlan plain(hand_preset()), plan(partial_preset());
  BOOST_TEST(plan.partial());
  BOOST_TEST(!plain.partial());
  BOOST_TEST(plan.cells.size() == plain.cells.size() + 2 * 2 * 3);  // {attention, kv} × KV {2, 1} × 3 seeds
  std::set<std::string> ids;
  for (const Cell& c : plan.cells) ids.insert(c.id());
  BOOST_TEST(ids.size() == plan.cells.size());
  for (const char* id : {"kv2_fit_a0.05_tkv_s1", "kv1_fit_a0.05_tattention_s3"}) BOOST_TEST(ids.count(id) == 1u, id);
  for (const char* id : {"kv4_fit_a0.05_tkv_s1", "kv2_mean_a0.05_tkv_s1", "kv2_fit_a0_tkv_s1"}) BOOST_TEST(ids.count(id) == 0u, id);
  const Cell& kv = plan.find(CellKind::convert, 2, Variant::parse("fit"), 0.05, 2, false, Trainable::kv);
  const Cell& whole = plan.find(CellKind::convert, 2, kv.variant, 0.05, 2);
  BOOST_TEST(kv.steps == whole.steps);
  const UptrainOptions o = plan.uptrain_options_for(kv);
  BOOST_TEST((o.trainable == Trainable::kv));
  BOOST_TEST(o.seed == 2u);  // paired with the whole cell of the same seed
  BOOST_TEST((plan.uptrain_options_for(whole).trainable == Trainable::all));
  CellResult r;
  r.cell = kv;
  BOOST_TEST(r.to_json().at("train") == "kv");
  BOOST_TEST((CellResult::from_json(r.to_json()).cell == kv));
  r.cell = whole;
  BOOST_TEST(!r.to_json().contains("train"));
  for (auto [partial, method, part] : std::vector<std::tuple<std::vector<Trainable>, std::string, std::string>>{
           {{Trainable::kv}, "aligned-fit", "the method of the partial cells, aligned-fit, is not among the study's methods"},
           {{Trainable::all}, "fit", "\"all\" is every plain cell already"}}) {
    SweepPreset bad = partial_preset();
    bad.partial = partial;
    bad.partial_method = method;
    expect_throw([&] { SweepPlan x(bad); }, ErrorKind::usage, {part});
  }
  // the section: each conversion converted 0.2 above its whole uptraining
  std::vector<CellResult> results = hand_results(plan);
  for (CellResult& x : results)
    if (x.cell.kind == CellKind::convert && x.cell.trainable == Trainable::all) x.loss_before = x.val_loss + 0.2;
  std::ostringstream out, csv;
  write_report_md(out, plan, results, {"tiny.txt", 900, 100, "2024-01-02"});
  const std::string md = out.str();
  for (const char* line : {
           "## Partial uptraining — only the attention, or only K and V, trained (α = 0.05, fit)",
           "| KV heads | trains | val loss | − all | kept |",
           // fit at α 0.05, GQA-2: 3.05, 3.06, 3.07 whole; the attention alone 0.01 lower, K and V 0.02 higher;
           // kept (0.2 + 0.01) / 0.2 and (0.2 − 0.02) / 0.2
           "| GQA-2 | all | 3.0600 ± 0.0100 (n=3) | – | 1 |",
           "| GQA-2 | attention | 3.0500 ± 0.0100 (n=3) | -0.0100 ± 0.0000 | 1.05 ± 0.00 |",
           "| GQA-2 | kv | 3.0800 ± 0.0100 (n=3) | +0.0200 ± 0.0000 | 0.90 ± 0.00 |",
           "| MQA | kv | 3.1800 ± 0.0100 (n=3) | +0.0200 ± 0.0000 | 0.90 ± 0.00 |",
           // the partial cells stay out of the plain tables
           "| fit | contiguous | 3.0600 ± 0.0100 (n=3) (3.1000) | 3.1600 ± 0.0100 (n=3) (3.2500) |"})
    BOOST_TEST(has_line(md, line), line << "\nnot in\n" << md);
  write_results_csv(csv, plan, results);
  BOOST_TEST(csv.str().find("\nkv1_fit_a0.05_tattention_s3,convert,1,,fit,0,attention,0.05,3,") != std::string::npos, csv.str());
  std::ostringstream plain_md;
  write_report_md(plain_md, plain, hand_results(plain), {"tiny.txt", 900, 100, "2024-01-02"});
  BOOST_TEST(plain_md.str().find("## Partial uptraining") == std::string::npos);
}

// ---- the cell files -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cell_files_read_and_write_back_unchanged) {
  // as an earlier sweep wrote them
  const auto converted = nlohmann::json::parse(R"({
 "alpha": 0.05, "decode_ms_per_sample_b1": 455.98811, "decode_ms_per_sample_b4": 114.001091,
 "decode_ms_per_token_step_b1": 30.399207333333333, "decode_ms_per_token_step_b4": 30.400290933333334,
 "forward_flops_per_token": 7648.0, "id": "kv2_mean_a0.05_s1", "kind": "convert", "kv_cache_bytes_per_token": 64,
 "kv_heads": 2, "loss_before": 3.2096107006073, "method": "mean", "params": 3616, "perplexity": 24.69559150987442,
 "schedule": "rewarm", "seed": 1, "steps": 1, "train_seconds": 0.205611523, "val_loss": 3.206624746322632})");
  const auto pretrained = nlohmann::json::parse(R"({
 "alpha": 0.0, "decode_ms_per_sample_b1": 491.17421299999995, "decode_ms_per_sample_b4": 119.001317,
 "decode_ms_per_token_step_b1": 32.74494753333333, "decode_ms_per_token_step_b4": 31.733684533333334,
 "forward_flops_per_token": 8160.0, "id": "pretrain_mha", "kind": "pretrain", "kv_cache_bytes_per_token": 128,
 "kv_heads": 4, "loss_before": null, "method": "", "params": 3872, "perplexity": 24.67, "schedule": "cosine",
 "seed": 1, "steps": 20, "train_seconds": 1.25, "val_loss": 3.2057})");
  nlohmann::json timed = converted;  // a converted cell of this version: its conversion time too
  timed["convert_seconds"] = 0.125;
  BOOST_TEST(CellResult::from_json(timed).convert_seconds.value() == 0.125);
  BOOST_TEST(!CellResult::from_json(converted).convert_seconds.has_value());
  for (const nlohmann::json& j : {converted, pretrained, timed}) {
    const CellResult r = CellResult::from_json(j);
    BOOST_TEST(r.to_json() == j, r.to_json().dump(1) << "\nvs\n" << j.dump(1));
    BOOST_TEST(r.to_json().dump(1) == j.dump(1));  // integers stay integers, 7648.0 stays a float
  }
  const CellResult c = CellResult::from_json(converted);
  BOOST_TEST((c.cell == Cell{CellKind::convert, 2, Variant::parse("mean"), 0.05, 1, 1}));
  BOOST_TEST(c.loss_before.value() == 3.2096107006073);
  BOOST_TEST(c.decode.at(4).ms_per_sample == 114.001091);
  BOOST_TEST(c.decode.at(1).ms_per_token_step == 30.399207333333333);
  BOOST_TEST(!CellResult::from_json(pretrained).loss_before.has_value());
  // decode/kv<KV>.json holds just the decode keys
  const DecodeTimes d = {{1, {0.5, 7.5}}, {32, {2.0, 0.9375}}};
  BOOST_TEST(decode_times_to_json(d) == nlohmann::json::parse(R"({"decode_ms_per_token_step_b1": 0.5,
    "decode_ms_per_sample_b1": 7.5, "decode_ms_per_token_step_b32": 2.0, "decode_ms_per_sample_b32": 0.9375})"));
  BOOST_TEST(decode_times_from_json(decode_times_to_json(d)).at(32).ms_per_sample == 0.9375);
  // a RoPE study's cells also hold the long context's times, under keys of their own that the
  // trained context's reader does not take for its own (decode_long_ms_per_sample_b4 is not b4's)
  nlohmann::json rope = converted;
  rope.update(nlohmann::json::parse(R"({"decode_long_context": 64, "decode_long_ms_per_token_step_b4": 3.5,
    "decode_long_ms_per_sample_b4": 40.25, "decode_long_ms_per_sample_q1_b4": 39.0, "decode_long_ms_per_sample_q3_b4": 41.5,
    "decode_long_runs_b4": 3})"));
  const CellResult rr = CellResult::from_json(rope);
  BOOST_TEST(rr.to_json() == rope, rr.to_json().dump(1));
  BOOST_TEST(rr.decode_long_context == 64);
  BOOST_TEST(rr.decode_long.at(4).ms_per_sample == 40.25);
  BOOST_TEST(rr.decode_long.at(4).sample_q3 == 41.5);
  BOOST_TEST(rr.decode.at(4).ms_per_sample == 114.001091);
  BOOST_TEST(rr.decode.size() == 2u);
  // keys that only begin like a batch's are not read as one
  const DecodeTimes odd = decode_times_from_json(nlohmann::json::parse(R"({"decode_ms_per_sample_b4x": 1.0,
    "decode_ms_per_sample_b": 2.0, "decode_ms_per_sample_b16": 3.0})"));
  BOOST_TEST(odd.size() == 1u);
  BOOST_TEST(odd.at(16).ms_per_sample == 3.0);
  // what the times ran with is kept, and absent from an older file
  nlohmann::json with = converted;
  with["decode_timed_with"] = "2 threads, OpenMP wait: OMP_WAIT_POLICY=passive";
  BOOST_TEST(CellResult::from_json(with).decode_timed_with == "2 threads, OpenMP wait: OMP_WAIT_POLICY=passive");
  BOOST_TEST(CellResult::from_json(with).to_json() == with);
  BOOST_TEST(CellResult::from_json(converted).decode_timed_with.empty());
}

// ---- the report -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(stat_and_its_text) {
  const Stat s = stat({1.0, 2.0, 3.0});
  BOOST_TEST(s.n == 3);
  BOOST_TEST(s.mean == 2.0);
  BOOST_TEST(s.sd == 1.0);  // sample standard deviation: sqrt((1 + 0 + 1) / 2)
  BOOST_TEST(s.lo == 1.0);
  BOOST_TEST(s.hi == 3.0);
  BOOST_TEST(fmt_stat(s) == "2.0000 ± 1.0000 (n=3)");
  BOOST_TEST(fmt_stat(stat({3.2057})) == "3.2057");
  BOOST_TEST(stat({3.2057}).sd == 0.0);
  BOOST_TEST(fmt_stat(stat({})) == "–");
}

BOOST_AUTO_TEST_CASE(csv_header_and_rows) {
  const SweepPlan plan(sweep_preset("micro"));
  CellResult pre;
  pre.cell = plan.pretrain();
  pre.schedule = "cosine";
  pre.val_loss = 3.25;
  pre.perplexity = 25.5;
  pre.train_seconds = 2.0;
  pre.params = 3872;
  pre.forward_flops_per_token = 8160;
  pre.kv_cache_bytes_per_token = 128;
  pre.decode = {{1, {1.5, 22.5}}, {4, {2.5, 9.375}}};
  CellResult conv = pre;
  conv.cell = plan.find(CellKind::convert, 2, Variant::parse("mean"), 0.05);
  conv.schedule = "rewarm";
  conv.loss_before = 3.75;
  conv.params = 3616;
  conv.forward_flops_per_token = 7648;
  conv.kv_cache_bytes_per_token = 64;
  conv.val_loss_kv = {{"f16", 3.5}};
  std::ostringstream csv;
  write_results_csv(csv, plan, {pre, conv});
  BOOST_TEST(csv.str() ==
             "id,kind,kv_heads,kv_heads_per_layer,method,distill,train,alpha,seed,steps,schedule,val_loss,perplexity,loss_before,train_seconds,params,"
             "forward_flops_per_token,kv_cache_bytes_per_token,val_loss_kv_f16,val_loss_kv_q8,decode_ms_per_token_step_b1,"
             "decode_ms_per_sample_b1,decode_ms_per_token_step_b4,decode_ms_per_sample_b4\n"
             "pretrain_mha,pretrain,4,,,0,,0.0,1,20,cosine,3.25,25.5,,2.0,3872,8160.0,128,,,1.5,22.5,2.5,9.375\n"
             "kv2_mean_a0.05_s1,convert,2,,mean,0,all,0.05,1,1,rewarm,3.25,25.5,3.75,2.0,3616,7648.0,64,3.5,,1.5,22.5,2.5,9.375\n");
}

BOOST_AUTO_TEST_CASE(report_tables_and_findings_follow_the_numbers) {
  const SweepPlan plan(hand_preset());
  const ReportContext ctx{"tiny.txt", 900, 100, "2024-01-02"};
  std::ostringstream out;
  std::vector<CellResult> rs = hand_results(plan);
  for (CellResult& r : rs) r.decode_timed_with = "3 threads, OpenMP wait: spin";
  write_report_md(out, plan, rs, ctx);
  const std::string md = out.str();
  BOOST_TEST(md.find(" Decoding ran on 3 threads, OpenMP wait: spin.") != std::string::npos, md);
  {  // an older sweep's times say nothing of it: the report says so
    std::ostringstream old;
    write_report_md(old, plan, hand_results(plan), ctx);
    BOOST_TEST(old.str().find("Decoding ran on a thread count and OpenMP wait policy not recorded") != std::string::npos);
  }
  BOOST_TEST(md.starts_with("# GQA/MQA uptraining trade-off — preset `micro`\n\nMeasured 2024-01-02 on `tiny.txt` "
                            "(900 train / 100 val tokens). MHA model: 1 layers, 4 heads, d 16, T 16, pretrained 20 steps "
                            "of batch 4."),
             md);
  for (const char* line : {
           "## Table 1 — quality and decoding time after uptraining with α = 0.05 (mean pooling)",
           "| model | KV heads | val loss | perplexity | decode ms/sample (batch 1) | decode ms/sample (batch 4) | KV cache "
           "bytes/token | params |",
           "| MHA (pretrained, α = 0) | 4 | 3.0000 | 20.086 | 24.0 | 10.00 | 128 | 3872 |",
           "| MHA + α uptraining (same compute) | 4 | 2.9100 ± 0.0100 (n=3) | 18.357 | 24.0 | 10.00 | 128 | 3872 |",
           "| GQA-2 | 2 | 3.1100 ± 0.0100 (n=3) | 22.421 | 20.0 | 6.50 | 64 | 3616 |",
           "| MQA | 1 | 3.3100 ± 0.0100 (n=3) | 27.385 | 16.0 | 5.00 | 32 | 3488 |",
           "| GQA-2 from scratch (21 steps) | 2 | 3.1500 | 23.336 | 20.0 | 6.50 | 64 | 3616 |",
           "| MQA from scratch (21 steps) | 1 | 3.4000 | 29.964 | 16.0 | 5.00 | 32 | 3488 |",
           "| smaller MHA (d 8, pretrained, 20 steps) | 4 | 3.2000 | 24.533 | 15.0 | 6.00 | 64 | 1100 |",
           "| method | grouping | GQA-2 | MQA |",
           "| mean | contiguous | 3.1100 ± 0.0100 (n=3) (3.2000) | 3.3100 ± 0.0100 (n=3) (3.5000) |",
           "| first | contiguous | 3.3100 ± 0.0100 (n=3) (3.4000) | 3.2100 ± 0.0100 (n=3) (3.3000) |",
           "| random | contiguous | 3.6100 ± 0.0100 (n=3) (4.0000) | 3.8100 ± 0.0100 (n=3) (4.2000) |",
           "| fit | contiguous | 3.0600 ± 0.0100 (n=3) (3.1000) | 3.1600 ± 0.0100 (n=3) (3.2500) |",
           "| mean | contiguous | 0.002 | 0.002 |",
           "| fit | contiguous | 0.250 | 0.250 |",
           "| α | steps | MHA | GQA-2 | MQA |",
           "| 0 | 0 | 3.0000 | 3.2000 | 3.5000 |",
           "| 0.05 | 1 | 2.9100 | 3.1100 | 3.3100 |",
           "| 0.1 | 2 | 2.8500 | 3.0500 | 3.2500 |",
           "- GQA-2: mean pooling beats first head and random init (Fig. 4): **yes** (3.1100 vs 3.3100, 3.6100)",
           "- MQA: mean pooling beats first head and random init (Fig. 4): **no** (3.3100 vs 3.2100, 3.8100)",
           "- GQA-2: the best conversion method beats mean pooling at α = 0: **yes** (fit 3.1000 vs mean 3.2000)",
           "- GQA-2: the best conversion method beats mean pooling at α = 0.05: **yes** (fit 3.0600 vs mean 3.1100)",
           "- MQA: the best conversion method beats mean pooling at α = 0.05: **yes** (fit 3.1600 vs mean 3.3100)",
           "- GQA-2: an uptrained model matches one trained from scratch at equal compute (best conversion at α = 0.05 "
           "within 0.01 of it or better): **yes** (fit 3.0600 vs from scratch 3.1500)",
           // 3.2 → 3.11 gains 0.09, 3.11 → 3.05 only 0.06
           "- GQA-2: uptraining with α = 0.05 lowers the loss of the converted model (Fig. 5): **yes** (3.2000 → 3.1100); "
           "going to α = 0.1 adds less than the first step did: **yes** (→ 3.0500)",
           // 3.5 → 3.31 gains 0.19, 3.31 → 3.25 only 0.06
           "- MQA: uptraining with α = 0.05 lowers the loss of the converted model (Fig. 5): **yes** (3.5000 → 3.3100); "
           "going to α = 0.1 adds less than the first step did: **yes** (→ 3.2500)",
           "- At α = 0 the converted GQA-2 loses less than MQA (GQA is usable before uptraining, Fig. 5): **yes** "
           "(+0.2000 vs +0.5000 over MHA)",
           "- After uptraining, GQA-2 sits between MQA and MHA in quality (Table 1): **yes** (MHA 2.9100, GQA-2 3.1100, "
           "MQA 3.3100)",
           "- Decoding time per sample falls as KV heads are removed (batch 4, Fig. 6): **yes** (ms per sample, median "
           "[interquartile range]: MHA 10.00 [9.50–10.50], GQA-2 6.50 [6.20–6.80], MQA 5.00 [4.80–5.20])",
           // GQA-2's range 6.20–6.80 overlaps the smaller model's 5.70–6.30; MQA's 4.80–5.20 is below it
           "- A converted model beats the smaller MHA model at equal or lower decoding time (batch 4; the frontier across "
           "sizes, Table 1): **yes**, GQA-2, MQA (smaller MHA 3.2000 at 6.00 [5.70–6.30] ms per sample; GQA-2 (fit) 3.0600 "
           "at 6.50 [6.20–6.80]: better, as fast within the spread; MQA (fit) 3.1600 at 5.00 [4.80–5.20]: better, faster)"})
    BOOST_TEST(has_line(md, line), line << "\nnot in\n" << md);
  const std::string finding = "- Decoding time per sample falls as KV heads are removed (batch 4, Fig. 6): ";
  auto decode_line = [&](const DecodeTime& mqa) {
    std::ostringstream o;
    write_report_md(o, plan, hand_results(plan, mqa), ctx);
    const std::string s = o.str();
    const size_t at = s.find(finding);
    return at == std::string::npos ? std::string() : s.substr(at + finding.size(), s.find('\n', at) - at - finding.size());
  };
  // MQA's interquartile range above GQA-2's: slower, resolved
  BOOST_TEST(decode_line({1.25, 7.5, 7.2, 7.8, 5}).starts_with("**no** ("));
  // faster by its median but the interquartile ranges overlap: the spread does not order them
  BOOST_TEST(decode_line({1.25, 6.4, 5.9, 6.9, 5}).starts_with("not resolved (interquartile ranges overlap) ("));
  // slower by its median, ranges overlapping: not resolved either, never a bare no
  BOOST_TEST(decode_line({1.25, 6.7, 6.3, 7.0, 5}).starts_with("not resolved (interquartile ranges overlap) ("));
  // a cell file from before ranges were kept: medians compared, and said so
  BOOST_TEST(decode_line({1.25, 6.7}).ends_with("; medians only, no ranges recorded)"));
  BOOST_TEST(decode_line({1.25, 6.7}).starts_with("**no** ("));
  BOOST_TEST(decode_line({1.25, 6.5}).starts_with("**yes** ("));  // a tie of medians is not slower
  // the frontier: a smaller model faster than every converted one (4.0 [3.9–4.1]) leaves none that
  // beats it at equal or lower time; a better smaller model (its loss under theirs) neither
  const std::string frontier = "- A converted model beats the smaller MHA model at equal or lower decoding time (batch 4; the "
                               "frontier across sizes, Table 1): ";
  auto frontier_line = [&](const DecodeTime& smaller, double smaller_loss) {
    std::vector<CellResult> rs = hand_results(plan, {1.25, 5.0, 4.8, 5.2, 5}, smaller);
    for (CellResult& r : rs)
      if (r.cell.kind == CellKind::smaller) r.val_loss = smaller_loss;
    std::ostringstream o;
    write_report_md(o, plan, rs, ctx);
    const std::string s = o.str();
    const size_t at = s.find(frontier);
    return at == std::string::npos ? std::string() : s.substr(at + frontier.size(), s.find('\n', at) - at - frontier.size());
  };
  BOOST_TEST(frontier_line({1.5, 4.0, 3.9, 4.1, 5}, 3.2) ==
             "**no** (smaller MHA 3.2000 at 4.00 [3.90–4.10] ms per sample; GQA-2 (fit) 3.0600 at 6.50 [6.20–6.80]: "
             "better, slower; MQA (fit) 3.1600 at 5.00 [4.80–5.20]: better, slower)");
  BOOST_TEST(frontier_line({1.5, 6.0, 5.7, 6.3, 5}, 3.0).starts_with("**no** (smaller MHA 3.0000"));
  BOOST_TEST(frontier_line({1.5, 6.0, 5.7, 6.3, 5}, 3.1).starts_with("**yes**, GQA-2 (smaller MHA 3.1000"));
}

// Distilled rows beside their plain ones, paired by seed; the other tables keep the plain rows.
BOOST_AUTO_TEST_CASE(distillation_section_follows_the_numbers) {
  const SweepPlan plan(distilled_preset());
  std::ostringstream out;
  write_report_md(out, plan, hand_results(plan), {"tiny.txt", 900, 100, "2024-01-02"});
  const std::string md = out.str();
  for (const char* line : {
           "## Distillation — uptraining with the MHA model as teacher (α = 0.05, λ = 0.5, T = 2)",
           "| KV heads | method | plain | distilled | distilled − plain | − MHA plain | − MHA distilled (equal compute) |",
           // MHA: 2.90, 2.91, 2.92 plain; 0.02 lower distilled
           "| MHA | – | 2.9100 ± 0.0100 (n=3) | 2.8900 ± 0.0100 (n=3) | -0.0200 ± 0.0000 | – | – |",
           // GQA-2 mean: 3.10, 3.11, 3.12 plain; 2.94, 2.95, 2.93 distilled: −0.16, −0.16, −0.19 (sd √(3e-4));
           // against MHA distilled (2.88, 2.89, 2.90): +0.06, +0.06, +0.03
           "| GQA-2 | mean | 3.1100 ± 0.0100 (n=3) | 2.9400 ± 0.0100 (n=3) | -0.1700 ± 0.0173 | +0.2000 ± 0.0000 | +0.0500 ± 0.0173 |",
           "| MQA | fit | 3.1600 ± 0.0100 (n=3) | 2.9900 ± 0.0100 (n=3) | -0.1700 ± 0.0173 | +0.2500 ± 0.0000 | +0.1000 ± 0.0173 |",
           "From scratch (one seed): GQA-2 3.1500 at 315 steps, 3.1400 at 320; MQA 3.4000 at 315 steps, 3.3900 at 320.",
           // GQA-2 fit distilled 2.89, 2.90, 2.88: 2.89 ≤ 2.89 + 0.01; MQA fit's 2.99 is not
           "- GQA-2 distilled (fit) within one seed-sd of MHA distilled alike (equal compute): **yes** (2.8900 vs 2.8900 ± "
           "0.0100 (n=3); plain fit 3.0600); matches the model from scratch at equal compute (within 0.01 or better): **yes** (vs 3.1400)",
           "- MQA distilled (fit) within one seed-sd of MHA distilled alike (equal compute): **no** (2.9900 vs 2.8900 ± 0.0100 "
           "(n=3); plain fit 3.1600); matches the model from scratch at equal compute (within 0.01 or better): **yes** (vs 3.3900)",
           // the distilled cells stay out of the plain tables
           "| MHA + α uptraining (same compute) | 4 | 2.9100 ± 0.0100 (n=3) | 18.357 | 24.0 | 10.00 | 128 | 3872 |",
           "| fit | contiguous | 3.0600 ± 0.0100 (n=3) (3.1000) | 3.1600 ± 0.0100 (n=3) (3.2500) |",
           "| GQA-2 from scratch (315 steps) | 2 | 3.1500 | 23.336 | 20.0 | 6.50 | 64 | 3616 |"})
    BOOST_TEST(has_line(md, line), line << "\nnot in\n" << md);
  BOOST_TEST(md.find("trained 320 steps (1 + 1.33 α of 300)") != std::string::npos, md);
  std::ostringstream plain;
  write_report_md(plain, SweepPlan(hand_preset()), hand_results(SweepPlan(hand_preset())), {"tiny.txt", 900, 100, "2024-01-02"});
  BOOST_TEST(plain.str().find("## Distillation") == std::string::npos);
}

// Heads per layer beside the same budget spread evenly: a variant of its own (method+per-layer),
// and a finding per KV count.
BOOST_AUTO_TEST_CASE(per_layer_variants_and_their_finding) {
  SweepPreset p = hand_preset();
  p.groupings = {"contiguous", "per-layer"};
  const SweepPlan plan(p);
  std::vector<std::string> names;
  for (const Variant& v : plan.variants) names.push_back(v.name());
  BOOST_TEST(names == (std::vector<std::string>{"mean", "first", "random", "fit", "mean+per-layer", "first+per-layer", "fit+per-layer"}),
             tt::per_element());
  BOOST_TEST(plan.cells.size() == SweepPlan(hand_preset()).cells.size() + 3 * 4);  // 3 methods at GQA-2, none at MQA
  const Cell& c = plan.find(CellKind::convert, 2, Variant::parse("fit+per-layer"), 0.05, 2);
  BOOST_TEST(c.id() == "kv2_fit+per-layer_a0.05_s2");
  const UptrainOptions o = plan.uptrain_options_for(c);
  BOOST_TEST(o.kv_heads == 2);  // the budget: 2 in every layer
  BOOST_TEST((o.variant.grouping == Grouping::PerLayer));
  std::vector<CellResult> rs = hand_results(plan);
  for (CellResult& r : rs)
    if (r.cell.variant.grouping == Grouping::PerLayer && r.cell.kv == 2) r.kv_layers = {2};  // one layer: as uniform
  std::ostringstream out;
  write_report_md(out, plan, rs, {"tiny.txt", 900, 100, "2024-01-02"});
  const std::string md = out.str();
  for (const char* line : {
           // α = 0: 3.2 − 0.05; α = 0.05: 3.08, 3.09, 3.10 against 3.10, 3.11, 3.12 (0.02 apart, sd 0.01)
           "- GQA-2: mean with its 2 KV heads placed per layer (2) beats them spread evenly at α = 0: **yes** (3.1500 vs 3.2000); at "
           "α = 0.05 by more than a seed-sd: **yes** (3.0900 ± 0.0100 (n=3) vs 3.1100 ± 0.0100 (n=3))",
           // MQA: one head per layer has one allocation, contiguous's (the plan runs no per-layer cells there)
           "| fit | per-layer | 3.0400 ± 0.0100 (n=3) (3.0500) | 3.1600 ± 0.0100 (n=3) (3.2500) |"})
    BOOST_TEST(has_line(md, line), line << "\nnot in\n" << md);
  BOOST_TEST(md.find("`per-layer`: a KV count's budget") != std::string::npos);
  BOOST_TEST(md.find("- MQA: mean with its") == std::string::npos);
  std::ostringstream csv;
  write_results_csv(csv, plan, rs);
  BOOST_TEST(csv.str().find("\nkv2_fit+per-layer_a0_s1,convert,2,2,fit+per-layer,0,") != std::string::npos, csv.str());
  // the cell file keeps the allocation
  const auto with_layers = std::find_if(rs.begin(), rs.end(), [](const CellResult& r) { return !r.kv_layers.empty(); });
  BOOST_TEST_REQUIRE((with_layers != rs.end()));
  BOOST_TEST(with_layers->to_json().at("kv_heads_per_layer") == nlohmann::json({2}));
  BOOST_TEST(CellResult::from_json(with_layers->to_json()).kv_layers == with_layers->kv_layers, tt::per_element());
}

// A RoPE model's study also times decoding at 4·T: a column of Table 1, a column of results.csv and
// a finding of its own.
BOOST_AUTO_TEST_CASE(a_rope_study_reports_the_long_context) {
  SweepPreset p = hand_preset();
  p.pretrain.model.pos = PosKind::Rope;
  const SweepPlan plan(p);
  std::vector<CellResult> rs = hand_results(plan);
  for (CellResult& r : rs) {
    r.decode_long_context = 64;
    const double ms = r.cell.kind == CellKind::smaller ? 20.0 : 40.0 / static_cast<double>(5 - r.cell.kv);  // 40, 20, 10
    r.decode_long = {{4, {1.0, ms, ms - 0.5, ms + 0.5, 3}}};
  }
  std::ostringstream out;
  write_report_md(out, plan, rs, {"tiny.txt", 900, 100, "2024-01-02"});
  const std::string md = out.str();
  for (const char* line : {
           "| model | KV heads | val loss | perplexity | decode ms/sample (batch 1) | decode ms/sample (batch 4) | decode "
           "ms/sample (batch 4, context 64) | KV cache bytes/token | params |",
           "| MHA (pretrained, α = 0) | 4 | 3.0000 | 20.086 | 24.0 | 10.00 | 40.00 | 128 | 3872 |",
           "| smaller MHA (d 8, pretrained, 20 steps) | 4 | 3.2000 | 24.533 | 15.0 | 6.00 | 20.00 | 64 | 1100 |",
           "- ... and at 4 × the trained context (64 tokens, batch 4; speed only): **yes** (ms per sample, median "
           "[interquartile range]: MHA 40.00 [39.50–40.50], GQA-2 13.33 [12.83–13.83], MQA 10.00 [9.50–10.50])"})
    BOOST_TEST(has_line(md, line), line << "\nnot in\n" << md);
  BOOST_TEST(md.find("The model has RoPE, so decoding is also timed at 4 × T = 64 (a prompt of 32 tokens, batch 4)") !=
             std::string::npos);
  std::ostringstream csv;
  write_results_csv(csv, plan, rs);
  const std::string header = csv.str().substr(0, csv.str().find('\n'));
  BOOST_TEST(header.ends_with(",decode_ms_per_token_step_b4_ctx64,decode_ms_per_sample_b4_ctx64"), header);
}

BOOST_AUTO_TEST_CASE(plots_are_drawn, *boost::unit_test::precondition(test::gnuplot_works)) {
  TempDir d;
  const SweepPlan plan(hand_preset());
  write_plots(d.path.string(), plan, hand_results(plan));
  for (const char* f : {"fig_tradeoff.png", "fig_alpha.png", "fig_methods.png", "fig_kvbytes.png"})
    BOOST_TEST(fs::file_size(d / f) > 100u, f);
  for (const char* f : {"tradeoff.dat", "alpha.dat", "methods.dat", "kvbytes.dat"}) BOOST_TEST(!fs::exists(d / f), f);
}

// ---- a whole sweep --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(micro_sweep_writes_everything_and_resumes) {
  TempDir d;
  const std::string text = test::fixture_path("tiny.txt");
  const std::string args = "sweep --preset micro --methods mean,fit --groupings contiguous,similar --data " + text;
  Run bad = run_cli("sweep --preset micro --methods mean,median --data " + text + " --out " + (d / "bad"));
  expect_error(bad, "unknown conversion method \"median\"");
  BOOST_TEST(!fs::exists(d / "bad/sweep.json"));
  Run r = run_cli(args + " --out " + (d / "sw"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  for (const char* f : {"results.csv", "report.md", "fig_tradeoff.png", "fig_alpha.png", "fig_methods.png"})
    BOOST_TEST(fs::file_size(d / (std::string("sw/") + f)) > 100u, f);
  std::ifstream csv(d / "sw/results.csv");
  std::string header, line;
  std::getline(csv, header);
  for (const char* col : {"kv_heads", "method", "alpha", "seed", "val_loss", "perplexity", "decode_ms_per_sample_b1",
                          "decode_ms_per_token_step_b4", "kv_cache_bytes_per_token", "params", "forward_flops_per_token",
                          "train_seconds", "val_loss_kv_f16"})
    BOOST_TEST(header.find(col) != std::string::npos, col);
  int rows = 0;
  const size_t ncols = std::count(header.begin(), header.end(), ',');
  while (std::getline(csv, line)) {
    rows++;
    BOOST_TEST(size_t(std::count(line.begin(), line.end(), ',')) == ncols, line);
  }
  // pretrain + KV 4 (mean: 3 α, 3 seeds at the headline α) + KV {2, 1} × (mean's 5 cells + fit,
  // mean+similar, fit+similar at α = 0 and 3 seeds of the headline α) + from-scratch KV 2 and 1 +
  // the smaller MHA model
  BOOST_TEST(rows == 1 + 5 + 2 * (5 + 3 * 4) + 2 + 1);
  std::ifstream md(d / "sw/report.md");
  std::string report((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  for (const char* part : {"## Table 1", "## Figure 4", "## Figure 5", "| MQA |", "GQA-2", "| fit | similar |",
                           "Conversion wall time", "| smaller MHA (d 8, pretrained, 20 steps) | 4 |",
                           "- A converted model beats the smaller MHA model at equal or lower decoding time (batch 4"})
    BOOST_TEST(report.find(part) != std::string::npos, part);
  for (const char* f : {"kv4.json", "kv2.json", "kv1.json", "smaller.json"}) {  // every shape's decoding times
    const ShapeDecodeTimes t = ShapeDecodeTimes::from_json(nlohmann::json::parse(slurp(d / (std::string("sw/decode/") + f))));
    BOOST_TEST(t.decode.at(4).runs >= 3, f);
    BOOST_TEST(t.timed_with.find(" threads, OpenMP wait: ") != std::string::npos, t.timed_with);
  }
  BOOST_TEST(fs::exists(d / "sw/runs/pretrain_mha_smaller/checkpoint.h5"));  // kept, as the MHA model's
  // the sweep's lock on OUT and each cell's on its run directory are separate files: no deadlock
  for (const char* f : {"sw/.lock", "sw/runs/pretrain_mha/.lock", "sw/runs/kv1_mean_a0.05_s2/.lock"})
    BOOST_TEST(fs::exists(d / f), f);
  const auto stamp = fs::last_write_time(d / "sw/cells/kv1_mean_a0.05_s2.json");
  Run again = run_cli(args + " --out " + (d / "sw"));
  BOOST_TEST(again.code == 0, again.err);
  BOOST_TEST(again.out.find("finished cells are skipped") != std::string::npos, again.out);
  BOOST_TEST(again.out.find("step ") == std::string::npos, "a finished cell ran again: " << again.out);
  BOOST_TEST((fs::last_write_time(d / "sw/cells/kv1_mean_a0.05_s2.json") == stamp));
  // distilled cells join the finished study: only they, and the models from scratch at their compute, run
  expect_error(run_cli(args + " --distill-lambda 0.3 --out " + (d / "sw")), "sweep: --distill-lambda, --distill-temperature and --distill-attention need --distill");
  // the attention-output term is uptrain's alone
  expect_error(run_cli(args + " --distill --distill-attention 1 --out " + (d / "sw")), "--distill-attention");
  Run kd = run_cli(args + " --distill --distill-methods fit --out " + (d / "sw"));
  BOOST_TEST_REQUIRE(kd.code == 0, kd.err);
  BOOST_TEST((fs::last_write_time(d / "sw/cells/kv1_mean_a0.05_s2.json") == stamp));
  for (const char* id : {"kv4_mean_a0.05_kd_s3", "kv1_fit_a0.05_kd_s1", "kv2_fit_a0.05_kd_s2", "scratch_kv2_kd_s1"})
    BOOST_TEST(fs::exists(d / ("sw/cells/" + std::string(id) + ".json")), id);
  BOOST_TEST(slurp(d / "sw/report.md").find("## Distillation — uptraining with the MHA model as teacher (α = 0.05, λ = 0.5, T = 2)") !=
             std::string::npos);
  BOOST_TEST(CellResult::from_json(nlohmann::json::parse(slurp(d / "sw/cells/kv1_fit_a0.05_kd_s1.json"))).cell.distill);
  // one λ and T per directory
  expect_error(run_cli(args + " --distill --distill-lambda 0.25 --out " + (d / "sw")), "holds distilled cells with");
}

BOOST_AUTO_TEST_CASE(a_second_sweep_on_one_directory_is_refused) {
  TempDir d;
  const DirLock held(d / "sw");
  Run r = run_cli("sweep --preset micro --data " + test::fixture_path("tiny.txt") + " --out " + (d / "sw"));
  expect_error(r, d / "sw");
  BOOST_TEST(r.err.find("pid " + std::to_string(::getpid())) != std::string::npos, r.err);
  std::set<std::string> in_out;  // nothing touched: no sweep.json, no runs/
  for (const auto& e : fs::directory_iterator(d / "sw")) in_out.insert(e.path().filename().string());
  BOOST_TEST(in_out == std::set<std::string>{".lock"}, tt::per_element());
}

// A sweep's state files damaged by hand or by a crash: one line naming the file and what to do,
// on every re-run (they gave raw JSON or basic_filebuf messages naming no file); a corpus too
// short to train on is refused before the output directory is made.
BOOST_AUTO_TEST_CASE(damaged_sweep_state_gives_one_line_naming_the_file) {
  TempDir d;
  const std::string text = test::fixture_path("tiny.txt");
  std::ofstream(d / "short.txt") << std::string(100, 'a');
  expect_error(run_cli("sweep --preset micro --methods mean --data " + (d / "short.txt") + " --out " + (d / "o")),
               "short.txt: the val split of 10 tokens");
  BOOST_TEST(!fs::exists(d / "o"));
  const std::string args = "sweep --preset micro --methods mean --quiet --data " + text + " --out " + (d / "sw");
  BOOST_TEST_REQUIRE(run_cli(args).code == 0);
  const fs::path cell = d / "sw/cells/kv1_mean_a0.05_s2.json", other = d / "sw/cells/kv2_mean_a0.05_s2.json";
  const std::string stamp = slurp(d / "sw/sweep.json"), good = slurp(cell);
  auto damaged = [&](const fs::path& f, const std::string& part) {
    Run r = run_cli(args);
    expect_error(r, f.string());
    BOOST_TEST(r.err.find(part) != std::string::npos, r.err);
  };
  std::ofstream(d / "sw/sweep.json") << "garbage";
  damaged(d / "sw/sweep.json", "remove it");
  std::ofstream(d / "sw/sweep.json") << std::string(100000, '[') << std::string(100000, ']');
  damaged(d / "sw/sweep.json", "nested deeper");
  fs::remove(d / "sw/sweep.json");
  fs::create_directory(d / "sw/sweep.json");
  damaged(d / "sw/sweep.json", "is a directory");
  fs::remove(d / "sw/sweep.json");
  std::ofstream(d / "sw/sweep.json") << stamp;
  std::ofstream(cell) << good.substr(0, good.size() / 2);  // truncated
  damaged(cell, "remove it");
  std::ofstream(cell) << slurp(other);  // another cell's result: it lies about its cell
  damaged(cell, "holds cell kv2_mean_a0.05_s2, not kv1_mean_a0.05_s2");
  std::ofstream(cell) << R"({"kind": "convert"})";
  damaged(cell, "not a cell result");
  std::ofstream(cell) << good;
  Run again = run_cli(args);
  BOOST_TEST(again.code == 0, again.err);

  // --retime-decoding times every shape again and writes the report with the new times: a time
  // no machine gives (12345.68 ms a sample, in the 2-KV shape's file, which a plain re-run takes
  // as it is) is gone from the file and from the report. Nothing is trained: the cells stay.
  const fs::path kv2 = d / "sw/decode/kv2.json";
  nlohmann::json times = nlohmann::json::parse(slurp(kv2));
  BOOST_TEST_REQUIRE(times.contains("decode_ms_per_sample_b4"));
  times["decode_ms_per_sample_b4"] = 12345.678;
  write_bytes(kv2, times.dump());
  BOOST_TEST_REQUIRE(run_cli(args).code == 0);
  BOOST_TEST(slurp(d / "sw/report.md").find("12345.68") != std::string::npos);  // the plain re-run's report took it
  Run retimed = run_cli(args + " --retime-decoding");
  BOOST_TEST_REQUIRE(retimed.code == 0, retimed.err);
  BOOST_TEST(slurp(kv2).find("12345.678") == std::string::npos);
  BOOST_TEST(slurp(d / "sw/report.md").find("12345.68") == std::string::npos);
  BOOST_TEST(retimed.out.find("| kv2 |") != std::string::npos, retimed.out);
  BOOST_TEST(slurp(cell) == good);
  // in a folder no cell has run in: the times alone, and no report
  Run fresh = run_cli(args.substr(0, args.find(" --out ")) + " --out " + (d / "times") + " --retime-decoding");
  BOOST_TEST_REQUIRE(fresh.code == 0, fresh.err);
  for (const char* f : {"kv4.json", "kv2.json", "kv1.json", "smaller.json"}) BOOST_TEST(fs::exists(d / "times/decode/" + f), f);
  BOOST_TEST(!fs::exists(d / "times/report.md"));
  BOOST_TEST(fresh.out.find("cells not run yet") != std::string::npos, fresh.out);
}

namespace {
test::Precondition release_pass(boost::unit_test::test_unit_id) {
  test::Precondition r(!test::sanitized());
  if (!r) r.message() << "the sanitizer pass runs this code in the hf, gguf and convert suites";
  return r;
}
}  // namespace

// sweep --from on the MHA families research uptrains from: a Pythia-shaped GPT-NeoX directory
// (partial RoPE, parallel residual, biases), an OLMo-2 one (post-norms, q/k norms over the
// projections, whose k_norm is pooled with the heads) and a Gemma one ((1 + w) norms, GeGLU, heads
// of their own width), each read as given, converted to every smaller KV count and uptrained; the
// MHA row's loss is `eval`'s of the directory. The Release pass alone: what this adds to the sweep
// cases is the families' code, which the sanitizer pass runs in the hf, gguf and convert suites
// (k_norm's pooling included); three instrumented sweeps were that pass's 200 s tail.
BOOST_AUTO_TEST_CASE(a_sweep_starts_from_pythia_olmo2_and_gemma_directories, *boost::unit_test::precondition(release_pass)) {
  TempDir d;
  write_bytes(d / "text.txt", slurp(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt").substr(0, 30000));
  std::ofstream(d / "train.json") << R"({"batch_size": 4, "max_iters": 6, "learning_rate": 0.001, "eval_interval": 3, "eval_iters": 1})";
  for (const std::string name : {"gptneox_mha_f32", "olmo2_mha_f32", "gemma_mha_f32"}) {
    BOOST_TEST_CONTEXT(name) {
      const std::string src = test::fixture_path("hf/" + name), out = d / ("sw_" + name), data = d / ("data_" + name);
      const std::string tok = src + (name == "gemma_mha_f32" ? "/tokenizer.model" : "/tokenizer.json");
      Run p = run_cli("prepare --quiet --text " + (d / "text.txt") + " --tokenizer-model " + tok + " --out " + data);
      BOOST_TEST_REQUIRE(p.code == 0, p.err);
      Run r = run_cli("sweep --preset micro --methods mean --quiet --from " + src + " --config " + (d / "train.json") + " --data " + data +
                      " --out " + out);
      BOOST_TEST_REQUIRE(r.code == 0, r.err);
      std::map<std::string, std::vector<std::string>> rows;  // id -> fields
      std::istringstream csv(slurp(out + "/results.csv"));
      for (std::string line; std::getline(csv, line);) {
        std::vector<std::string> f;
        std::stringstream ls(line);
        for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
        rows[f[0]] = f;
      }
      for (const char* id : {"pretrain_mha", "kv2_mean_a0_s1", "kv1_mean_a0_s1"}) BOOST_TEST(rows.count(id) == 1u, id);
      const std::vector<std::string>& h = rows["id"];
      const size_t col = static_cast<size_t>(std::find(h.begin(), h.end(), "val_loss") - h.begin());
      BOOST_TEST_REQUIRE(col < rows["pretrain_mha"].size());
      Run e = run_cli("eval --checkpoint " + src + " --data " + data + " --json");
      BOOST_TEST_REQUIRE(e.code == 0, e.err);
      // the same windows, averaged in batches of another size: equal to float32 summation order
      BOOST_TEST(std::stod(rows["pretrain_mha"][col]) == nlohmann::json::parse(e.out)["loss"].get<double>(), tt::tolerance(1e-6));
      BOOST_TEST(slurp(out + "/report.md").find(name + "` as given") != std::string::npos);
    }
  }
}

// sweep --from: the study on a given MHA model (an imported HF one here). Its MHA row is that model
// as given (no pretraining, its val loss the model's own), every conversion starts from it, and the
// from-scratch rows are off unless --scratch asks for them.
BOOST_AUTO_TEST_CASE(a_sweep_starts_from_a_given_model) {
  TempDir d;
  const std::string text = test::fixture_path("tiny.txt");
  tapelm::hf::import_model(test::fixture_path("hf/llama_mha_f32"), d / "mha.h5");
  std::ofstream(d / "train.json") << R"({"batch_size": 4, "max_iters": 20, "learning_rate": 0.001, "eval_interval": 10, "eval_iters": 1})";
  const std::string from = " --from " + (d / "mha.h5") + " --config " + (d / "train.json") + " --data " + text;
  Run r = run_cli("sweep --preset micro --methods mean,fit --quiet" + from + " --out " + (d / "sw"));
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  std::map<std::string, std::vector<std::string>> rows;  // id -> fields
  std::istringstream csv(slurp(d / "sw/results.csv"));
  for (std::string line; std::getline(csv, line);) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    rows[f[0]] = f;
  }
  BOOST_TEST(rows.count("pretrain_mha") == 1u);
  auto field = [&](const std::string& id, const std::string& column) {  // by the header's names
    const std::vector<std::string>& h = rows["id"];
    const size_t i = static_cast<size_t>(std::find(h.begin(), h.end(), column) - h.begin());
    BOOST_TEST_REQUIRE(i < rows[id].size(), column);
    return rows[id][i];
  };
  BOOST_TEST(field("pretrain_mha", "steps") == "0");  // the model is not trained
  for (const auto& [id, f] : rows) BOOST_TEST(id.rfind("scratch", 0) != 0, id);
  // the MHA row is the given model: `eval` of the source on the same val split gives its loss
  Run e = run_cli("eval --checkpoint " + (d / "mha.h5") + " --data " + text + " --json");
  BOOST_TEST_REQUIRE(e.code == 0, e.err);
  const double row_loss = std::stod(field("pretrain_mha", "val_loss")), eval_loss = nlohmann::json::parse(e.out)["loss"].get<double>();
  BOOST_TEST(row_loss == eval_loss, tt::tolerance(1e-9));
  // converting MHA to MHA changes nothing: its loss before uptraining is the source's
  BOOST_TEST(std::stod(field("kv4_mean_a0_s1", "loss_before")) == row_loss);
  const std::string md = slurp(d / "sw/report.md");
  BOOST_TEST(md.find("`mha.h5` as given") != std::string::npos);
  BOOST_TEST(md.find("no models from scratch") != std::string::npos);
  BOOST_TEST(md.find("smaller MHA") == std::string::npos);  // no model of the study's own recipe
  // the imported Llama model has RoPE: decoding is timed at 4·T too
  BOOST_TEST(md.find("- ... and at 4 × the trained context (") != std::string::npos, md);
  BOOST_TEST(rows["pretrain_mha"].size() == rows["id"].size());
  BOOST_TEST(std::any_of(rows["id"].begin(), rows["id"].end(), [](const std::string& c) { return c.find("_ctx") != std::string::npos; }));
  // and at the serving batch with the low-precision cache (f16: the micro model's head dim is 4)
  BOOST_TEST(rows["id"].back() == "decode_ms_per_sample_b4_kv_f16", rows["id"].back());
  BOOST_TEST(md.find(", f16 cache) |") != std::string::npos);
  BOOST_TEST(md.find(" from scratch (") == std::string::npos);
  // the HF directory itself as --from: one way to open a model everywhere. The same weights in
  // float32 give the same study: every loss of every row equal to the imported checkpoint's, bit for
  // bit (the timings aside).
  for (const std::string& source : {test::fixture_path("hf/llama_mha_f32")}) {
    const std::string out = d / "sw_hf";
    Run o = run_cli("sweep --preset micro --methods mean,fit --quiet --from " + source + " --config " + (d / "train.json") + " --data " +
                    text + " --out " + out);
    BOOST_TEST_REQUIRE(o.code == 0, o.err);
    std::map<std::string, std::vector<std::string>> other;
    std::istringstream oc(slurp(out + "/results.csv"));
    for (std::string line; std::getline(oc, line);) {
      std::vector<std::string> f;
      std::stringstream ls(line);
      for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
      other[f[0]] = f;
    }
    BOOST_TEST_REQUIRE(other.size() == rows.size(), source);
    const std::vector<std::string>& h = rows["id"];
    int compared = 0;
    for (const auto& [id, f] : rows)
      for (size_t i = 0; i < h.size() && id != "id"; i++)
        if (h[i] == "val_loss" || h[i] == "loss_before") {
          BOOST_TEST(other[id].at(i) == f.at(i), source << ": " << id << " " << h[i]);
          compared++;
        }
    BOOST_TEST(compared >= 8);
  }
  // a GQA model, a weights-only model without --config, a corpus tokenized otherwise: one line each
  tapelm::hf::import_model(test::fixture_path("hf/llama_gqa_bf16_spm"), d / "gqa.h5");
  expect_error(run_cli("sweep --preset micro --from " + (d / "gqa.h5") + " --config " + (d / "train.json") + " --data " + text +
                       " --out " + (d / "o")),
               "2 key/value heads for 4 query heads");
  expect_error(run_cli("sweep --preset micro --from " + (d / "mha.h5") + " --data " + text + " --out " + (d / "o")), "--config");
  expect_error(run_cli("sweep --preset micro --config " + (d / "train.json") + " --data " + text + " --out " + (d / "o")), "--from");
  // a damaged model is named as given, before OUT exists (was named as the copy inside OUT)
  const std::string whole = slurp(d / "mha.h5");
  write_bytes(d / "cut.h5", whole.substr(0, whole.size() / 2));
  expect_error(run_cli("sweep --preset micro --from " + (d / "cut.h5") + " --config " + (d / "train.json") + " --data " + text +
                       " --out " + (d / "o")),
               d / "cut.h5");
  BOOST_TEST(!fs::exists(d / "o"));
  // another model under the same path is another study: the finished one is not resumed (it was,
  // exit 0, when the study recorded only the file's name)
  LoadedModel other = load_model(d / "mha.h5");
  other.model->named_parameters().front().second.val().data()[0] += 1.0f;
  write_converted(d / "mha.h5", *other.model, other.tok ? &*other.tok : nullptr, "{}");
  expect_error(run_cli("sweep --preset micro --methods mean,fit --quiet" + from + " --out " + (d / "sw")),
               "holds a sweep from another model (mha.h5 with digest");
}

BOOST_AUTO_TEST_SUITE_END()
