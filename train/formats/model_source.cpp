#include "train/formats/model_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "nn/accounting.h"
#include "nn/gpt.h"
#include "train/formats/checkpoint.h"
#include "train/formats/model_sink.h"

namespace fs = std::filesystem;

namespace tapelm::formats {

namespace {
// Reads file tensor t into the named tensors of `into`: in place when the file holds one
// parameter as it is, else through buf (parts stacked, rows permuted, transposed).
void read_file_tensor(const TensorSource& src, const FileTensor& t, TensorMap& into, std::vector<float>& buf) {
  if (t.parts.size() == 1 && !t.transpose && t.rope_heads == 0 && t.lead_rows == 0 && !t.plus_one) {
    src.read_f32(*src.find(t.name), into.at(t.parts[0].first).data());
    return;
  }
  buf.resize(static_cast<size_t>(shape_numel(t.shape)));
  src.read_f32(*src.find(t.name), buf.data());
  store_file_values(t, buf.data(), into);
}
}  // namespace

void OpenedModel::read(TensorMap& into) const {
  std::vector<float> buf;
  size_t covered = 0;
  for (const FileTensor& t : layout) {
    if (t.extra) continue;
    bool wanted = false;
    for (const auto& part : t.parts)
      if (into.count(part.first)) wanted = true, covered++;
    if (wanted) read_file_tensor(*src, t, into, buf);
  }
  // every tensor asked for was read (a block built with UnzeroedWeights holds no value otherwise)
  if (covered < into.size())
    for (const auto& [name, tensor] : into) {
      bool found = false;
      for (const FileTensor& t : layout)
        for (const auto& part : t.parts) found = found || part.first == name;
      if (!found) throw Error(ErrorKind::internal, what + ": no tensor of the file holds " + name);
    }
}

void OpenedModel::push_each(ModelSink& sink) const {
  std::set<std::string> params;
  for (const auto& [name, shape] : parameter_shapes(config)) params.insert(name);
  std::vector<float> buf;
  for (const FileTensor& t : layout) {
    if (t.extra) continue;
    TensorMap parts;
    for (const auto& [name, shape] : t.parts)
      if (params.count(name)) parts.emplace(name, Tensor::empty(shape));
    if (parts.empty()) continue;
    read_file_tensor(*src, t, parts, buf);
    for (const auto& [name, shape] : t.parts)
      if (params.count(name)) sink.tensor(name, parts.at(name));
  }
}

std::unique_ptr<GPT> OpenedModel::load() const {
  const int64_t params = model_cost(config).params;
  check_memory(4.0 * static_cast<double>(params), available_memory_bytes(),
               what + " (" + std::to_string(params) + " parameters in float32)");
  auto model = std::make_unique<GPT>(config);
  model->eval();
  TensorMap into = tensors_of(*model);
  read(into);
  return model;
}

WeightType OpenedModel::kept_dtype() const { return dtypes == "BF16" ? WeightType::bf16 : dtypes == "F16" ? WeightType::f16 : WeightType::f32; }

WeightType OpenedModel::matrices_dtype() const {
  std::set<std::string> types;
  for (const FileTensor& t : layout) {
    const bool packed = t.matrix && std::any_of(t.parts.begin(), t.parts.end(), [](const auto& p) {
                          return p.first.rfind("blocks.", 0) == 0 || p.first == "lm_head.weight";
                        });
    if (!packed) continue;
    const TensorSource::Info* i = src->find(t.name);
    types.insert(i ? i->dtype : "");
  }
  if (types.size() != 1) return WeightType::f32;
  return *types.begin() == "BF16" ? WeightType::bf16 : *types.begin() == "F16" ? WeightType::f16 : WeightType::f32;
}

namespace {
const char* stored_name(WeightType type) { return type == WeightType::bf16 ? "BF16" : type == WeightType::f16 ? "F16" : "Q8_0"; }
}  // namespace

const FileTensor* OpenedModel::mappable(const std::string& param, WeightType type) const {
  if (type == WeightType::f32) return nullptr;
  for (const FileTensor& t : layout) {
    if (t.extra || t.parts.size() != 1 || t.parts[0].first != param) continue;
    const Shape& s = t.parts[0].second;
    const bool as_is = !t.transpose && t.head_parts == 0 && t.lead_rows == 0 && !t.plus_one && s.size() == 2 && t.shape == s;
    const bool rope_ok = t.rope_heads == 0 || (s[0] % t.rope_heads == 0 && (s[0] / t.rope_heads) % 2 == 0);
    const TensorSource::Info* i = src->find(t.name);
    if (!as_is || !rope_ok || !i || i->dtype != stored_name(type) || !packs(type, s)) return nullptr;
    // a source that maps, and 16-bit values at an even offset (a mapping keeps the offset's parity)
    const int64_t at = src->map_offset(*i);
    if (at < 0 || (type != WeightType::q8_0 && at % 2 != 0)) return nullptr;
    return &t;
  }
  return nullptr;
}

std::optional<OpenedModel::MappedMatrix> OpenedModel::map_matrix(const std::string& param, WeightType type) const {
  const FileTensor* t = mappable(param, type);
  if (!t) return std::nullopt;
  std::shared_ptr<const MappedFile> w = src->map(*src->find(t->name));
  const int64_t rows = t->shape[0], cols = t->shape[1];
  if (!w || (type != WeightType::q8_0 && reinterpret_cast<uintptr_t>(w->data()) % 2 != 0))
    throw Error(ErrorKind::internal, what + ": tensor " + t->name + " was found mappable but is not mapped at an even address");
  const int64_t want = packed_bytes(type, rows, cols);
  if (static_cast<int64_t>(w->size()) != want)
    throw Error(ErrorKind::data, what + ": tensor " + t->name + " holds " + std::to_string(w->size()) + " bytes, not the " + std::to_string(want) +
                                     " of " + to_string(type) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  PackedMatrix m = PackedMatrix::over(type, rows, cols, w->data(), w, what + ": tensor " + t->name);
  m.rope_heads = t->rope_heads;
  w->check_unchanged();  // the values checked are the file's as it was opened
  return MappedMatrix{std::move(m), std::move(w)};
}

double OpenedModel::mappable_bytes(WeightType type) const {
  double n = 0;
  for (const auto& [name, shape] : parameter_shapes(config))
    if (shape.size() == 2 && (name.rfind("blocks.", 0) == 0 || name == "lm_head.weight") && mappable(name, type))
      n += static_cast<double>(packed_bytes(type, shape[0], shape[1]));
  return n;
}

void OpenedModel::write_imported(const std::string& out) const {
  write_streamed(out, config, tok ? &*tok : nullptr, {"imported_from", from.dump()}, kept_dtype(), [&](ModelSink& s) { push_each(s); });
}

namespace {
// A tapelm checkpoint as a source that owns its file.
class OwnedCheckpoint : public TensorSource {
 public:
  explicit OwnedCheckpoint(const std::string& path) : f_(H5File::open_read(path)), s_(f_) {}
  std::string what() const override { return s_.what(); }
  const std::vector<Info>& tensors() const override { return s_.tensors(); }
  const Info* find(const std::string& name) const override { return s_.find(name); }
  void read_f32(const Info& t, float* out) const override { s_.read_f32(t, out); }
  const H5File& file() const { return f_; }

 private:
  H5File f_;
  CheckpointSource s_;
};

}  // namespace

OpenedModel open_checkpoint(const std::string& path) {
  OpenedModel m;
  m.path = path;
  m.format = "tapelm";
  m.what = "checkpoint " + path;
  auto src = std::make_unique<OwnedCheckpoint>(path);
  m.config = read_model_config(src->file());
  if (has_tokenizer(src->file())) m.tok = read_tokenizer(src->file());
  check_layer_count(m.config, Family::llama, Format::tapelm, {}, src->tensors().size(), "checkpoint " + path);
  m.layout = parameter_layout(m.config);
  m.rules = {"the model its config describes", ErrorKind::checkpoint, {}};
  check_tensors(m.layout, *src, m.rules);
  m.src = std::move(src);
  m.from = {{"format", "tapelm"}};
  m.dtypes = stored_dtypes(m.layout, *m.src);
  return m;
}

bool file_starts_with(const std::string& path, const std::string& magic) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::string head(magic.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in.gcount() == static_cast<std::streamsize>(head.size()) && head == magic;
}

bool starts_with_hdf5(const std::string& path) { return file_starts_with(path, "\x89HDF\r\n\x1a\n"); }

}  // namespace tapelm::formats
