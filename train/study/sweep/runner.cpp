#include "train/study/sweep/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "autograd/omp_wait.h"
#include "autograd/runtime.h"
#include "data/dataset.h"
#include "data/io.h"
#include "data/outdir.h"
#include "train/formats/registry.h"
#include "data/sampler.h"
#include "nn/accounting.h"
#include "train/bench.h"
#include "train/formats/checkpoint.h"
#include "train/study/plot.h"
#include "train/run_dir.h"
#include "train/study/sweep/report.h"
#include "train/study/sweep/results.h"
#include "train/trainer.h"
#include "train/study/uptrain.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_eta(double s) {
  const long t = static_cast<long>(s + 0.5);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  return b;
}

/// Writes beside the file and renames, so that an interrupted sweep never leaves half a file.
void write_atomic(const fs::path& p, const std::string& text) { write_file_atomic(p.string(), text); }

void write_json_atomic(const fs::path& p, const json& j) { write_atomic(p, j.dump(1) + "\n"); }

/// A state file of the sweep (sweep.json, cells/*.json, decode/*.json): a regular file of at most
/// a megabyte holding one JSON object; anything else is a data Error naming the file and saying
/// how to recover (the file is the sweep's own, so a bad one was damaged: remove it and re-run).
json read_json(const fs::path& p) {
  const std::string path = p.string(), fix = " (remove it and run the sweep again to redo what it held)";
  require_regular_file(path, "sweep state file");
  std::error_code ec;
  if (fs::file_size(p, ec) > (1u << 20)) throw Error(ErrorKind::data, path + ": over a megabyte, not a sweep state file" + fix);
  try {
    json j = parse_config_json(read_file_bytes(path, "sweep state file"), path);
    if (!j.is_object()) throw Error(ErrorKind::data, path + ": not a JSON object");
    return j;
  } catch (const Error& e) {
    throw Error(ErrorKind::data, std::string(e.what()) + fix);
  }
}

/// A finished cell's result file: it must hold that cell's result.
CellResult read_cell(const fs::path& p, const Cell& c) {
  const json j = read_json(p);
  CellResult r;
  try {
    r = CellResult::from_json(j);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::data, p.string() + ": not a cell result (" + cut_for_message(e.what(), 160) +
                                     "); remove it and run the sweep again to redo the cell");
  }
  if (!(r.cell == c))
    throw Error(ErrorKind::data, p.string() + ": holds cell " + cut_for_message(r.cell.id()) + ", not " + c.id() +
                                     "; remove it and run the sweep again to redo the cell");
  return r;
}

/// OUT/{runs,cells,decode}/ and OUT/sweep.json, locked for the whole sweep (OUT/.lock; each cell's
/// run directory has its own lock, a separate file, so they do not collide); refuses a directory
/// that holds another configuration, or a file of the sweep's names that tapelm did not write.
struct SweepDirs {
  OutputFolder folder;  // first: a second sweep on OUT fails before anything in it is touched
  fs::path out, runs, cells, decode;

