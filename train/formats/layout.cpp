#include "train/formats/layout.h"

#include <algorithm>
#include <cstring>

#include "nn/gpt.h"

namespace tapelm::formats {

namespace {

// The base naming: each role's name in each format, without ".weight"/".bias"; {L} is the layer,
// {P} a family's optional HF prefix; tapelm's MLP is {up} = up or fc, {down} = down or proj. ""
// = the format has no such tensor unless a family names it (families.cpp overrides these names).
struct RoleRow {
  Role role;
  bool per_layer, biased;  // biased: a weight that may come with a bias (linears, norms)
  const char* tapelm;
  const char* hf;          // as Llama names them
  const char* gguf;        // as llama.cpp names them (gguf-py's MODEL_TENSOR names)
  const char* llama2c;     // positional; named as Meta's checkpoints name them
};

const RoleRow kRoles[] = {
    {Role::tok_embd, false, false, "wte", "model.embed_tokens", "token_embd", "tok_embeddings"},
    {Role::pos_embd, false, false, "wpe", "", "position_embd", ""},
    {Role::attn_norm, true, true, "blocks.{L}.ln1", "model.layers.{L}.input_layernorm", "blk.{L}.attn_norm", "layers.{L}.attention_norm"},
    {Role::attn_q, true, true, "blocks.{L}.attn.wq", "model.layers.{L}.self_attn.q_proj", "blk.{L}.attn_q", "layers.{L}.attention.wq"},
    {Role::attn_k, true, true, "blocks.{L}.attn.wk", "model.layers.{L}.self_attn.k_proj", "blk.{L}.attn_k", "layers.{L}.attention.wk"},
    {Role::attn_v, true, true, "blocks.{L}.attn.wv", "model.layers.{L}.self_attn.v_proj", "blk.{L}.attn_v", "layers.{L}.attention.wv"},
    {Role::attn_qkv, true, true, "", "", "blk.{L}.attn_qkv", ""},
    {Role::attn_out, true, true, "blocks.{L}.attn.wo", "model.layers.{L}.self_attn.o_proj", "blk.{L}.attn_output", "layers.{L}.attention.wo"},
    {Role::attn_q_norm, true, false, "blocks.{L}.attn.q_norm", "model.layers.{L}.self_attn.q_norm", "blk.{L}.attn_q_norm", ""},
    {Role::attn_k_norm, true, false, "blocks.{L}.attn.k_norm", "model.layers.{L}.self_attn.k_norm", "blk.{L}.attn_k_norm", ""},
    {Role::ffn_norm, true, true, "blocks.{L}.ln2", "model.layers.{L}.post_attention_layernorm", "blk.{L}.ffn_norm", "layers.{L}.ffn_norm"},
    {Role::ffn_gate_up, true, true, "", "", "", ""},
    {Role::ffn_gate, true, true, "blocks.{L}.mlp.gate", "model.layers.{L}.mlp.gate_proj", "blk.{L}.ffn_gate", "layers.{L}.feed_forward.w1"},
    {Role::ffn_up, true, true, "blocks.{L}.mlp.{up}", "model.layers.{L}.mlp.up_proj", "blk.{L}.ffn_up", "layers.{L}.feed_forward.w3"},
    {Role::ffn_down, true, true, "blocks.{L}.mlp.{down}", "model.layers.{L}.mlp.down_proj", "blk.{L}.ffn_down", "layers.{L}.feed_forward.w2"},
    {Role::output_norm, false, true, "ln_f", "model.norm", "output_norm", "norm"},
    {Role::output, false, false, "lm_head", "lm_head", "output", "output"},
    {Role::rope_cos, false, false, "", "", "", "freq_cis_real"},
    {Role::rope_sin, false, false, "", "", "", "freq_cis_imag"},
};

const RoleRow& row(Role r) {
  for (const RoleRow& x : kRoles)
    if (x.role == r) return x;
  throw Error(ErrorKind::internal, "layout: a role without a row");
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
  return s;
}

// Builds the file tensors of one format for one config.
class Builder {
 public:
  Builder(const GPTConfig& c, Family f, Format fmt, const LayoutOptions& o)
      : c_(c), fam_(family_info(f)), fmt_(fmt), o_(o) {
    for (const auto& [name, shape] : parameter_shapes(c)) shapes_[name] = shape;
  }

