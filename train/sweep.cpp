#include "train/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/dataset.h"
#include "nn/accounting.h"
#include "train/bench.h"
#include "train/plot.h"
#include "train/uptrain.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct Cell {
  std::string id, kind;  // kind: pretrain | convert | scratch
  int64_t kv = 0;
  std::string method;
  double alpha = 0;
  int seed = 1;
  int64_t steps = 0;
};

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string alpha_tag(double a) { return fmt("%g", a); }

std::string fmt_eta(double s) {
  const long t = static_cast<long>(s + 0.5);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  return b;
}

void write_json_atomic(const fs::path& p, const json& j) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out) throw std::runtime_error(p.string() + ": cannot write");
  }
  fs::rename(tmp, p);
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string kv_name(int64_t kv, int64_t H) {
  if (kv == H) return "MHA";
  if (kv == 1) return "MQA";
  return "GQA-" + std::to_string(kv);
}

struct Stat {
  double mean = 0, sd = 0, lo = 0, hi = 0;
  int n = 0;
};

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

}  // namespace

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
  json j;
  if (name == "micro") {  // for tests: seconds
    j = {{"n_layer", 1},  {"n_head", 4},        {"n_embd", 16},     {"block_size", 16}, {"batch_size", 4},
         {"max_iters", 20}, {"warmup_iters", 2}, {"eval_interval", 10}, {"eval_iters", 1}, {"log_interval", 10},
         {"learning_rate", 3e-3}, {"min_lr", 3e-4}};
    p.decode_iters = 1;
    p.decode_batches = {1, 4};
  } else if (name == "tiny") {  // nanoGPT's CPU model, half its steps: about 10 minutes on 2 cores
    j = {{"n_layer", 4},      {"n_head", 4},          {"n_embd", 128},       {"block_size", 64},
         {"batch_size", 12},  {"max_iters", 1000},    {"warmup_iters", 100}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 250}, {"eval_iters", 20},    {"log_interval", 100}};
    p.decode_iters = 9;  // a 0.8M model decodes a sample in milliseconds: more runs to order them
  } else if (name == "small") {  // eight query heads, so KV runs 8, 4, 2, 1: about an hour
    j = {{"n_layer", 4},      {"n_head", 8},          {"n_embd", 256},       {"block_size", 128},
         {"batch_size", 16},  {"max_iters", 1000},    {"warmup_iters", 100}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 300}, {"eval_iters", 10},    {"log_interval", 100}};
  } else if (name == "paper") {  // the long run: nanoGPT shakespeare-char size with 8 heads
    j = {{"n_layer", 6},      {"n_head", 8},           {"n_embd", 384},       {"block_size", 256},
         {"batch_size", 32},  {"max_iters", 5000},     {"warmup_iters", 200}, {"learning_rate", 1e-3},
         {"min_lr", 1e-4},    {"eval_interval", 500},  {"eval_iters", 20},    {"log_interval", 100},
         {"dropout", 0.1}};
    p.headline_seeds = 3;
  } else {
    throw std::invalid_argument("unknown sweep preset \"" + name + "\" (expected tiny, small or paper)");
  }
  j["beta2"] = 0.99;
  j["weight_decay"] = 0.1;
  j["grad_clip"] = 1.0;
  j["checkpoint_interval"] = 250;
  p.pretrain = TrainConfig::from_json(j);
  return p;
}