  SweepDirs(const std::string& out_dir, const json& stamp_meta)
      : folder(out_dir, "sweep directory", ErrorKind::io), out(out_dir), runs(out / "runs"), cells(out / "cells"), decode(out / "decode") {
    folder.claim({"sweep.json", "runs", "cells", "decode"}, "sweep");
    folder.refuse_foreign(report_files(), "sweep");  // claimed when they are written, at the end
    folder.keep();
    std::error_code ec;
    for (const fs::path& d : {out, runs, cells, decode}) {
      fs::create_directories(d, ec);
      if (!fs::is_directory(d)) throw Error(ErrorKind::io, d.string() + ": cannot create the sweep directory");
    }
    const fs::path stamp = out / "sweep.json";
    if (fs::exists(stamp) || fs::is_symlink(stamp)) {
      json old = read_json(stamp);
      const json& now = stamp_meta["config"];
      if (old.contains("config") && old["config"].is_object() && now.contains("from_digest") &&
          old["config"].value("from_digest", std::string()) != now["from_digest"].get<std::string>())
        throw Error(ErrorKind::usage, out_dir + " holds a sweep from another model (" + old["config"].value("from", std::string("?")) +
                                          " with digest " + old["config"].value("from_digest", std::string("none")) +
                                          "; --from has digest " + now["from_digest"].get<std::string>() + "); use another --out");
      // a key added to the training config since that sweep began matches when it holds its default
      json now_cmp = now;
      const json defaults = TrainConfig().to_json();
      if (old.contains("config") && old["config"].is_object())
        for (const auto& [k, v] : now.items())
          if (!old["config"].contains(k) && defaults.contains(k) && defaults[k] == v) now_cmp.erase(k);
      if (!old.contains("config") || old["config"] != now_cmp)
        throw Error(ErrorKind::usage, out_dir + " holds a sweep with another configuration (preset " +
                                 old.value("preset", std::string("?")) + "); use another --out");
      check_distill_stamp(out_dir, stamp, std::move(old), stamp_meta);
    } else {
      write_json_atomic(stamp, stamp_meta);
    }
  }
  /// Distilled cells of one λ and T per directory: a study begun without them takes them on (the
  /// stamp records them), one with others is refused.
  static void check_distill_stamp(const std::string& out_dir, const fs::path& stamp, json old, const json& now) {
    if (!now.contains("distill")) return;
    if (!old.contains("distill")) {
      old["distill"] = now["distill"];
      write_json_atomic(stamp, old);
    } else if (old["distill"] != now["distill"]) {
      throw Error(ErrorKind::usage, out_dir + " holds distilled cells with " + old["distill"].dump() + ", not " + now["distill"].dump() +
                                        "; use another --out");
    }
  }
  fs::path cell_file(const Cell& c) const { return cells / (c.id() + ".json"); }
  /// What the report writes in OUT, each whole.
  static std::vector<std::string> report_files() {
    return {"report.md", "results.csv", "fig_tradeoff.png", "fig_alpha.png", "fig_methods.png", "fig_kvbytes.png"};
  }
  bool finished(const Cell& c) const { return fs::exists(cell_file(c)); }
};

/// The first and third quartiles of v (linear interpolation between order statistics).
std::pair<double, double> quartiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t i = static_cast<size_t>(pos);
    const double f = pos - static_cast<double>(i);
    return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
  };
  return {at(0.25), at(0.75)};
}

/// The decoding times' file name of a cell's model shape: kv<KV> for the study's model, smaller for
/// the smaller MHA model.
std::string shape_key(const Cell& c) { return c.kind == CellKind::smaller ? "smaller" : "kv" + std::to_string(c.kv); }

/// Decoding times of every model shape of the study (each KV count; the smaller MHA model),
/// measured once and kept in OUT/decode/<shape>.json (every cell of a shape decodes alike).
/// Measured at the serving shape — a prompt of T/2 tokens prefilled, then T/2 greedy steps — at
/// each batch size, and for a RoPE model also at 4·T (prompt 2·T, the serving batch): every shape
/// in turn, run after run (so that a slow spell of the machine hits them alike), repeated until
/// every neighbouring pair of KV counts has interquartile ranges apart, or the rounds or the time
/// run out.
class DecodeTimer {
 public:
  DecodeTimer(const SweepPlan& plan, fs::path dir) : plan_(plan), dir_(std::move(dir)) {
    for (int64_t kv : plan.kv_heads) shapes_.push_back({kv, plan.find(CellKind::convert, kv, Variant{}, 0)});
    if (plan.preset.smaller) shapes_.push_back({0, plan.smaller()});
  }

  const ShapeDecodeTimes& times(const Cell& c) {
    const std::string key = shape_key(c);
    auto known = cache_.find(key);
    if (known != cache_.end()) return known->second;
    const fs::path f = dir_ / (key + ".json");
    if (fs::exists(f)) {
      try {
        ShapeDecodeTimes t = ShapeDecodeTimes::from_json(read_json(f));
        if (complete(t, c)) return cache_[key] = t;  // else timed before this study's shapes were: again
      } catch (const nlohmann::json::exception& e) {
        throw Error(ErrorKind::data, f.string() + ": not a decode time file (" + cut_for_message(e.what(), 160) + ")");
      }
    }
    measure_all();
    return cache_.at(key);
  }

