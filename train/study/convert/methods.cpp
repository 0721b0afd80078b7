#include "train/study/convert/methods.h"

#include <algorithm>

#include "autograd/error.h"

namespace tapelm {

namespace {

// Sum in head order, then divide: PyTorch's mean over the group axis, to the bit.
void pool_mean(const float* m, int64_t rep, int64_t block, float* out, bool, Rng&) {
  for (int64_t e = 0; e < block; e++) {
    float acc = m[e];
    for (int64_t r = 1; r < rep; r++) acc += m[r * block + e];
    out[e] = acc / static_cast<float>(rep);
  }
}

void pool_first(const float* m, int64_t, int64_t block, float* out, bool, Rng&) { std::copy(m, m + block, out); }

// GPT's init for a projection: weights normal(0, 0.02), biases 0.
void pool_random(const float*, int64_t, int64_t block, float* out, bool weight, Rng& rng) {
  for (int64_t e = 0; e < block; e++) out[e] = weight ? static_cast<float>(rng.normal() * 0.02) : 0.f;
}

}  // namespace

const std::vector<MethodRow>& method_table() {
  //                         name           aligns pool         rescales fits   fresh  paper
  static const std::vector<MethodRow> rows{
      {"mean",        false, pool_mean,   false, false, false, true,  "the mean of the group's heads"},
      {"first",       false, pool_first,  false, false, false, true,  "the group's first head"},
      {"random",      false, pool_random, false, false, true,  true,  "a fresh random init"},
      {"mean-norm",   false, pool_mean,   true,  false, false, false, "the mean, rescaled to the members' average norm"},
      {"aligned",     true,  pool_mean,   false, false, false, false, "the members rotated onto a common reference, then the mean"},
      {"fit",         false, pool_mean,   false, true,  false, false, "the least-squares merge of the members' scores and outputs"},
      {"aligned-fit", true,  pool_mean,   false, true,  false, false, "the rotation, then the least-squares merge"},
  };
  return rows;
}

const MethodRow& method(const std::string& name) {
  for (const MethodRow& r : method_table())
    if (r.name == name) return r;
  std::string all;
  for (const MethodRow& r : method_table()) all += (all.empty() ? "" : ", ") + r.name;
  throw Error(ErrorKind::usage, "unknown conversion method \"" + name.substr(0, 80) + "\" (expected one of " + all + ")");
}

const MethodRow& reference_method() { return method_table().front(); }

std::vector<std::string> method_names() {
  std::vector<std::string> names;
  for (const MethodRow& r : method_table()) names.push_back(r.name);
  return names;
}

std::string Variant::name() const {
  return grouping == Grouping::Contiguous ? method->name : method->name + "+" + to_string(grouping);
}

Variant Variant::parse(const std::string& s) {
  const size_t plus = s.find('+');
  if (plus == std::string::npos) return {&tapelm::method(s), Grouping::Contiguous};
  return {&tapelm::method(s.substr(0, plus)), enum_from_name<Grouping>(s.substr(plus + 1), "grouping")};
}

}  // namespace tapelm
