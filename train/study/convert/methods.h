#pragma once
// The conversion methods as a table: one row per method says every decision the conversion
// pipeline (convert.h) makes for it, and a variant pairs a method with a grouping. This file is
// the one place where method and grouping names are spelled.
//
// The GQA paper's methods (Ainslie et al. 2023, §2.1): the mean of a group's K/V heads, its first
// head, or a fresh random init. Beyond them:
//   mean-norm    mean pooling, each pooled head rescaled to the average norm of its members;
//   aligned      the members rotated onto a common reference first (generalised Procrustes on
//                calibration activations, folded into wq/wk and wv/wo so the MHA model is
//                unchanged; Jin et al. 2024, arXiv 2412.20677), then mean pooling;
//   fit          the merged wk and wv that change the members' attention scores and outputs least
//                on calibration inputs (a closed-form weighted mean with head_dim × head_dim weights);
//   aligned-fit  the alignment folded in first, then fit.
// Groupings: contiguous (kv heads g·r … (g+1)·r−1), per-layer (contiguous, as many groups in each
// layer as a budget allocates: budget.h) or similar (heads with alike aligned K/V
// activations, found by a swap search and made contiguous by a function-preserving permutation).
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "autograd/names.h"
#include "nn/rng.h"

namespace tapelm {

/// Pools one group: `rep` member blocks of `block` floats each, stored one after another, into
/// the group's one block `out`. `weight` is false for a bias block.
using PoolFn = void (*)(const float* members, int64_t rep, int64_t block, float* out, bool weight, Rng& rng);

/// A conversion method: what each step of the pipeline does for it.
struct MethodRow {
  std::string name;
  bool aligns;    // rotate each group's members onto a common reference first (heads.h)
  PoolFn pool;    // how a group's K and V blocks (weights and biases) become one
  bool rescales;  // scale each pooled K/V head to its members' average norm (a bias by its weight's factor)
  bool fits;      // replace the pooled K/V by the least-squares merge (merge.h)
  bool fresh;     // the new K/V ignore the source's: groups of one still change, grouping is moot, the seed matters
  bool paper;     // one of the GQA paper's three
  std::string summary;
  /// Aligning and fitting read calibration activations.
  bool needs_calibration() const { return aligns || fits; }
};

/// Every method, in the order the study reports them.
const std::vector<MethodRow>& method_table();
/// The row named `name`, else a usage Error naming the value and every method.
const MethodRow& method(const std::string& name);
/// The reference method of the study's tables: the paper's mean pooling.
const MethodRow& reference_method();
/// Every method's name, in table order.
std::vector<std::string> method_names();

/// PerLayer: contiguous groups, their number chosen per layer under the budget of as many heads
/// in every layer (budget.h) — an allocation rather than a grouping, named beside them.
enum class Grouping { Contiguous, Similar, PerLayer };
template <> struct EnumNames<Grouping> {
  static constexpr std::array<std::pair<Grouping, const char*>, 3> values{
      {{Grouping::Contiguous, "contiguous"}, {Grouping::Similar, "similar"}, {Grouping::PerLayer, "per-layer"}}};
};

/// A method with a grouping: what one conversion does.
struct Variant {
  const MethodRow* method = &reference_method();
  Grouping grouping = Grouping::Contiguous;

  /// "fit" for contiguous groups, "fit+similar" for another grouping: how cells and reports name it.
  std::string name() const;
  /// The inverse of name(); an unknown method or grouping is a usage Error naming it.
  static Variant parse(const std::string& s);
  /// True when converting reads calibration activations (the method's, or similar grouping's).
  bool needs_calibration() const { return method->needs_calibration() || grouping != Grouping::Contiguous; }
  bool operator==(const Variant& o) const { return method == o.method && grouping == o.grouping; }
};

}  // namespace tapelm