  /// Every shape timed again with this build, whatever OUT/decode holds; the times by shape key.
  /// With progress, a line after each batch and context.
  const std::map<std::string, ShapeDecodeTimes>& retime(bool progress) {
    progress_ = progress;
    measure_all();
    return cache_;
  }

  /// The shape keys in the order the study lists them (KV counts falling, then the smaller model).
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const Shape& s : shapes_) k.push_back(shape_key(s.cell));
    return k;
  }

 private:
  struct Shape {
    int64_t kv;  // 0: not on the KV ladder (the smaller model)
    Cell cell;
  };
  using Series = std::map<std::string, std::vector<double>>;

  int64_t long_context() const {
    const GPTConfig& m = plan_.preset.pretrain.model;
    return m.pos == PosKind::Rope ? 4 * m.block_size : 0;
  }
  bool complete(const ShapeDecodeTimes& t, const Cell& c) const {
    for (int64_t b : plan_.preset.decode_batches)
      if (!t.decode.count(b)) return false;
    // times that do not say what they ran with (an older sweep's) are taken again
    return !t.timed_with.empty() && t.long_context == long_context() &&
           (long_context() == 0 || t.decode_long.count(plan_.preset.decode_batches.back())) &&
           t.lowkv_cache == to_string(lowkv(c)) && t.decode_lowkv.count(plan_.preset.decode_batches.back());
  }
  /// The KV cache of Table 1's low-precision column for a cell's model: q8 where its head dimension
  /// allows it (its quality cost was ≤ 0.0001 nats on the tiny study, docs/tiny/kvcache), else f16
  /// (the smaller MHA model's half-width heads may not).
  KvType lowkv(const Cell& c) const { return plan_.model_for(c).head_dim() % kQ8Block == 0 ? KvType::q8 : KvType::f16; }

  /// Every shape at one batch and context, interleaved; the median and quartiles per shape.
  std::map<std::string, DecodeTime> measure(int64_t b, int64_t context, bool low_cache = false) {
    const int64_t P = std::max<int64_t>(1, context / 2);
    const int min_rounds = std::max(3, plan_.preset.decode_iters), max_rounds = 5 * min_rounds;
    Series sample_ms, step_ms;
    const auto t0 = Clock::now();
    for (int round = 0; round < max_rounds; round++) {
      for (const Shape& s : shapes_) {
        GPTConfig m = plan_.model_for(s.cell);
        m.block_size = std::max(m.block_size, context);  // RoPE: the tables reach the long context
        DecodeShape shape{b, P, context};
        shape.kv_cache = low_cache ? lowkv(s.cell) : KvType::f32;
        const DecodeResult r = bench_decode_shape(m, shape, 1, round == 0 ? 1 : 0, 1);
        const std::string k = shape_key(s.cell);
        step_ms[k].push_back(r.step_median_s * 1e3);
        sample_ms[k].push_back((r.prefill_median_s + r.step_median_s * static_cast<double>(context - P)) * 1e3 / static_cast<double>(b));
      }
      if (round + 1 < min_rounds) continue;
      bool separated = true;
      for (size_t i = 1; i < shapes_.size(); i++) {
        if (shapes_[i].kv == 0) continue;
        const auto [a1, a3] = quartiles(sample_ms[shape_key(shapes_[i - 1].cell)]);
        const auto [c1, c3] = quartiles(sample_ms[shape_key(shapes_[i].cell)]);
        separated = separated && (c3 < a1 || c1 > a3);
      }
      if (separated || seconds_since(t0) > 60) break;
    }
    if (progress_) {
      std::printf("decoding timed: batch %ld, context %ld%s, %zu rounds of %zu shapes in %.1fs\n", static_cast<long>(b),
                  static_cast<long>(context), low_cache ? ", the low-precision cache" : "", sample_ms.begin()->second.size(), shapes_.size(),
                  seconds_since(t0));
      std::fflush(stdout);
    }
    std::map<std::string, DecodeTime> out;
    for (auto& [k, s] : sample_ms) {
      std::vector<double>& st = step_ms[k];
      std::sort(s.begin(), s.end());
      std::sort(st.begin(), st.end());
      const size_t n = s.size();
      auto med = [n](const std::vector<double>& v) { return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); };
      const auto [q1, q3] = quartiles(s);
      out[k] = {med(st), med(s), q1, q3, static_cast<int>(n)};
    }
    return out;
  }

  void measure_all() {
    std::map<std::string, ShapeDecodeTimes> d;
    const int64_t T = plan_.preset.pretrain.model.block_size, L = long_context();
    for (int64_t b : plan_.preset.decode_batches)
      for (auto& [k, t] : measure(b, T)) d[k].decode[b] = t;
    if (L > 0) {
      const int64_t b = plan_.preset.decode_batches.back();
      for (auto& [k, t] : measure(b, L)) {
        d[k].long_context = L;
        d[k].decode_long[b] = t;
      }
    }
    const int64_t b_hi = plan_.preset.decode_batches.back();
    for (auto& [k, t] : measure(b_hi, T, true)) d[k].decode_lowkv[b_hi] = t;
    const std::string with = std::to_string(get_num_threads()) + " threads, OpenMP wait: " + omp_wait_description();
    for (const Shape& s : shapes_) {
      d[shape_key(s.cell)].lowkv_cache = to_string(lowkv(s.cell));
      d[shape_key(s.cell)].timed_with = with;
    }
    for (auto& [k, t] : d) {
      write_json_atomic(dir_ / (k + ".json"), t.to_json());
      cache_[k] = t;
    }
  }

  const SweepPlan& plan_;
  fs::path dir_;
  std::vector<Shape> shapes_;
  std::map<std::string, ShapeDecodeTimes> cache_;
  bool progress_ = false;
};

