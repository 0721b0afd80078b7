#include "train/study/convert/budget.h"

#include <cmath>
#include <limits>

#include "train/study/convert/convert.h"

namespace tapelm {

namespace {

void check_budget(int64_t budget, int64_t fewest, int64_t most) {
  if (budget < fewest || budget > most)
    throw Error(ErrorKind::usage, "a KV budget of " + std::to_string(budget) + " heads: the layers take between " + std::to_string(fewest) +
                                      " (the fewest each allows) and " + std::to_string(most) + " (all they have)");
}

}  // namespace

std::vector<std::map<int64_t, double>> layer_costs(GPT& src, const Variant& v, const Calibration* calib, const ModelLoss& loss) {
  if (v.method->fresh)
    throw Error(ErrorKind::usage, "a KV budget by " + v.name() + ": a fresh init has no conversion error to place the heads by");
  const GPTConfig& c = src.config();
  std::vector<int64_t> own;
  for (int64_t l = 0; l < c.n_layer; l++) own.push_back(c.kv_heads(l));
  const double base = loss(src);
  std::vector<std::map<int64_t, double>> out(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; l++)
    for (int64_t g = 1; g <= own[l]; g++) {
      if (own[l] % g) continue;
      if (g == own[l]) {
        out[l][g] = 0;
        continue;
      }
      std::vector<int64_t> heads = own;
      heads[l] = g;
      std::unique_ptr<GPT> one = convert_kv_heads(src, heads, {.variant = v, .calib = calib});
      out[l][g] = loss(*one) - base;
    }
  return out;
}

void check_kv_budget(const GPTConfig& c, int64_t budget) { check_budget(budget, c.n_layer, c.total_kv_heads()); }

std::vector<int64_t> allocate_kv_heads(const std::vector<std::map<int64_t, double>>& costs, int64_t budget) {
  int64_t fewest = 0, most = 0;
  for (const auto& c : costs) {
    if (c.empty()) throw Error(ErrorKind::internal, "allocate_kv_heads: a layer without candidates");
    fewest += c.begin()->first;
    most += c.rbegin()->first;
  }
  check_budget(budget, fewest, most);
  // best[l][b]: least cost of layers l.. with b heads left; layers after the last cost nothing
  const size_t L = costs.size(), B = static_cast<size_t>(budget);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(L + 1, std::vector<double>(B + 1, inf));
  std::vector<std::vector<int64_t>> pick(L, std::vector<int64_t>(B + 1, 0));
  for (size_t b = 0; b <= B; b++) best[L][b] = 0;
  for (size_t l = L; l-- > 0;)
    for (size_t b = 0; b <= B; b++)
      for (auto it = costs[l].rbegin(); it != costs[l].rend(); ++it) {  // most heads first: ties keep them
        const auto [g, c] = *it;
        if (static_cast<size_t>(g) > b) continue;
        const double total = c + best[l + 1][b - static_cast<size_t>(g)];
        if (total < best[l][b]) best[l][b] = total, pick[l][b] = g;
      }
  std::vector<int64_t> out;
  size_t b = B;
  for (size_t l = 0; l < L; l++) {
    out.push_back(pick[l][b]);
    b -= static_cast<size_t>(pick[l][b]);
  }
  return out;
}

std::vector<int64_t> kv_budget_heads(GPT& src, int64_t budget, const Variant& v, const Calibration* calib, const ModelLoss& loss) {
  const GPTConfig& c = src.config();
  check_kv_budget(c, budget);
  if (budget == c.n_layer) return std::vector<int64_t>(static_cast<size_t>(c.n_layer), 1);  // one choice: nothing to measure
  return allocate_kv_heads(layer_costs(src, v, calib, loss), budget);
}

}  // namespace tapelm
