#include "train/formats/tensor_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "autograd/runtime.h"

namespace tapelm::formats {

namespace {

// A list for a message: the first few items, then how many more.
class Listing {
 public:
  void add(const std::string& item) {
    if (n_++ < kShown) text_ += (text_.empty() ? "" : ", ") + item;
  }
  bool empty() const { return n_ == 0; }
  std::string str() const { return text_ + (n_ > kShown ? " and " + std::to_string(n_ - kShown) + " more" : ""); }

 private:
  static constexpr int kShown = 6;
  std::string text_;
  int n_ = 0;
};

}  // namespace

void check_tensors(const std::vector<FileTensor>& layout, const TensorSource& src, const LoadRules& rules) {
  Listing missing, extra, misshaped;
  std::set<std::string> wanted;
  for (const FileTensor& t : layout) {
    wanted.insert(t.name);
    const TensorSource::Info* have = src.find(t.name);
    if (!have) missing.add(cut_for_message(t.name) + " " + shape_str(t.shape));
    else if (have->shape != t.shape) misshaped.add(cut_for_message(t.name) + " " + shape_str(have->shape) + " (expected " + shape_str(t.shape) + ")");
  }
  for (const TensorSource::Info& t : src.tensors())
    if (!wanted.count(t.name) && !(rules.ignorable && rules.ignorable(t))) extra.add(cut_for_message(t.name));
  if (missing.empty() && extra.empty() && misshaped.empty()) return;
  std::string msg = src.what() + ": its tensors do not match " + rules.against + ":";
  if (!missing.empty()) msg += " missing " + missing.str() + ";";
  if (!extra.empty()) msg += " extra " + extra.str() + ";";
  if (!misshaped.empty()) msg += " mis-shaped " + misshaped.str() + ";";
  msg.pop_back();
  throw Error(rules.kind, msg);
}

int64_t first_non_finite(const float* v, int64_t n) {
  const int64_t chunk = int64_t(1) << 20, chunks = (n + chunk - 1) / chunk;
  std::vector<uint8_t> bad(static_cast<size_t>(chunks), 0);
  parallel_for(chunks, [&](int64_t c) {
    uint32_t any = 0;  // an exponent of all ones is Inf or NaN
    for (int64_t i = c * chunk, end = std::min(n, i + chunk); i < end; i++) {
      uint32_t bits;
      std::memcpy(&bits, v + i, 4);
      any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    bad[static_cast<size_t>(c)] = static_cast<uint8_t>(any);
  });
  for (int64_t c = 0; c < chunks; c++)
    if (bad[static_cast<size_t>(c)])
      for (int64_t i = c * chunk; i < n; i++)
        if (!std::isfinite(v[i])) return i;
  return -1;
}

void load(const std::vector<FileTensor>& layout, const TensorSource& src, const LoadRules& rules, TensorMap& into) {
  check_tensors(layout, src, rules);
  std::vector<float> buf;
  for (const FileTensor& t : layout) {
    const TensorSource::Info& info = *src.find(t.name);
    buf.resize(static_cast<size_t>(shape_numel(t.shape)));
    src.read_f32(info, buf.data());
    store_file_values(t, buf.data(), into);
  }
}

std::string stored_dtypes(const std::vector<FileTensor>& layout, const TensorSource& src) {
  std::set<std::string> dtypes;
  for (const FileTensor& t : layout)
    if (const TensorSource::Info* i = src.find(t.name)) dtypes.insert(i->dtype);
  std::string out;
  for (const std::string& d : dtypes) out += (out.empty() ? "" : ", ") + d;
  return out;
}

}  // namespace tapelm::formats