/// The converted model before uptraining is the same for every α and seed (but for random init,
/// which depends on the seed): it is evaluated once.
std::string conversion_key(const Cell& c) {
  return std::to_string(c.kv) + c.variant.name() + (c.variant.method->fresh ? "_s" + std::to_string(c.seed) : "");
}

/// What running one cell gives.
struct CellRun {
  bool interrupted = false;
  double val_loss = 0, train_seconds = 0;
  std::optional<double> loss_before, convert_seconds;
  std::map<std::string, double> val_loss_kv;
  std::vector<int64_t> kv_layers;  // a per-layer conversion's allocation
};

/// The val loss of the cell's model with K and V rounded as an f16 and a q8 KV cache store them
/// (q8: when the head dimension is a multiple of 32), for the study in bytes per token.
std::map<std::string, double> kv_cache_losses(const fs::path& checkpoint, const Corpus& corpus, int64_t max_tokens) {
  std::map<std::string, double> out;
  std::unique_ptr<GPT> m = load_model(checkpoint.string()).model;
  for (KvType t : {KvType::f16, KvType::q8}) {
    if (t == KvType::q8 && m->config().head_dim() % kQ8Block != 0) continue;
    m->round_kv_as(t);
    out[to_string(t)] = evaluate_split(*m, corpus.val, false, max_tokens);
  }
  return out;
}

/// Pretraining or training from scratch, then the val split (final_eval_tokens) outside the timed training.
CellRun train_cell(const Cell& c, const SweepPlan& plan, const Corpus& corpus, const fs::path& run_dir,
                   const std::string& label, bool quiet, const StopToken& stop) {
  const TrainConfig tcfg = plan.train_config_for(c);
  TrainOptions o;
  o.quiet = quiet;
  o.label = label;
  o.resume = fs::exists(run_dir / "checkpoint.h5");
  o.stop = stop;
  o.final_eval = false;  // evaluated below, outside the timed training
  TrainResult tr = tapelm::train(tcfg, corpus, run_dir.string(), o);
  if (tr.interrupted) return {.interrupted = true};
  std::unique_ptr<GPT> m = load_model((run_dir / "checkpoint.h5").string()).model;
  CellRun r{.val_loss = evaluate_split(*m, corpus.val, false, tcfg.final_eval_tokens), .train_seconds = tr.seconds};
  try {
    plot_run(run_dir.string());
  } catch (const std::exception& e) {
    if (!quiet) std::printf("%sno loss plot: %s\n", label.c_str(), e.what());
  }
  return r;
}

