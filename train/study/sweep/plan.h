#pragma once
// The trade-off study's plan: which cells run (pretrain one MHA model; convert it to every KV in
// {H, H/2, ..., 1} by each method and uptrain for each α; train GQA/MQA from scratch with the same
// compute), and the one place that names a cell.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "train/study/convert/methods.h"
#include "train/study/uptrain.h"
#include "train/train_config.h"

namespace tapelm {

struct SweepPreset {
  std::string name;
  TrainConfig pretrain;               // the MHA run (n_kv_head = n_head)
  std::vector<double> fractions{0.0, 0.05, 0.1};
  std::vector<std::string> methods = method_names();  // must include mean, the reference
  std::vector<std::string> groupings{"contiguous"};           // must include contiguous
  double headline_fraction = 0.05;
  int headline_seeds = 3;             // every conversion at headline_fraction, repeated
  int64_t calib_tokens = 16384;       // calibration tokens (aligned, fit, similar) from the train split
  int decode_iters = 3;               // timed generations per KV and batch
  std::vector<int64_t> decode_batches{1, 16};  // the last is the serving batch of the findings
  bool scratch = true;                // train each GQA/MQA model from scratch too (same compute)
  /// Pretrain a second, smaller MHA model with the same recipe (n_embd and mlp_hidden halved: about
  /// a quarter of the parameters) for the frontier across sizes of the paper's Table 1: is a
  /// converted GQA model better than an MHA model that decodes as fast?
  bool smaller = false;
  /// A checkpoint to start from (sweep --from): the MHA row is this model, not one the study
  /// trains, and pretrain holds its model with the training keys of the user's config (its
  /// max_iters is the P that α multiplies). Empty: the study pretrains its own MHA model.
  std::string from;
  /// Distillation (sweep --distill): at the headline α, every seed, each KV count is also uptrained
  /// with the MHA model as teacher (loss (1 − λ)·CE + λ·T²·KL), by each of distill_methods (the MHA
  /// row by itself, distilled alike); the models from scratch are trained again for the distilled
  /// rows' compute. λ = 0: no distilled cells.
  double distill_lambda = 0;
  double distill_temperature = 2.0;
  std::vector<std::string> distill_methods{"mean", "aligned-fit"};  // those among methods, contiguous groups
  /// Partial uptraining (sweep --train): at the headline α, every seed, each KV count below H is
  /// also uptrained training only these parameters (attention, kv), by partial_method. Empty: none.
  std::vector<Trainable> partial;
  std::string partial_method = "aligned-fit";  // among methods, contiguous groups
};

/// A distilled step's cost in plain training steps: the teacher's forward is about a third of a
/// training step (forward 2N, backward 4N FLOPs per token for N parameters).
inline constexpr double kDistilledStepCost = 4.0 / 3.0;

/// tiny (≈10 min on 2 cores), small (≈60 min), paper (hours); micro is for tests. small and
/// paper pretrain the smaller MHA model too.
SweepPreset sweep_preset(const std::string& name);

/// The KV head counts of the study: H, H/2, ... while divisible, down to 1.
std::vector<int64_t> sweep_kv_heads(int64_t H);

/// The conversions of a preset in report order: each method with contiguous groups, then with each
/// further grouping (a fresh method, random init, has no groups). Unknown names are usage Errors.
std::vector<Variant> sweep_variants(const SweepPreset& p);

enum class CellKind { pretrain, convert, scratch, smaller };

/// "pretrain", "convert", "scratch" or "smaller", as the cell files and results.csv spell it.
std::string cell_kind_name(CellKind k);
/// The inverse of cell_kind_name; anything else is a data Error naming it.
CellKind parse_cell_kind(const std::string& s);

/// One run of the study.
struct Cell {
  CellKind kind = CellKind::convert;
  int64_t kv = 0;
  Variant variant;     // converted cells: the conversion (others: the default, unused)
  double alpha = 0;    // uptraining steps as a fraction of the pretraining steps
  int seed = 1;
  int64_t steps = 0;
  /// Converted: uptrained with the MHA model as teacher. From scratch: trained for the distilled
  /// rows' compute.
  bool distill = false;
  /// Converted: the parameters uptrained (the others frozen as converted).
  Trainable trainable = Trainable::all;

  /// The cell's name: its result file cells/<id>.json and run directory runs/<id>.
  std::string id() const;
  /// The method column of cell files and results.csv: the variant's name (mean, fit+similar, ...)
  /// when converted, "scratch" from scratch, empty for the MHA run.
  std::string method_name() const;
  bool operator==(const Cell&) const = default;
};

/// The cells of a preset, in the order they run (the pretrained MHA model first: the others start from it).
struct SweepPlan {
  SweepPreset preset;
  int64_t n_head = 0;          // H
  int64_t pretrain_steps = 0;  // P
  int64_t scratch_steps = 0;   // (1 + headline α) × P: the compute of pretraining plus uptraining
  int64_t distill_scratch_steps = 0;  // (1 + kDistilledStepCost × headline α) × P: ... distilled uptraining
  std::vector<Variant> distill_variants;  // the conversions distilled (preset.distill_methods among methods)
  Variant partial_variant;                 // the conversion of the partial cells (preset.partial_method)
  std::vector<int64_t> kv_heads;
  std::vector<Variant> variants;  // sweep_variants(preset)
  std::vector<Cell> cells;

  /// The plan of a preset; an unknown method or grouping, or one without mean or contiguous, is a
  /// usage Error.
  explicit SweepPlan(const SweepPreset& p);
  /// The cell with these coordinates; an internal Error when the plan has none.
  const Cell& find(CellKind kind, int64_t kv, const Variant& v, double alpha, int seed = 1, bool distill = false,
                   Trainable trainable = Trainable::all) const;
  /// The pretrained MHA model.
  const Cell& pretrain() const { return cells.front(); }
  /// The model with kv heads trained from scratch.
  const Cell& scratch(int64_t kv, bool distill = false) const { return find(CellKind::scratch, kv, {}, 0, 1, distill); }
  /// Whether the study distils (preset.distill_lambda > 0).
  bool distills() const { return preset.distill_lambda > 0; }
  /// Whether the study uptrains part of the models too (preset.partial).
  bool partial() const { return !preset.partial.empty(); }
  /// The smaller MHA model (preset.smaller).
  const Cell& smaller() const { return find(CellKind::smaller, n_head, {}, 0); }
  /// The model of a cell: the study's, with the cell's kv heads; the smaller MHA model's width.
  GPTConfig model_for(const Cell& c) const;
  /// The training config of the MHA run, the smaller MHA run or a model trained from scratch: the
  /// one place that sets a trained cell's model, steps and seed.
  TrainConfig train_config_for(const Cell& c) const;
  /// How a converted cell converts and uptrains the MHA run: the one place that sets its kv heads,
  /// variant, α and seed (uptrain_config derives the training config from these).
  UptrainOptions uptrain_options_for(const Cell& c) const;
  /// MHA, MQA or GQA-<kv>.
  std::string kv_name(int64_t kv) const;
};

}  // namespace tapelm
