#pragma once
// The trade-off study's plan: which cells run (pretrain one MHA model; convert it to every KV in
// {H, H/2, ..., 1} by each method and uptrain for each α; train GQA/MQA from scratch with the same
// compute), and the one place that names a cell.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "train/convert/convert.h"
#include "train/train_config.h"

namespace tapelm {

struct SweepPreset {
  std::string name;
  TrainConfig pretrain;               // the MHA run (n_kv_head = n_head)
  std::vector<double> fractions{0.0, 0.05, 0.1};
  std::vector<std::string> methods = convert_method_names();  // must include mean, the reference
  std::vector<std::string> groupings{"contiguous"};           // must include contiguous
  double headline_fraction = 0.05;
  int headline_seeds = 3;             // every conversion at headline_fraction, repeated
  int64_t calib_tokens = 16384;       // calibration tokens (aligned, fit, similar) from the train split
  int decode_iters = 3;               // timed generations per KV and batch
  std::vector<int64_t> decode_batches{1, 32};
};

/// tiny (≈10 min on 2 cores), small (≈60 min), paper (hours); micro is for tests.
SweepPreset sweep_preset(const std::string& name);

/// The KV head counts of the study: H, H/2, ... while divisible, down to 1.
std::vector<int64_t> sweep_kv_heads(int64_t H);

/// The conversions of a preset as cells name them, in report order: each method with contiguous
/// groups ("fit"), then with each further grouping ("fit+similar"; random init has no groups).
std::vector<std::string> sweep_variants(const SweepPreset& p);
/// A cell's method name split into the conversion method and grouping ("fit+similar" -> fit, similar).
std::pair<ConvertMethod, Grouping> parse_variant(const std::string& v);

enum class CellKind { pretrain, convert, scratch };

/// "pretrain", "convert" or "scratch", as the cell files and results.csv spell it.
std::string cell_kind_name(CellKind k);
/// The inverse of cell_kind_name; throws std::invalid_argument on anything else.
CellKind parse_cell_kind(const std::string& s);

/// One run of the study.
struct Cell {
  CellKind kind = CellKind::convert;
  int64_t kv = 0;
  std::string method;  // a variant (mean, fit+similar, ...) when converted, "scratch" from scratch, empty for the MHA run
  double alpha = 0;    // uptraining steps as a fraction of the pretraining steps
  int seed = 1;
  int64_t steps = 0;

  /// The cell's name: its result file cells/<id>.json and run directory runs/<id>.
  std::string id() const;
  bool operator==(const Cell&) const = default;
};

/// The cells of a preset, in the order they run (the pretrained MHA model first: the others start from it).
struct SweepPlan {
  SweepPreset preset;
  int64_t n_head = 0;          // H
  int64_t pretrain_steps = 0;  // P
  int64_t scratch_steps = 0;   // (1 + headline α) × P: the compute of pretraining plus uptraining
  std::vector<int64_t> kv_heads;
  std::vector<std::string> variants;  // sweep_variants(preset)
  std::vector<Cell> cells;

  /// The plan of a preset; an unknown method or grouping, or one without mean or contiguous, is a
  /// usage Error.
  explicit SweepPlan(const SweepPreset& p);
  /// The cell with these coordinates; throws std::logic_error when the plan has none.
  const Cell& find(CellKind kind, int64_t kv, const std::string& method, double alpha, int seed = 1) const;
  /// The pretrained MHA model.
  const Cell& pretrain() const { return cells.front(); }
  /// The model with kv heads trained from scratch.
  const Cell& scratch(int64_t kv) const { return find(CellKind::scratch, kv, "scratch", 0); }
  /// MHA, MQA or GQA-<kv>.
  std::string kv_name(int64_t kv) const;
};

}  // namespace tapelm