/// The MHA row of a study that starts from a given model: the checkpoint copied as the row's own
/// (the conversions read it from there, as they read a pretrained one), then the val split (final_eval_tokens).
CellRun source_cell(const std::string& from, const Corpus& corpus, const fs::path& run_dir, int64_t max_tokens) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path ck = run_dir / "checkpoint.h5";
  if (formats::starts_with_hdf5(from)) {  // a checkpoint: copied as it is
    commit_files({{ck.string(), [&](const std::string& tmp) {
                     fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
                     if (ec) throw Error(ErrorKind::io, run_dir.string() + ": cannot copy " + from + ": " + ec.message());
                   }}});
  } else {  // another program's model: imported, as `tapelm import` writes it
    formats::open_model(from).write_imported(ck.string());
  }
  std::unique_ptr<GPT> m = load_model(ck.string()).model;
  return {.val_loss = evaluate_split(*m, corpus.val, false, max_tokens)};
}

/// A given model and the corpus must agree: the corpus tokenized by the model's tokenizer (when the
/// checkpoint holds one), its ids within the model's vocabulary.
void check_source(const std::string& from, const Corpus& corpus, const std::string& data_path, int64_t vocab_size) {
  if (corpus.tok.vocab_size() > vocab_size)
    throw Error(ErrorKind::data, data_path + ": its tokenizer has " + std::to_string(corpus.tok.vocab_size()) + " ids, more than the " +
                                     std::to_string(vocab_size) + " of " + from + "'s vocabulary (prepare it with the model's tokenizer)");
  const formats::OpenedModel m = formats::open_model(from);
  m.load();  // a damaged model is refused here, named as given, before OUT exists
  if (m.tok && !(*m.tok == corpus.tok))
    throw Error(ErrorKind::data, data_path + ": tokenized otherwise than by " + from +
                                     "'s tokenizer (prepare it with --tokenizer-model and the model's tokenizer file)");
}

/// Converting the pretrained checkpoint and uptraining it; known_loss_before skips re-evaluating the conversion.
CellRun uptrain_cell(const Cell& c, const SweepPlan& plan, const std::string& pretrained, const Corpus& corpus,
                     const fs::path& run_dir, const std::string& label, std::optional<double> known_loss_before,
                     const StopToken& stop) {
  UptrainOptions o = plan.uptrain_options_for(c);
  o.resume = fs::exists(run_dir / "checkpoint.h5") && c.steps > 0;
  o.quiet = true;
  o.label = label;
  o.stop = stop;
  if (known_loss_before) o.known_loss_before = *known_loss_before;
  UptrainResult u = uptrain(pretrained, corpus, run_dir.string(), o);
  if (stop.requested()) return {.interrupted = true, .loss_before = u.loss_before};
  return {.val_loss = u.val_loss, .train_seconds = u.seconds, .loss_before = u.loss_before,
          .convert_seconds = u.convert_seconds, .kv_layers = u.config.model.layer_kv_heads};
}

}  // namespace