  // The role's tensors (weight, then bias) for layer l, appended to out.
  void add(Role r, int64_t l, std::vector<FileTensor>& out) const {
    const RoleRow& x = row(r);
    const std::string base = file_name(x, l);
    if (base.empty()) return;
    if (r == Role::rope_cos || r == Role::rope_sin) {
      if (fmt_ == Format::llama2c && o_.llama2c_version == 0) {
        const Shape s{c_.block_size, c_.head_dim() / 2};
        out.push_back({base, s, {{base, s}}, false, 0, false, true});
      }
      return;
    }
    for (const char* suffix : {".weight", ".bias"}) {
      if (std::string(suffix) == ".bias" && (!x.biased || fmt_ == Format::llama2c)) break;
      FileTensor t;
      t.name = base + (fmt_ == Format::llama2c ? "" : suffix);
      for (Role part : parts_of(r)) {
        const std::string p = param_name(row(part), l) + suffix;
        auto it = shapes_.find(p);
        if (it != shapes_.end()) t.parts.push_back(*it);
        else if (fam_.all_biases && fmt_ != Format::tapelm && std::string(suffix) == ".bias") t.parts.push_back({p, {weight_rows(part, l)}});
      }
      if (t.parts.size() != parts_of(r).size()) continue;  // the model has no such tensor
      finish(t, r, l);
      out.push_back(std::move(t));
    }
  }

 private:
  std::vector<Role> parts_of(Role r) const {
    if (r == Role::attn_qkv) return {Role::attn_q, Role::attn_k, Role::attn_v};
    if (r == Role::ffn_gate_up) return {Role::ffn_gate, Role::ffn_up};
    return {r};
  }
  int64_t weight_rows(Role part, int64_t l) const { return shapes_.at(param_name(row(part), l) + ".weight")[0]; }

  std::string param_name(const RoleRow& x, int64_t l) const {
    std::string n = replace_all(x.tapelm, "{L}", std::to_string(l));
    n = replace_all(n, "{up}", c_.gated() ? "up" : "fc");
    return replace_all(n, "{down}", c_.gated() ? "down" : "proj");
  }

  // The format's name for the role, or "" when the format (for this family) has no such tensor.
  std::string file_name(const RoleRow& x, int64_t l) const {
    const bool fused = x.role == Role::attn_qkv, split = x.role == Role::attn_q || x.role == Role::attn_k || x.role == Role::attn_v;
    if ((fused && !fam_.fused_qkv) || (split && fam_.fused_qkv && fmt_ != Format::tapelm)) return "";
    const bool fused_mlp = x.role == Role::ffn_gate_up, split_mlp = x.role == Role::ffn_gate || x.role == Role::ffn_up;
    if ((fused_mlp && (!fam_.fused_gate_up || !c_.gated())) ||
        (split_mlp && fam_.fused_gate_up && c_.gated() && fmt_ != Format::tapelm))
      return "";
    if (x.role == Role::pos_embd && c_.pos != PosKind::Learned) return "";
    if ((x.role == Role::attn_q_norm || x.role == Role::attn_k_norm) && c_.qk_norm == QkNorm::none) return "";
    if (x.role == Role::ffn_gate && !c_.gated()) return "";
    if (x.role == Role::output && c_.tie_embeddings) return "";
    if (fmt_ == Format::tapelm) return *x.tapelm ? param_name(x, l) : "";
    const char* n = fmt_ == Format::hf ? x.hf : fmt_ == Format::gguf ? x.gguf : x.llama2c;
    for (const NameOverride& o : fam_.names)
      if (o.format == fmt_ && o.role == x.role) n = o.name;
    return replace_all(replace_all(n, "{L}", std::to_string(l)), "{P}", o_.hf_prefix);
  }

  // Shape and transforms of a tensor whose parts are set.
  void finish(FileTensor& t, Role r, int64_t l) const {
    int64_t rows = 0;
    for (const auto& [name, shape] : t.parts) rows += shape[0];
    const Shape& first = t.parts[0].second;
    t.matrix = first.size() == 2;
    t.shape = t.matrix ? Shape{rows, first[1]} : Shape{rows};
    const bool conv1d = fmt_ == Format::hf && fam_.hf_conv1d && t.matrix && r != Role::tok_embd && r != Role::pos_embd &&
                           r != Role::output;
    if (conv1d) t.transpose = true, std::swap(t.shape[0], t.shape[1]);
    const bool interleave = fmt_ == Format::llama2c || (fmt_ == Format::gguf && fam_.gguf_interleaves_rope);
    if (interleave && r == Role::attn_q) t.rope_heads = c_.n_head;
    if (interleave && r == Role::attn_k) t.rope_heads = c_.kv_heads(l);
    const bool norm = r == Role::attn_norm || r == Role::ffn_norm || r == Role::output_norm;
    if (fmt_ == Format::gguf && fam_.gguf.norm_plus_one && norm && c_.norm == NormKind::RMSNorm1p) t.plus_one = true;
    if (fmt_ == Format::hf && r == Role::pos_embd && fam_.hf_position_offset > 0) {
      t.lead_rows = fam_.hf_position_offset;
      t.shape[0] += t.lead_rows;
    }
    if (fmt_ == Format::hf && fam_.hf_qkv_per_head && r == Role::attn_qkv) {
      // one K and V head per query head: the family's HF config has no other (architecture_for)
      if (c_.kv_heads(l) != c_.n_head) throw Error(ErrorKind::internal, "layout: q, k, v interleaved by head need as many of each");
      t.head_parts = c_.n_head;
    }
  }