bool run_sweep(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet,
               const StopToken& stop) {
  const auto t0 = Clock::now();
  Corpus corpus = load_corpus(data_path);
  TrainConfig cfg = p.pretrain;
  cfg.model.vocab_size = corpus.tok.vocab_size();
  cfg.validate();
  const int64_t H = cfg.model.n_head, P = cfg.max_iters;
  const fs::path out(out_dir), runs = out / "runs", cells_dir = out / "cells", decode_dir = out / "decode";
  std::error_code ec;
  for (const fs::path& d : {out, runs, cells_dir, decode_dir}) {
    fs::create_directories(d, ec);
    if (!fs::is_directory(d)) throw std::runtime_error(d.string() + ": cannot create the sweep directory");
  }
  {
    const fs::path stamp = out / "sweep.json";
    json meta{{"preset", p.name}, {"data", fs::path(data_path).filename().string()}, {"config", cfg.to_json()}};
    if (fs::exists(stamp)) {
      json old = read_json(stamp);
      if (old["config"] != meta["config"])
        throw std::runtime_error(out_dir + " holds a sweep with another configuration (preset " +
                                 old.value("preset", std::string("?")) + "); use another --out");
    } else {
      write_json_atomic(stamp, meta);
    }
  }

  // The plan.
  std::vector<Cell> cells;
  cells.push_back({"pretrain_mha", "pretrain", H, "", 0, 1, P});
  const std::vector<int64_t> kvs = sweep_kv_heads(H);
  for (int64_t kv : kvs) {
    const std::vector<std::string> methods = kv == H ? std::vector<std::string>{"mean"} : p.methods;
    for (const std::string& m : methods)
      for (double a : p.fractions) {
        const bool headline = m == "mean" && std::fabs(a - p.headline_fraction) < 1e-12;
        for (int s = 1; s <= (headline ? p.headline_seeds : 1); s++)
          cells.push_back({"kv" + std::to_string(kv) + "_" + m + "_a" + alpha_tag(a) + "_s" + std::to_string(s),
                           "convert", kv, m, a, s, std::llround(a * P)});
      }
  }
  const int64_t scratch_steps = std::llround((1.0 + p.headline_fraction) * P);
  for (int64_t kv : kvs)
    if (kv < H) cells.push_back({"scratch_kv" + std::to_string(kv) + "_s1", "scratch", kv, "scratch", 0, 1, scratch_steps});

  // Work in training steps (an evaluation costs about a few dozen); finished cells count as done.
  const double eval_cost = 40;
  double total = 0, done = 0;
  for (const Cell& c : cells) {
    total += c.steps + eval_cost;
    if (fs::exists(cells_dir / (c.id + ".json"))) done += c.steps + eval_cost;
  }
  const double done_at_start = done;
  if (!quiet)
    std::printf("sweep %s: %zu cells (%ld pretraining steps, KV in {%s}) in %s%s\n", p.name.c_str(), cells.size(),
                static_cast<long>(P),
                [&] {
                  std::string s;
                  for (int64_t k : kvs) s += (s.empty() ? "" : ", ") + std::to_string(k);
                  return s;
                }()
                    .c_str(),
                out_dir.c_str(), done > 0 ? " (resuming: finished cells are skipped)" : "");

  std::map<int64_t, json> decode_cache;
  auto decode_times = [&](int64_t kv) -> json {
    if (decode_cache.count(kv)) return decode_cache[kv];
    const fs::path f = decode_dir / ("kv" + std::to_string(kv) + ".json");
    if (fs::exists(f)) return decode_cache[kv] = read_json(f);
    GPTConfig m = cfg.model;
    m.n_kv_head = kv;
    json j;
    const double Tm1 = static_cast<double>(m.block_size - 1);
    for (int64_t b : p.decode_batches) {
      BenchResult r = bench_decode(m, b, m.block_size, p.decode_iters, 1, 1);
      const std::string k = "b" + std::to_string(b);
      j["decode_ms_per_token_step_" + k] = r.median_s * 1e3;                       // whole batch, one position
      j["decode_ms_per_sample_" + k] = r.median_s * 1e3 * Tm1 / static_cast<double>(b);  // one sequence of T
    }
    write_json_atomic(f, j);
    return decode_cache[kv] = j;
  };

  const std::string pre_ck = (runs / "pretrain_mha" / "checkpoint.h5").string();
  // The converted model before uptraining is the same for every α and seed (but for random init,
  // which depends on the seed): evaluate it once.
  std::map<std::string, double> converted_loss;
  auto conversion_key = [](const Cell& c) {
    return std::to_string(c.kv) + c.method + (c.method == "random" ? std::to_string(c.seed) : "");
  };
  for (const Cell& c : cells)
    if (c.kind == "convert" && fs::exists(cells_dir / (c.id + ".json")))
      converted_loss[conversion_key(c)] = read_json(cells_dir / (c.id + ".json"))["loss_before"].get<double>();
  size_t index = 0;
  for (const Cell& c : cells) {
    index++;
    const fs::path cell_file = cells_dir / (c.id + ".json"), run_dir = runs / c.id;
    if (fs::exists(cell_file)) continue;
    const std::string label = "[" + std::to_string(index) + "/" + std::to_string(cells.size()) + " " + c.id + "] ";
    const bool partial = fs::exists(run_dir / "checkpoint.h5");
    json r{{"id", c.id}, {"kind", c.kind}, {"kv_heads", c.kv}, {"method", c.method}, {"alpha", c.alpha},
           {"seed", c.seed}, {"steps", c.steps}, {"schedule", c.kind == "convert" ? "rewarm" : "cosine"}};
    const auto tc = Clock::now();
    double train_seconds = 0;
    if (c.kind == "pretrain" || c.kind == "scratch") {
      TrainConfig tcfg = cfg;
      tcfg.model.n_kv_head = c.kv;
      tcfg.max_iters = c.steps;
      tcfg.lr_decay_iters = c.steps;
      if (c.kind == "scratch") tcfg.seed = cfg.seed + 1000 * static_cast<uint64_t>(c.kv);
      TrainOptions o;
      o.quiet = quiet;
      o.label = label;
      o.resume = partial;
      o.stop = stop;
      o.final_eval = false;  // evaluated below, outside the timed training
      TrainResult tr = tapelm::train(tcfg, corpus, run_dir.string(), o);
      train_seconds = tr.seconds;
      if (tr.interrupted) return false;
      std::unique_ptr<GPT> m = load_model((run_dir / "checkpoint.h5").string());
      r["val_loss"] = evaluate_split(*m, corpus.val);
      r["loss_before"] = nullptr;
      try {
        plot_run(run_dir.string());
      } catch (const std::exception& e) {
        if (!quiet) std::printf("%sno loss plot: %s\n", label.c_str(), e.what());
      }
    } else {
      UptrainOptions o;
      o.kv_heads = c.kv;
      o.method = parse_convert_method(c.method);
      o.fraction = c.alpha;
      o.seed = static_cast<uint64_t>(c.seed);
      o.resume = partial && c.steps > 0;
      o.quiet = true;
      o.label = label;
      o.stop = stop;
      auto known = converted_loss.find(conversion_key(c));
      if (known != converted_loss.end()) o.known_loss_before = known->second;
      UptrainResult u = uptrain(pre_ck, corpus, run_dir.string(), o);
      converted_loss[conversion_key(c)] = u.loss_before;
      if (stop.requested()) return false;
      train_seconds = u.seconds;
      r["val_loss"] = u.val_loss;
      r["loss_before"] = u.loss_before;
    }
    GPTConfig mc = cfg.model;
    mc.n_kv_head = c.kv;
    const ModelCost cost = model_cost(mc);
    r["perplexity"] = std::exp(r["val_loss"].get<double>());
    r["train_seconds"] = train_seconds;
    r["params"] = cost.params;
    r["forward_flops_per_token"] = cost.forward_flops_per_token;
    r["kv_cache_bytes_per_token"] = cost.kv_cache_bytes_per_token;
    r.update(decode_times(c.kv));
    write_json_atomic(cell_file, r);
    if (c.kind != "pretrain") fs::remove(run_dir / "checkpoint.h5", ec);  // keep metrics; the disk is finite
    done += c.steps + eval_cost;
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    const double rate = (done - done_at_start) / std::max(el, 1e-9);
    if (!quiet)
      std::printf("%sval loss %.4f%s in %.1fs | sweep %.0f%% | ETA %s\n", label.c_str(), r["val_loss"].get<double>(),
                  r["loss_before"].is_number() ? (" (converted: " + fmt("%.4f", r["loss_before"].get<double>()) + ")").c_str() : "",
                  std::chrono::duration<double>(Clock::now() - tc).count(), 100.0 * done / total,
                  fmt_eta((total - done) / std::max(rate, 1e-9)).c_str());
    std::fflush(stdout);
    if (stop.requested()) return false;
  }

  // ---- results.csv ---------------------------------------------------------------------------
  std::vector<json> res;
  for (const Cell& c : cells) res.push_back(read_json(cells_dir / (c.id + ".json")));
  const std::vector<std::string> cols = {"id", "kind", "kv_heads", "method", "alpha", "seed", "steps", "schedule",
                                         "val_loss", "perplexity", "loss_before", "train_seconds", "params",
                                         "forward_flops_per_token", "kv_cache_bytes_per_token"};
  std::vector<std::string> dcols;
  for (int64_t b : p.decode_batches) {
    dcols.push_back("decode_ms_per_token_step_b" + std::to_string(b));
    dcols.push_back("decode_ms_per_sample_b" + std::to_string(b));
  }
  {
    std::ostringstream csv;
    for (size_t i = 0; i < cols.size() + dcols.size(); i++)
      csv << (i ? "," : "") << (i < cols.size() ? cols[i] : dcols[i - cols.size()]);
    csv << "\n";
    for (const json& r : res) {
      bool first = true;
      for (const std::string& k : cols) {
        csv << (first ? "" : ",");
        first = false;
        const json& v = r.contains(k) ? r[k] : json();
        if (v.is_string()) csv << v.get<std::string>();
        else if (!v.is_null()) csv << v.dump();
      }
      for (const std::string& k : dcols) csv << "," << r[k].dump();
      csv << "\n";
    }
    const fs::path f = out / "results.csv";
    std::ofstream(f.string() + ".tmp") << csv.str();
    fs::rename(f.string() + ".tmp", f);
  }

  // ---- report.md and plots ---------------------------------------------------------------------
  auto losses = [&](int64_t kv, const std::string& method, double a) {
    std::vector<double> v;
    for (const json& r : res)
      if (r["kind"] == "convert" && r["kv_heads"] == kv && r["method"] == method && std::fabs(r["alpha"].get<double>() - a) < 1e-12)
        v.push_back(r["val_loss"].get<double>());
    return stat(v);
  };
  auto find = [&](const std::string& id) -> const json& {
    for (const json& r : res)
      if (r["id"] == id) return r;
    throw std::logic_error("no cell " + id);
  };
  const std::string b_lo = "b" + std::to_string(p.decode_batches.front()), b_hi = "b" + std::to_string(p.decode_batches.back());
  const double ha = p.headline_fraction;
  std::ostringstream md;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const json& pre = find("pretrain_mha");
  md << "# GQA/MQA uptraining trade-off — preset `" << p.name << "`\n\n";
  md << "Measured " << date << " on `" << fs::path(data_path).filename().string() << "` (" << corpus.train.size()
     << " train / " << corpus.val.size() << " val tokens). MHA model: " << cfg.model.n_layer << " layers, "
     << H << " heads, d " << cfg.model.n_embd << ", T " << cfg.model.block_size << ", pretrained " << P
     << " steps of batch " << cfg.batch_size << ". Uptraining: α × " << P
     << " steps with the pretraining recipe, fresh AdamW, short warmup then cosine (`rewarm`). Val loss: the whole "
        "val split in non-overlapping windows. Decode: greedy KV-cache generation from a 1-token prompt to T = "
     << cfg.model.block_size << ", median of " << p.decode_iters << " runs; ms per sample = time to generate one sequence "
     << "(batch time / batch). ± is the sample standard deviation over seeds.\n\n";
  md << "## Table 1 — quality and decoding time after uptraining with α = " << ha << " (mean pooling)\n\n";
  md << "| model | KV heads | val loss | perplexity | decode ms/sample (batch " << p.decode_batches.front()
     << ") | decode ms/sample (batch " << p.decode_batches.back() << ") | KV cache bytes/token | params |\n";
  md << "|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const std::string& name, int64_t kv, const Stat& s) {
    const json& any = find("kv" + std::to_string(kv) + "_mean_a0_s1");
    md << "| " << name << " | " << kv << " | " << fmt_stat(s) << " | " << fmt("%.3f", std::exp(s.mean)) << " | "
       << fmt("%.1f", any["decode_ms_per_sample_" + b_lo].get<double>()) << " | "
       << fmt("%.2f", any["decode_ms_per_sample_" + b_hi].get<double>()) << " | " << any["kv_cache_bytes_per_token"]
       << " | " << any["params"] << " |\n";
  };
  row("MHA (pretrained, α = 0)", H, stat({pre["val_loss"].get<double>()}));
  for (int64_t kv : kvs) row(kv_name(kv, H) + (kv == H ? " + α uptraining (same compute)" : ""), kv, losses(kv, "mean", ha));
  for (int64_t kv : kvs)
    if (kv < H) {
      const json& s = find("scratch_kv" + std::to_string(kv) + "_s1");
      row(kv_name(kv, H) + " from scratch (" + std::to_string(scratch_steps) + " steps)", kv, stat({s["val_loss"].get<double>()}));
    }

  md << "\n## Figure 4 — conversion methods (val loss after uptraining with α = " << ha << "; α = 0 in brackets)\n\n| method |";
  for (int64_t kv : kvs)
    if (kv < H) md << " " << kv_name(kv, H) << " |";
  md << "\n|---|";
  for (int64_t kv : kvs)
    if (kv < H) md << "---|";
  md << "\n";
  for (const std::string& m : p.methods) {
    md << "| " << m << " |";
    for (int64_t kv : kvs)
      if (kv < H) md << " " << fmt("%.4f", losses(kv, m, ha).mean) << " (" << fmt("%.4f", losses(kv, m, 0).mean) << ") |";
    md << "\n";
  }
  md << "\n## Figure 5 — uptraining proportion α (mean pooling, val loss)\n\n| α | steps |";
  for (int64_t kv : kvs) md << " " << kv_name(kv, H) << " |";
  md << "\n|---|---|";
  for (size_t i = 0; i < kvs.size(); i++) md << "---|";
  md << "\n";
  for (double a : p.fractions) {
    md << "| " << a << " | " << std::llround(a * P) << " |";
    for (int64_t kv : kvs) md << " " << fmt("%.4f", losses(kv, "mean", a).mean) << " |";
    md << "\n";
  }

  // The paper's findings, checked on these numbers.
  md << "\n## The paper's findings, checked here\n\n";
  auto yes = [](bool b) { return b ? "**yes**" : "**no**"; };
  const double mha = losses(H, "mean", ha).mean;
  for (int64_t kv : kvs) {
    if (kv == H) continue;
    const double mean = losses(kv, "mean", ha).mean, first = losses(kv, "first", ha).mean, rnd = losses(kv, "random", ha).mean;
    md << "- " << kv_name(kv, H) << ": mean pooling beats first head and random init (Fig. 4): " << yes(mean < first && mean < rnd)
       << " (" << fmt("%.4f", mean) << " vs " << fmt("%.4f", first) << ", " << fmt("%.4f", rnd) << ")\n";
    const double a0 = losses(kv, "mean", 0).mean, a1 = losses(kv, "mean", ha).mean, a2 = losses(kv, "mean", p.fractions.back()).mean;
    md << "- " << kv_name(kv, H) << ": uptraining with α = " << ha << " lowers the loss of the converted model (Fig. 5): "
       << yes(a1 < a0) << " (" << fmt("%.4f", a0) << " → " << fmt("%.4f", a1) << "); going to α = " << p.fractions.back()
       << " adds less than the first step did: " << yes(std::fabs(a1 - a2) < std::fabs(a0 - a1)) << " (→ " << fmt("%.4f", a2) << ")\n";
  }
  if (kvs.size() >= 3) {
    const int64_t g = kvs[1];
    const double gap_g0 = losses(g, "mean", 0).mean - pre["val_loss"].get<double>();
    const double gap_m0 = losses(1, "mean", 0).mean - pre["val_loss"].get<double>();
    md << "- At α = 0 the converted " << kv_name(g, H) << " loses less than MQA (GQA is usable before uptraining, Fig. 5): "
       << yes(gap_g0 < gap_m0) << " (+" << fmt("%.4f", gap_g0) << " vs +" << fmt("%.4f", gap_m0) << " over MHA)\n";
    const double gq = losses(g, "mean", ha).mean, mq = losses(1, "mean", ha).mean;
    md << "- After uptraining, " << kv_name(g, H) << " sits between MQA and MHA in quality (Table 1): "
       << yes(gq <= mq && gq >= mha - 0.01) << " (MHA " << fmt("%.4f", mha) << ", " << kv_name(g, H) << " " << fmt("%.4f", gq)
       << ", MQA " << fmt("%.4f", mq) << ")\n";
  }
  {
    bool monotone = true;
    for (size_t i = 1; i < kvs.size(); i++)
      monotone = monotone && find("kv" + std::to_string(kvs[i]) + "_mean_a0_s1")["decode_ms_per_sample_" + b_hi].get<double>() <=
                                 find("kv" + std::to_string(kvs[i - 1]) + "_mean_a0_s1")["decode_ms_per_sample_" + b_hi].get<double>() * 1.02;
    md << "- Decoding time per sample falls as KV heads are removed (batch " << p.decode_batches.back()
       << ", Fig. 6): " << yes(monotone) << "\n";
  }
  md << "\nPlots: `fig_tradeoff.png` (val loss against decode time per sample, Fig. 1/6), `fig_alpha.png` (Fig. 5), "
        "`fig_methods.png` (Fig. 4). Every cell: `results.csv`.\n";

  bool plots = true;
  try {
    const fs::path td = out / "tradeoff.dat", ad = out / "alpha.dat", mdat = out / "methods.dat";
    {
      std::ofstream f(td);
      for (int64_t kv : kvs) {
        const json& d = find("kv" + std::to_string(kv) + "_mean_a0_s1");
        f << d["decode_ms_per_sample_" + b_lo].get<double>() << " " << d["decode_ms_per_sample_" + b_hi].get<double>() << " "
          << losses(kv, "mean", ha).mean << " " << kv_name(kv, H) << "\n";
      }
      std::ofstream a(ad);
      for (double al : p.fractions) {
        a << al;
        for (int64_t kv : kvs) a << " " << losses(kv, "mean", al).mean;
        a << "\n";
      }
      std::ofstream m(mdat);
      m << "kv";
      for (const std::string& me : p.methods) m << " " << me;
      m << "\n";
      for (int64_t kv : kvs)
        if (kv < H) {
          m << kv_name(kv, H);
          for (const std::string& me : p.methods) m << " " << losses(kv, me, ha).mean;
          m << "\n";
        }
    }
    std::ostringstream gp;
    gp << "set terminal pngcairo size 900,560 font 'sans,11'\nset grid\n";
    gp << "set output " << gp_quote((out / "fig_tradeoff.png").string()) << "\n";
    gp << "set title 'Quality vs decoding time (uptrained, alpha = " << ha << ")'\nset xlabel 'decode time per sample (ms)'\n"
       << "set ylabel 'val loss (nats/token)'\nset logscale x\nset key top right\n";
    gp << "plot " << gp_quote(td.string()) << " using 1:3 with linespoints pt 7 ps 1.5 title 'batch " << p.decode_batches.front()
       << "', '' using 1:3:4 with labels offset 0,1 notitle, '' using 2:3 with linespoints pt 5 ps 1.5 title 'batch "
       << p.decode_batches.back() << "', '' using 2:3:4 with labels offset 0,1 notitle\n";
    gp << "unset logscale x\nset output " << gp_quote((out / "fig_alpha.png").string()) << "\n";
    gp << "set title 'Uptraining proportion (mean pooling)'\nset xlabel 'alpha (fraction of pretraining steps)'\n";
    gp << "plot ";
    for (size_t i = 0; i < kvs.size(); i++)
      gp << (i ? ", " : "") << gp_quote(ad.string()) << " using 1:" << i + 2 << " with linespoints lw 2 pt 7 title '"
         << kv_name(kvs[i], H) << "'";
    gp << "\nset output " << gp_quote((out / "fig_methods.png").string()) << "\n";
    gp << "set title 'Conversion methods after uptraining (alpha = " << ha << ")'\nset xlabel ''\n"
       << "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
       << "set key top left\nset yrange [*:*]\n";
    gp << "plot ";
    for (size_t i = 0; i < p.methods.size(); i++)
      gp << (i ? ", " : "") << gp_quote(mdat.string()) << " using " << i + 2 << (i ? "" : ":xtic(1)") << " title columnheader";
    gp << "\n";
    run_gnuplot(gp.str());
    for (const fs::path& f : {td, ad, mdat}) fs::remove(f);
  } catch (const std::exception& e) {
    plots = false;
    md << "\n(Plots not drawn: " << e.what() << ")\n";
  }
  {
    const fs::path f = out / "report.md";
    std::ofstream(f.string() + ".tmp") << md.str();
    fs::rename(f.string() + ".tmp", f);
  }
  if (!quiet) {
    std::printf("\nsweep done in %s: %s/report.md%s\n\n", fmt_eta(std::chrono::duration<double>(Clock::now() - t0).count()).c_str(),
                out_dir.c_str(), plots ? " (plots: fig_tradeoff.png, fig_alpha.png, fig_methods.png)" : "");
    std::string s = md.str();
    const size_t a = s.find("## Table 1"), b = s.find("## Figure 4");
    std::printf("%s", s.substr(a, b - a).c_str());
  }
  return true;
}

}  // namespace tapelm