namespace {

// Progress in training steps (an evaluation costs about a few dozen); finished cells count as done.
struct SweepProgress {
  static constexpr double kEvalCost = 40;
  Clock::time_point t0 = Clock::now();
  double total = 0, done = 0, done_at_start = 0;
  SweepProgress(const SweepPlan& plan, const SweepDirs& dirs) {
    for (const Cell& c : plan.cells) {
      total += cost(c);
      if (dirs.finished(c)) done += cost(c);
    }
    done_at_start = done;
  }
  // A cell's cost in training steps: a distilled step runs the teacher's forward too.
  static double cost(const Cell& c) {
    return static_cast<double>(c.steps) * (c.distill && c.kind == CellKind::convert ? kDistilledStepCost : 1.0) + kEvalCost;
  }
  // "sweep 42% | ETA 3m10s" after a cell.
  std::string advance(const Cell& c) {
    done += cost(c);
    const double rate = (done - done_at_start) / std::max(seconds_since(t0), 1e-9);
    char b[96];
    std::snprintf(b, sizeof b, "sweep %.0f%% | ETA %s", 100.0 * done / total, fmt_eta((total - done) / std::max(rate, 1e-9)).c_str());
    return b;
  }
};

// One study run: its corpus, plan and directories, checked before anything is written.
class SweepRun {
 public:
  SweepRun(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet, const StopToken& stop)
      : p_(p), data_path_(data_path), out_dir_(out_dir), quiet_(quiet), stop_(stop), corpus_(load_corpus(data_path)),
        preset_(with_vocab(p, corpus_)), plan_(preset_),  // an unknown method is refused before OUT is touched
        dirs_(checked_dirs()), progress_(plan_, dirs_), decode_(plan_, dirs_.decode) {}

  // Runs every unfinished cell; false when a signal stopped the study.
  bool run_cells() {
    if (!quiet_) announce();
    const std::string pre_ck = (dirs_.runs / plan_.pretrain().id() / "checkpoint.h5").string();
    read_converted_losses();
    size_t index = 0;
    for (const Cell& c : plan_.cells) {
      index++;
      if (dirs_.finished(c)) continue;
      const std::string label = "[" + std::to_string(index) + "/" + std::to_string(plan_.cells.size()) + " " + c.id() + "] ";
      if (!run_cell(c, pre_ck, label) || stop_.requested()) return false;
    }
    return true;
  }

  // results.csv, report.md and the plots of every cell.
  void write_report();

  // Every model shape's decoding timed again with this build, printed; the report written again
  // with the new times when every cell has run. Trains nothing.
  void retime_decoding() {
    if (!quiet_)
      std::printf("sweep %s: timing the decoding of every model shape again in %s (%s)\n", p_.name.c_str(), out_dir_.c_str(),
                  omp_wait_description().c_str());
    const std::map<std::string, ShapeDecodeTimes>& t = decode_.retime(!quiet_);
    const std::vector<int64_t>& batches = plan_.preset.decode_batches;
    const long b_hi = static_cast<long>(batches.back());
    const ShapeDecodeTimes& first = t.at(decode_.keys().front());
    std::printf("\n| shape |");
    for (int64_t b : batches) std::printf(" ms/sample, batch %ld |", static_cast<long>(b));
    std::printf(" ms/step, batch %ld |", b_hi);
    if (first.long_context > 0) std::printf(" ms/sample, batch %ld, context %ld |", b_hi, static_cast<long>(first.long_context));
    std::printf(" ms/sample, batch %ld, low-precision cache |\n|---|", b_hi);
    for (size_t i = 0; i < batches.size() + (first.long_context > 0 ? 3 : 2); i++) std::printf("---:|");
    std::printf("\n");
    for (const std::string& k : decode_.keys()) {
      const ShapeDecodeTimes& d = t.at(k);
      std::printf("| %s |", k.c_str());
      for (int64_t b : batches) std::printf(" %.2f |", d.decode.at(b).ms_per_sample);
      std::printf(" %.3f |", d.decode.at(batches.back()).ms_per_token_step);
      if (first.long_context > 0) std::printf(" %.2f |", d.decode_long.at(batches.back()).ms_per_sample);
      std::printf(" %.2f (%s) |\n", d.decode_lowkv.at(batches.back()).ms_per_sample, d.lowkv_cache.c_str());
    }
    size_t missing = 0;
    for (const Cell& c : plan_.cells) missing += dirs_.finished(c) ? 0 : 1;
    if (missing == 0) {
      write_report();
    } else {
      std::printf("\n%zu of %zu cells not run yet: report.md is written, with these times, when the sweep has run them\n", missing,
                  plan_.cells.size());
    }
  }