  const GPTConfig& c_;
  const FamilyInfo& fam_;
  Format fmt_;
  LayoutOptions o_;
  std::map<std::string, Shape> shapes_;
};

}  // namespace

std::vector<FileTensor> layout(const GPTConfig& c, Family f, Format fmt, const LayoutOptions& o) {
  const Builder b(c, f, fmt, o);
  std::vector<FileTensor> out;
  static const Role layer[] = {Role::attn_norm, Role::attn_q,   Role::attn_k,      Role::attn_v,      Role::attn_qkv, Role::attn_out,
                               Role::attn_q_norm, Role::attn_k_norm, Role::ffn_norm, Role::ffn_gate_up, Role::ffn_gate, Role::ffn_up,
                               Role::ffn_down};
  if (fmt != Format::llama2c) {  // layer by layer
    b.add(Role::tok_embd, 0, out);
    b.add(Role::pos_embd, 0, out);
    for (int64_t l = 0; l < c.n_layer; l++)
      for (Role r : layer) b.add(r, l, out);
    b.add(Role::output_norm, 0, out);
    b.add(Role::output, 0, out);
    return out;
  }
  // llama2.c: each role for every layer before the next role, in its version's order.
  static const std::vector<Role> v0{Role::tok_embd, Role::attn_norm, Role::attn_q,   Role::attn_k,      Role::attn_v,
                                    Role::attn_out, Role::ffn_norm,  Role::ffn_gate, Role::ffn_down,    Role::ffn_up,
                                    Role::output_norm, Role::rope_cos, Role::rope_sin, Role::output};
  static const std::vector<Role> v1{Role::attn_norm, Role::ffn_norm, Role::output_norm, Role::tok_embd, Role::attn_q, Role::attn_k,
                                    Role::attn_v,    Role::attn_out, Role::ffn_gate,    Role::ffn_down, Role::ffn_up, Role::output};
  for (Role r : o.llama2c_version == 0 ? v0 : v1) {
    if (!row(r).per_layer) {
      b.add(r, 0, out);
      continue;
    }
    for (int64_t l = 0; l < c.n_layer; l++) b.add(r, l, out);
  }
  return out;
}

void check_layer_count(const GPTConfig& c, Family f, Format fmt, const LayoutOptions& o, size_t tensors_held, const std::string& what) {
  if (c.n_layer <= 1) return;
  GPTConfig one = c.layer(0), two = c.layer(0);  // one layer's tensors: the difference of two layouts
  one.n_layer = 1;
  two.n_layer = 2;
  const auto count = [&](const GPTConfig& x) { return fmt == Format::tapelm ? parameter_layout(x).size() : layout(x, f, fmt, o).size(); };
  const size_t n1 = count(one), per_layer = count(two) - n1, outside = n1 - per_layer;
  if (per_layer == 0 || tensors_held < outside) return;  // the tensor check names what is missing
  // a claim one layer past what the tensors make is left to the tensor check, which names the
  // tensor missing; beyond that the listing itself would be the cost
  const size_t most = (tensors_held - outside) / per_layer;
  if (static_cast<uint64_t>(c.n_layer) > most + 1)
    throw Error(ErrorKind::data, what + ": the config claims " + std::to_string(c.n_layer) + " layers, but the " +
                                     std::to_string(tensors_held) + " tensors it holds make at most " + std::to_string(most));
}

std::vector<FileTensor> parameter_layout(const GPTConfig& c) {
  std::vector<FileTensor> out;
  for (const auto& [name, shape] : parameter_shapes(c)) out.push_back({name, shape, {{name, shape}}, false, 0, shape.size() == 2, false});
  return out;
}

namespace {
// Rows of parts stacked one after the other (part 0's rows, then part 1's, ...) to the file's order
// that interleaves them head by head, or back (to_file false); every part has heads · hd rows.
void permute_head_parts(const float* in, float* out, int64_t heads, int64_t parts, int64_t rows, int64_t cols, bool to_file) {
  const int64_t hd = rows / parts / heads;
  const size_t block = static_cast<size_t>(hd * cols);
  for (int64_t p = 0; p < parts; p++)
    for (int64_t h = 0; h < heads; h++) {
      const int64_t stacked = (p * heads + h) * static_cast<int64_t>(block), file = (h * parts + p) * static_cast<int64_t>(block);
      std::memcpy(out + (to_file ? file : stacked), in + (to_file ? stacked : file), block * sizeof(float));
    }
}
}  // namespace

void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t rows, int64_t cols, bool to_interleaved) {
  const int64_t hd = rows / heads, half = hd / 2;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t i = 0; i < half; i++)
      for (int64_t j = 0; j < 2; j++) {
        const int64_t inter = h * hd + 2 * i + j, split = h * hd + j * half + i;
        const int64_t dst = to_interleaved ? inter : split, src = to_interleaved ? split : inter;
        std::memcpy(out + dst * cols, in + src * cols, static_cast<size_t>(cols) * sizeof(float));
      }
}