 private:
  static SweepPreset with_vocab(const SweepPreset& p, const Corpus& corpus) {
    SweepPreset preset = p;
    if (p.from.empty()) preset.pretrain.model.vocab_size = corpus.tok.vocab_size();
    preset.pretrain.validate();
    return preset;
  }

  SweepDirs checked_dirs() const {
    const TrainConfig& cfg = preset_.pretrain;
    if (!p_.from.empty()) check_source(p_.from, corpus_, data_path_, p_.pretrain.model.vocab_size);
    // so is a corpus too short to train on
    check_window_fits(corpus_.train.size(), cfg.model.block_size, data_path_ + ": the train split");
    check_window_fits(corpus_.val.size(), cfg.model.block_size, data_path_ + ": the val split");
    json stamp{{"preset", p_.name}, {"data", data_name()}, {"config", cfg.to_json()}};
    if (!p_.from.empty()) {  // by name and content: another model under the same path is another study
      stamp["config"]["from"] = fs::path(p_.from).filename().string();
      stamp["config"]["from_digest"] = formats::model_digest(p_.from, "sweep --from");
    }
    if (!p_.scratch) stamp["config"]["scratch"] = false;
    // beside the config: distilled cells join a study begun without them
    if (plan_.distills()) stamp["distill"] = {{"lambda", p_.distill_lambda}, {"temperature", p_.distill_temperature}};
    return SweepDirs(out_dir_, stamp);
  }

  std::string data_name() const { return fs::path(data_path_).filename().string(); }

  void announce() const {
    std::string kvs;
    for (int64_t k : plan_.kv_heads) kvs += (kvs.empty() ? "" : ", ") + std::to_string(k);
    std::printf("sweep %s: %zu cells (%ld pretraining steps, KV in {%s}) in %s%s\n", p_.name.c_str(), plan_.cells.size(),
                static_cast<long>(plan_.pretrain_steps), kvs.c_str(), out_dir_.c_str(),
                progress_.done > 0 ? " (resuming: finished cells are skipped)" : "");
  }

  // The converted models' losses finished cells measured: a conversion is evaluated once per key.
  void read_converted_losses() {
    for (const Cell& c : plan_.cells)
      if (c.kind == CellKind::convert && dirs_.finished(c)) {
        const CellResult r = read_cell(dirs_.cell_file(c), c);
        if (!r.loss_before)
          throw Error(ErrorKind::data, dirs_.cell_file(c).string() + ": a converted cell without loss_before; remove it and run "
                                                                      "the sweep again to redo the cell");
        converted_loss_[conversion_key(c)] = *r.loss_before;
      }
  }

  // Runs one cell and writes its result; false when a signal interrupted it.
  bool run_cell(const Cell& c, const std::string& pre_ck, const std::string& label) {
    const fs::path run_dir = dirs_.runs / c.id();
    const auto tc = Clock::now();
    CellRun run;
    if (c.kind == CellKind::convert) {
      auto known = converted_loss_.find(conversion_key(c));
      run = uptrain_cell(c, plan_, pre_ck, corpus_, run_dir, label,
                         known == converted_loss_.end() ? std::nullopt : std::optional<double>(known->second), stop_);
      if (run.loss_before) converted_loss_[conversion_key(c)] = *run.loss_before;
    } else if (c.kind == CellKind::pretrain && !p_.from.empty()) {
      run = source_cell(p_.from, corpus_, run_dir, plan_.preset.pretrain.final_eval_tokens);
    } else {
      run = train_cell(c, plan_, corpus_, run_dir, label, quiet_, stop_);
    }
    if (run.interrupted) return false;
    run.val_loss_kv = kv_cache_losses(run_dir / "checkpoint.h5", corpus_, plan_.preset.pretrain.final_eval_tokens);
    const CellResult r = result_of(c, run);
    write_json_atomic(dirs_.cell_file(c), r.to_json());
    std::error_code ec;
    if (c.kind == CellKind::convert || c.kind == CellKind::scratch)
      fs::remove(run_dir / "checkpoint.h5", ec);  // keep metrics (and the two MHA models); the disk is finite
    const std::string where = progress_.advance(c);
    if (!quiet_) {
      char converted[48] = "";
      if (r.loss_before) std::snprintf(converted, sizeof converted, " (converted: %.4f)", *r.loss_before);
      std::printf("%sval loss %.4f%s in %.1fs | %s\n", label.c_str(), r.val_loss, converted, seconds_since(tc), where.c_str());
    }
    std::fflush(stdout);
    return true;
  }