TensorMap tensors_of(const GPT& model) {
  TensorMap m;
  for (const auto& [name, v] : model.named_parameters()) m.emplace(name, v.val());
  return m;
}

std::vector<float> file_values(const FileTensor& t, const TensorMap& tensors) {
  std::vector<float> m;
  m.reserve(static_cast<size_t>(shape_numel(t.shape)));
  // rows no parameter holds, zeros before the parts (a position table's: no other transform)
  m.assign(static_cast<size_t>(t.lead_rows * (shape_numel(t.shape) / std::max<int64_t>(t.shape[0], 1))), 0.f);
  for (const auto& [name, shape] : t.parts) {
    auto it = tensors.find(name);
    if (it == tensors.end()) m.resize(m.size() + static_cast<size_t>(shape_numel(shape)), 0.f);  // a bias the model lacks
    else m.insert(m.end(), it->second.data(), it->second.data() + it->second.numel());
  }
  const int64_t rows = t.transpose ? t.shape[1] : t.shape[0], cols = static_cast<int64_t>(m.size()) / std::max<int64_t>(rows, 1);
  if (t.rope_heads > 0) {
    std::vector<float> p(m.size());
    permute_rope_rows(m.data(), p.data(), t.rope_heads, rows, cols, true);
    m.swap(p);
  }
  if (t.head_parts > 0) {
    std::vector<float> p(m.size());
    permute_head_parts(m.data(), p.data(), t.head_parts, static_cast<int64_t>(t.parts.size()), rows, cols, true);
    m.swap(p);
  }
  if (t.plus_one)
    for (float& x : m) x += 1.f;
  if (t.transpose) {  // m is [rows, cols] = [out, in]; the file wants [in, out]
    std::vector<float> tr(m.size());
    for (int64_t o = 0; o < rows; o++)
      for (int64_t i = 0; i < cols; i++) tr[i * rows + o] = m[o * cols + i];
    m.swap(tr);
  }
  return m;
}

void store_file_values(const FileTensor& t, const float* v, TensorMap& tensors) {
  v += t.lead_rows * (shape_numel(t.shape) / std::max<int64_t>(t.shape[0], 1));  // rows no parameter holds: skipped
  const int64_t n = shape_numel(t.shape);
  const int64_t rows = t.transpose ? t.shape[1] : t.shape[0], cols = n / std::max<int64_t>(rows, 1);
  std::vector<float> buf;
  if (t.transpose) {
    buf.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < cols; i++)
      for (int64_t o = 0; o < rows; o++) buf[o * cols + i] = v[i * rows + o];
    v = buf.data();
  }
  if (t.rope_heads > 0) {
    std::vector<float> p(static_cast<size_t>(n));
    permute_rope_rows(v, p.data(), t.rope_heads, rows, cols, false);
    buf.swap(p);
    v = buf.data();
  }
  if (t.head_parts > 0) {
    std::vector<float> p(static_cast<size_t>(n));
    permute_head_parts(v, p.data(), t.head_parts, static_cast<int64_t>(t.parts.size()), rows, cols, false);
    buf.swap(p);
    v = buf.data();
  }
  for (const auto& [name, shape] : t.parts) {
    auto it = tensors.find(name);
    if (it == tensors.end()) it = tensors.emplace(name, Tensor::empty(shape)).first;  // an extra
    std::memcpy(it->second.data(), v, static_cast<size_t>(shape_numel(shape)) * sizeof(float));
    if (t.plus_one)
      for (int64_t i = 0; i < shape_numel(shape); i++) it->second.data()[i] -= 1.f;
    v += shape_numel(shape);
  }
}

}  // namespace tapelm::formats