  CellResult result_of(const Cell& c, const CellRun& run) const {
    GPTConfig model = plan_.model_for(c);
    if (!run.kv_layers.empty()) model.set_kv_heads(run.kv_layers);  // a per-layer allocation's own costs
    const ModelCost cost = model_cost(model);
    CellResult r{.cell = c,
                 .schedule = c.kind == CellKind::convert ? "rewarm" : "cosine",
                 .val_loss = run.val_loss,
                 .val_loss_kv = run.val_loss_kv,
                 .loss_before = run.loss_before,
                 .perplexity = std::exp(run.val_loss),
                 .train_seconds = run.train_seconds,
                 .convert_seconds = run.convert_seconds,
                 .kv_layers = run.kv_layers,
                 .params = cost.params,
                 .forward_flops_per_token = cost.forward_flops_per_token,
            .kv_cache_bytes_per_token = cost.kv_cache_bytes_per_token};
    r.set_decode_times(decode_.times(c));
    return r;
  }

  const SweepPreset& p_;
  std::string data_path_, out_dir_;
  bool quiet_;
  StopToken stop_;
  Corpus corpus_;
  SweepPreset preset_;
  SweepPlan plan_;
  SweepDirs dirs_;
  SweepProgress progress_;
  mutable DecodeTimer decode_;
  std::map<std::string, double> converted_loss_;
};

void SweepRun::write_report() {
  std::vector<CellResult> results;
  for (const Cell& c : plan_.cells) {
    // the decoding times of the cell's shape as the study measured them last (a cell file from
    // before the study timed the serving batch or the long context has older ones)
    CellResult r = read_cell(dirs_.cell_file(c), c);
    r.set_decode_times(decode_.times(c));
    results.push_back(std::move(r));
  }
  dirs_.folder.claim(SweepDirs::report_files(), "sweep");  // none changed by hand since it was written
  std::ostringstream csv;
  write_results_csv(csv, plan_, results);
  write_atomic(dirs_.out / "results.csv", csv.str());
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::ostringstream md;
  write_report_md(md, plan_, results, {data_name(), static_cast<size_t>(corpus_.train.size()), static_cast<size_t>(corpus_.val.size()), date});
  bool plots = true;
  try {
    write_plots(out_dir_, plan_, results);
  } catch (const std::exception& e) {
    plots = false;
    md << "\n(Plots not drawn: " << e.what() << ")\n";
  }
  write_atomic(dirs_.out / "report.md", md.str());
  std::vector<std::string> written;
  for (const std::string& f : SweepDirs::report_files())
    if (fs::exists(dirs_.out / f)) written.push_back(f);
  dirs_.folder.record(written);
  if (quiet_) return;
  std::printf("\nsweep done in %s: %s/report.md%s\n\n", fmt_eta(seconds_since(progress_.t0)).c_str(), out_dir_.c_str(),
              plots ? " (plots: fig_tradeoff.png, fig_alpha.png, fig_methods.png)" : "");
  const std::string s = md.str();
  const size_t a = s.find("## Table 1"), b = s.find("## Figure 4");
  std::printf("%s", s.substr(a, b - a).c_str());
}

}  // namespace

bool run_sweep(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet,
               const StopToken& stop) {
  SweepRun run(p, data_path, out_dir, quiet, stop);
  if (!run.run_cells()) return false;
  run.write_report();
  return true;
}

void retime_sweep_decoding(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet) {
  SweepRun run(p, data_path, out_dir, quiet, StopToken());
  run.retime_decoding();
}

}  // namespace tapelm
