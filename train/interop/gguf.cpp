#include "train/interop/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>


#include "autograd/error.h"
#include "data/io.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/sentencepiece.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "nn/gpt.h"
#include "train/checkpoint/checkpoint.h"
#include "train/interop/float16.h"

namespace tapelm::gguf {

namespace {

namespace fs = std::filesystem;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlign = 32;  // general.alignment's default

// GGUF's value types and ggml's tensor types (the subset written here).
enum ValueType : uint32_t { U32 = 4, I32 = 5, F32V = 6, BOOL = 7, STRING = 8, ARRAY = 9 };
enum TensorType : uint32_t { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_BF16 = 30 };
// general.file_type (llama_ftype).
uint32_t file_type(const std::string& dtype) {
  return dtype == "f32" ? 0 : dtype == "f16" ? 1 : dtype == "q8_0" ? 7 : 32;
}

[[noreturn]] void refuse(const std::string& what, const std::string& why) {
  throw Error(ErrorKind::config, what + ": " + why);
}

// The metadata section, serialized as it is built.
class Meta {
 public:
  void str(const std::string& key, const std::string& v) { head(key, STRING), s(v); }
  void u32(const std::string& key, uint64_t v) { head(key, U32), put<uint32_t>(static_cast<uint32_t>(v)); }
  void f32(const std::string& key, double v) { head(key, F32V), put<float>(static_cast<float>(v)); }
  void flag(const std::string& key, bool v) { head(key, BOOL), put<uint8_t>(v ? 1 : 0); }
  void strs(const std::string& key, const std::vector<std::string>& v) {
    head(key, ARRAY), put<uint32_t>(STRING), put<uint64_t>(v.size());
    for (const std::string& x : v) s(x);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    head(key, ARRAY), put<uint32_t>(F32V), put<uint64_t>(v.size());
    for (float x : v) put<float>(x);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, ARRAY), put<uint32_t>(I32), put<uint64_t>(v.size());
    for (int32_t x : v) put<int32_t>(x);
  }
  const std::string& bytes() const { return b_; }
  uint64_t count() const { return n_; }

 private:
  template <class T> void put(T v) { b_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void s(const std::string& v) { put<uint64_t>(v.size()), b_ += v; }
  void head(const std::string& key, ValueType t) { s(key), put<uint32_t>(t), n_++; }
  std::string b_;
  uint64_t n_ = 0;
};

// One tensor of the file: its name, ggml shape (ne[0] = row length), type, and how to produce
// its row-major float values.
struct Out {
  std::string name;
  std::vector<uint64_t> ne;
  TensorType type;
  std::function<std::vector<float>()> values;
  uint64_t bytes() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return type == T_F32 ? 4 * n : type == T_Q8_0 ? n / 32 * 34 : 2 * n;
  }
};

std::vector<float> concat(const std::vector<Tensor>& parts) {
  std::vector<float> v;
  for (const Tensor& t : parts) v.insert(v.end(), t.data(), t.data() + t.numel());
  return v;
}

// llama.cpp's llama rotates pairs (2j, 2j + 1); tapelm (and HF) rotate (j, j + hd/2): within each
// head, row j goes to 2j and row j + hd/2 to 2j + 1 (llama.cpp's convert_hf_to_gguf permute), and
// back when reading (to_file false).
std::vector<float> permute_rope_rows(const std::vector<float>& w, int64_t heads, int64_t hd, int64_t cols, bool to_file) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < hd / 2; j++)
      for (int64_t s = 0; s < 2; s++) {
        const int64_t ours = h * hd + s * (hd / 2) + j, theirs = h * hd + 2 * j + s;
        const int64_t from = to_file ? ours : theirs, to = to_file ? theirs : ours;
        std::memcpy(&out[to * cols], &w[from * cols], static_cast<size_t>(cols) * sizeof(float));
      }
  return out;
}


TensorType matrix_type(const std::string& dtype, int64_t row) {
  if (dtype == "f32") return T_F32;
  if (dtype == "f16") return T_F16;
  if (dtype == "bf16") return T_BF16;
  return row % 32 == 0 ? T_Q8_0 : T_F16;
}

std::string arch_of(const GPTConfig& c, const std::string& what) {
  if (c.norm == NormKind::RMSNorm && c.mlp == MlpKind::SwiGLU && c.pos == PosKind::Rope) {
    if (c.head_dim() % 2) refuse(what, "head_dim " + std::to_string(c.head_dim()) + " is odd: RoPE needs pairs");
    return c.qkv_bias && !c.bias ? "qwen2" : "llama";
  }
  if (c.norm == NormKind::LayerNorm && c.pos == PosKind::Learned) {
    if (c.mlp == MlpKind::Gelu)
      refuse(what, "mlp \"gelu\" (exact, erf): llama.cpp's gpt2 computes the tanh GELU; train or import with mlp \"gelu_tanh\"");
    if (c.mlp != MlpKind::GeluTanh) refuse(what, "mlp \"" + to_string(c.mlp) + "\" with LayerNorm and learned positions: llama.cpp's gpt2 is GELU");
    if (c.qkv_bias && !c.bias) refuse(what, "qkv_bias without bias: llama.cpp's gpt2 has biases everywhere or (written as zeros) nowhere");
    return "gpt2";
  }
  refuse(what, "norm \"" + to_string(c.norm) + "\", mlp \"" + to_string(c.mlp) + "\", pos \"" + to_string(c.pos) +
                   "\" match no llama.cpp architecture tapelm writes (llama/qwen2: rmsnorm, swiglu, rope; gpt2: layernorm, gelu_tanh, learned)");
}

// The pre-tokenizers llama.cpp knows by name (it picks its regex by the name, never reads one), as
// the models' own tokenizer.json files give them, with what else those files set: Llama 3 ignores
// merges for whole-token words, Qwen2 normalizes to NFC. The first name is the one written.
struct KnownPre {
  std::vector<std::string> names;
  nlohmann::json pre;
  bool nfc = false, ignore_merges = false;
};

const std::vector<KnownPre>& known_pres() {
  using json = nlohmann::json;
  static const std::vector<KnownPre> table = [] {
    auto bl = [](bool regex) { return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", regex}}; };
    auto split = [&](const std::string& digits) {
      const std::string pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)" + digits +
                                  R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
      return json{{"type", "Sequence"},
                  {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}}, bl(false)}}};
    };
    return std::vector<KnownPre>{
        {{"gpt-2", "default"}, bl(true)},
        {{"llama-bpe", "llama3", "llama-v3"}, split(R"(\p{N}{1,3})"), false, true},
        {{"qwen2"}, split(R"(\p{N})"), true, false},
        {{"smollm"}, {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, bl(true)}}}}};
  }();
  return table;
}

const KnownPre* known_pre(const std::string& name) {
  for (const KnownPre& k : known_pres())
    if (std::find(k.names.begin(), k.names.end(), name) != k.names.end()) return &k;
  return nullptr;
}

void tokenizer_meta(Meta& m, const Tokenizer& tok, const std::string& what, ExportResult& r) {
  const int32_t V = tok.vocab_size();
  std::vector<std::string> tokens(V);
  std::vector<int32_t> types(V);
  for (int32_t i = 0; i < V; i++) {
    tokens[i] = tok.piece(i);
    // llama.cpp's token types: normal 1, unknown 2, control 3, user-defined 4, unused 5, byte 6
    types[i] = 1 + static_cast<int32_t>(tok.piece_kind(i));
  }
  if (tok.kind() == TokenizerKind::sentencepiece) {
    r.tokenizer = "llama";
    std::vector<float> scores(V);
    for (int32_t i = 0; i < V; i++) scores[i] = tok.score(i);
    m.str("tokenizer.ggml.model", "llama");
    m.strs("tokenizer.ggml.tokens", tokens);
    m.f32s("tokenizer.ggml.scores", scores);
    m.i32s("tokenizer.ggml.token_type", types);
    for (int32_t i = 0; i < V; i++)
      if (tok.piece_kind(i) == PieceKind::unknown) m.u32("tokenizer.ggml.unknown_token_id", i);
    m.flag("tokenizer.ggml.add_space_prefix", tok.adds_dummy_prefix());
  } else if (const ByteBpe* b = tok.as<ByteBpe>()) {
    r.tokenizer = "gpt2";
    std::string pre;
    for (const KnownPre& k : known_pres())
      if (pre.empty() && ByteBpe::describe_pre_tokenizer(k.pre) == b->pre_tokenizer()) pre = k.names[0];
    if (pre.empty())
      refuse(what, "the byte-level BPE pre-tokenizer \"" + cut_for_message(b->pre_tokenizer(), 120) +
                       "\" has no llama.cpp name (it knows GPT-2's, Llama 3's, Qwen2's and SmolLM's)");
    m.str("tokenizer.ggml.model", "gpt2");
    m.str("tokenizer.ggml.pre", pre);
    m.strs("tokenizer.ggml.tokens", tokens);
    m.i32s("tokenizer.ggml.token_type", types);
    m.strs("tokenizer.ggml.merges", b->merges());
  } else {
    refuse(what, "the " + tok.kind_name() + " tokenizer has no llama.cpp form (sentencepiece and byte-level BPE do)");
  }
  if (tok.bos_id() >= 0) m.u32("tokenizer.ggml.bos_token_id", tok.bos_id());
  if (tok.eos_id() >= 0) m.u32("tokenizer.ggml.eos_token_id", tok.eos_id());
  // tapelm's documents start with BOS (sentencepiece; byte-level BPE when the tokenizer has one)
  m.flag("tokenizer.ggml.add_bos_token", tok.bos_id() >= 0);
  m.flag("tokenizer.ggml.add_eos_token", false);
}

void write_values(std::FILE* f, const Out& t, const std::string& path) {
  const std::vector<float> v = t.values();
  std::string b;
  if (t.type == T_F32) {
    b.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  } else if (t.type == T_Q8_0) {
    const std::vector<uint8_t> q = quantize_q8_0(v.data(), static_cast<int64_t>(v.size()));
    b.assign(q.begin(), q.end());
  } else {
    b.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); i++) {
      const uint16_t h = t.type == T_F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  if (b.size() != t.bytes()) throw Error(ErrorKind::data, path + ": tensor " + t.name + " came out the wrong size");
  b.resize((b.size() + kAlign - 1) / kAlign * kAlign, '\0');
  if (std::fwrite(b.data(), 1, b.size(), f) != b.size()) throw Error(ErrorKind::data, "cannot write " + path);
}

// Where each parameter goes in llama.cpp's layout: a tensor name, the parameters stacked in it
// (rows of q, k, v for gpt2's attn_qkv), and the RoPE row order to convert for llama's q and k.
enum class Rope { none, q, k };
struct Slot {
  std::string name;
  std::vector<Tensor> parts;
  bool matrix;
  Rope rope = Rope::none;
  uint64_t rows() const {
    uint64_t r = 0;
    for (const Tensor& t : parts) r += static_cast<uint64_t>(matrix ? t.shape()[0] : t.numel());
    return r;
  }
  uint64_t cols() const { return matrix ? static_cast<uint64_t>(parts[0].shape()[1]) : 1; }
  std::vector<uint64_t> ne() const { return matrix ? std::vector<uint64_t>{cols(), rows()} : std::vector<uint64_t>{rows()}; }
};

std::vector<Slot> layout(const GPT& m, const std::string& arch) {
  const GPTConfig& c = m.config();
  std::vector<Slot> s;
  auto linear = [&](const std::string& name, const Linear& l, Rope rope = Rope::none) {
    s.push_back({name + ".weight", {l.weight.val()}, true, rope});
    if (l.bias.defined()) s.push_back({name + ".bias", {l.bias.val()}, false, rope});
  };
  auto norm = [&](const std::string& name, const Norm& n) {
    s.push_back({name + ".weight", {n.weight.val()}, false});
    if (n.bias.defined()) s.push_back({name + ".bias", {n.bias.val()}, false});
  };
  s.push_back({"token_embd.weight", {m.wte->weight.val()}, true});
  if (arch == "gpt2") s.push_back({"position_embd.weight", {m.wpe->weight.val()}, true});
  for (int64_t i = 0; i < c.n_layer; i++) {
    const Block& b = *m.blocks[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm", *b.ln1);
    if (arch == "gpt2") {
      s.push_back({p + "attn_qkv.weight", {b.attn->wq->weight.val(), b.attn->wk->weight.val(), b.attn->wv->weight.val()}, true});
      s.push_back({p + "attn_qkv.bias", {b.attn->wq->bias.val(), b.attn->wk->bias.val(), b.attn->wv->bias.val()}, false});
      linear(p + "attn_output", *b.attn->wo);
      norm(p + "ffn_norm", *b.ln2);
      linear(p + "ffn_up", *b.mlp->fc);
      linear(p + "ffn_down", *b.mlp->proj);
      continue;
    }
    const bool llama = arch == "llama";
    linear(p + "attn_q", *b.attn->wq, llama ? Rope::q : Rope::none);
    linear(p + "attn_k", *b.attn->wk, llama ? Rope::k : Rope::none);
    linear(p + "attn_v", *b.attn->wv);
    linear(p + "attn_output", *b.attn->wo);
    norm(p + "ffn_norm", *b.ln2);
    linear(p + "ffn_gate", *b.mlp->gate);
    linear(p + "ffn_up", *b.mlp->up);
    linear(p + "ffn_down", *b.mlp->down);
  }
  norm("output_norm", *m.ln_f);
  if (!c.tie_embeddings) s.push_back({"output.weight", {m.lm_head.val()}, true});
  return s;
}

// The rows of a slot reordered between tapelm's RoPE pairs and llama.cpp's (to_file: export).
std::vector<float> reorder(std::vector<float> v, const Slot& s, const GPTConfig& c, bool to_file) {
  if (s.rope == Rope::none) return v;
  const int64_t heads = s.rope == Rope::q ? c.n_head : c.n_kv_head, hd = c.head_dim();
  const int64_t cols = static_cast<int64_t>(v.size()) / (heads * hd);
  return permute_rope_rows(v, heads, hd, cols, to_file);
}

// The tensors of the model as llama.cpp names and lays them out.
std::vector<Out> tensors_of(const GPT& m, const std::string& arch, const std::string& dtype) {
  std::vector<Out> out;
  const GPTConfig c = m.config();
  for (Slot& s : layout(m, arch)) {
    const TensorType type = s.matrix ? matrix_type(dtype, static_cast<int64_t>(s.cols())) : T_F32;
    out.push_back({s.name, s.ne(), type, [s, c] { return reorder(concat(s.parts), s, c, true); }});
  }
  return out;
}

}  // namespace

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n / 32 * 34));
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const float* v = x + blk * 32;
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;  // ggml's quantize_row_q8_0_ref
    const uint16_t dh = f32_to_f16(d);
    uint8_t* o = &out[static_cast<size_t>(blk) * 34];
    std::memcpy(o, &dh, 2);
    for (int j = 0; j < 32; j++) o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id)));
  }
  return out;
}

std::vector<float> dequantize_q8_0(const uint8_t* q, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t blk = 0; blk < n / 32; blk++) {
    const uint8_t* b = q + blk * 34;
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    const float d = f16_to_f32(dh);
    for (int j = 0; j < 32; j++) out[blk * 32 + j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
  }
  return out;
}

void round_like_export(GPT& model, const std::string& dtype) {
  if (dtype != "f32" && dtype != "f16" && dtype != "bf16" && dtype != "q8_0")
    throw Error(ErrorKind::usage, "dtype \"" + dtype + "\": GGUF export writes f32, f16, bf16 or q8_0");
  if (dtype == "f32") return;
  for (auto& [name, p] : model.named_parameters()) {
    Tensor t = p.val();
    if (t.ndim() != 2) continue;
    float* v = t.data();
    const int64_t n = t.numel(), cols = t.shape()[1];
    const TensorType ty = matrix_type(dtype, cols);
    if (ty == T_Q8_0) {
      const std::vector<float> back = dequantize_q8_0(quantize_q8_0(v, n).data(), n);
      std::copy(back.begin(), back.end(), v);
    } else {
      for (int64_t i = 0; i < n; i++) v[i] = ty == T_F16 ? f16_to_f32(f32_to_f16(v[i])) : bf16_to_f32(f32_to_bf16(v[i]));
    }
  }
}

ExportResult export_model(const std::string& checkpoint, const std::string& out, const std::string& dtype) {
  if (dtype != "f32" && dtype != "f16" && dtype != "bf16" && dtype != "q8_0")
    throw Error(ErrorKind::usage, "dtype \"" + dtype + "\": GGUF export writes f32, f16, bf16 or q8_0");
  if (fs::is_directory(out)) throw Error(ErrorKind::usage, "--out " + out + " is a directory; GGUF is one file");
  LoadedModel l = load_model(checkpoint, 8.0);
  const GPTConfig& c = l.model->config();
  ExportResult r;
  r.architecture = arch_of(c, checkpoint);
  if (!l.tok) refuse(checkpoint, "has no tokenizer: llama.cpp needs the vocabulary in the file");
  if (l.tok->vocab_size() > c.vocab_size)
    refuse(checkpoint, "the tokenizer has " + std::to_string(l.tok->vocab_size()) + " ids, more than the model's " + std::to_string(c.vocab_size));
  if (l.tok->vocab_size() != c.vocab_size)
    refuse(checkpoint, "the model has " + std::to_string(c.vocab_size) + " ids and its tokenizer " + std::to_string(l.tok->vocab_size()) +
                           ": llama.cpp needs one token per id");
  if (r.architecture != "gpt2" && c.norm == NormKind::RMSNorm && l.model->ln_f->bias.defined())
    refuse(checkpoint, "RMSNorm with a bias: llama.cpp's norms have none");
  std::unique_ptr<GPT> model = std::move(l.model);
  if (r.architecture == "gpt2" && !c.bias) {
    // llama.cpp's gpt2 needs every bias: a model without them is the same function with zeros.
    model = with_zero_biases(*model);
  }

  Meta m;
  const std::string a = r.architecture;
  m.str("general.architecture", a);
  m.str("general.name", fs::path(checkpoint).stem().string());
  m.u32("general.file_type", file_type(dtype));
  if (dtype == "q8_0") m.u32("general.quantization_version", 2);
  m.u32(a + ".context_length", c.block_size);
  m.u32(a + ".embedding_length", c.n_embd);
  m.u32(a + ".block_count", c.n_layer);
  m.u32(a + ".feed_forward_length", c.mlp_hidden);
  m.u32(a + ".attention.head_count", c.n_head);
  m.u32(a + ".attention.head_count_kv", c.n_kv_head);
  if (a == "gpt2") {
    m.f32(a + ".attention.layer_norm_epsilon", c.norm_eps);
  } else {
    m.f32(a + ".rope.freq_base", c.rope_theta);
    m.f32(a + ".attention.layer_norm_rms_epsilon", c.norm_eps);
    m.u32(a + ".rope.dimension_count", c.head_dim());
    m.u32(a + ".vocab_size", c.vocab_size);
  }
  tokenizer_meta(m, *l.tok, checkpoint, r);

  const std::vector<Out> ts = tensors_of(*model, a, dtype);
  std::string head;
  auto put32 = [&](uint32_t v) { head.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { head.append(reinterpret_cast<const char*>(&v), 8); };
  put32(kMagic);
  put32(kVersion);
  put64(ts.size());
  put64(m.count());
  head += m.bytes();
  uint64_t offset = 0;
  for (const Out& t : ts) {
    put64(t.name.size());
    head += t.name;
    put32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put64(d);
    put32(t.type);
    put64(offset);
    offset += (t.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, '\0');
  r.tensors = static_cast<int64_t>(ts.size());
  r.bytes = head.size() + offset;
  write_files_atomic_streamed({{out, [&](std::FILE* f) {
                                  if (std::fwrite(head.data(), 1, head.size(), f) != head.size()) throw Error(ErrorKind::data, "cannot write " + out);
                                  for (const Out& t : ts) write_values(f, t, out);
                                }}});
  return r;
}

// ---- reading ------------------------------------------------------------------------------------

namespace {

// A metadata value: scalars as a number (and a string), arrays of strings or of numbers.
struct Value {
  uint32_t type = 0, elem = 0;
  double num = 0;
  bool is_int = false;
  int64_t i = 0;
  std::string str;
  std::vector<std::string> strs;
  std::vector<double> nums;
};

struct TensorIn {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset, bytes, count;
};

struct Reader {
  const uint8_t* p;
  uint64_t n, pos = 0;
  std::string path;
  [[noreturn]] void fail(const std::string& why) const { throw Error(ErrorKind::data, "GGUF file " + path + ": " + why); }
  void need(uint64_t k, const std::string& what) const {
    if (k > n - pos)
      fail(what + " at byte " + std::to_string(pos) + " runs past the end of the file (" + std::to_string(n) + " bytes)");
  }
  template <class T> T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t len = get<uint64_t>(what + "'s length");
    need(len, what + " of " + std::to_string(len) + " bytes");
    std::string s(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    return s;
  }
};

// Bytes one element of a value type takes at least (strings: their length field).
uint64_t min_size(uint32_t t) {
  static const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 0, 8, 8, 8};
  return t < 13 && t != 9 ? sizes[t] : 0;
}

double scalar(Reader& r, uint32_t t, const std::string& what, bool& is_int, int64_t& iv) {
  is_int = t != 6 && t != 12 && t != 7;
  switch (t) {
    case 0: return double(iv = r.get<uint8_t>(what));
    case 1: return double(iv = r.get<int8_t>(what));
    case 2: return double(iv = r.get<uint16_t>(what));
    case 3: return double(iv = r.get<int16_t>(what));
    case 4: return double(iv = r.get<uint32_t>(what));
    case 5: return double(iv = r.get<int32_t>(what));
    case 6: return r.get<float>(what);
    case 7: {
      const uint8_t b = r.get<uint8_t>(what);
      if (b > 1) r.fail(what + " is a bool of value " + std::to_string(b));
      return b;
    }
    case 10: {
      const uint64_t u = r.get<uint64_t>(what);
      if (u > uint64_t(INT64_MAX)) r.fail(what + " is " + std::to_string(u) + ", beyond any count tapelm reads");
      return double(iv = static_cast<int64_t>(u));
    }
    case 11: return double(iv = r.get<int64_t>(what));
    case 12: return r.get<double>(what);
  }
  r.fail(what + " has value type " + std::to_string(t) + ", which GGUF does not define");
}

Value read_value(Reader& r, uint32_t t, const std::string& key) {
  Value v;
  v.type = t;
  if (t == 8) {
    v.str = r.str("the value of " + key);
  } else if (t == 9) {
    v.elem = r.get<uint32_t>("the element type of " + key);
    const uint64_t count = r.get<uint64_t>("the length of " + key);
    if (v.elem == 9) r.fail(key + " is an array of arrays, which tapelm does not read");
    const uint64_t m = min_size(v.elem);
    if (m == 0) r.fail(key + " is an array of value type " + std::to_string(v.elem) + ", which GGUF does not define");
    if (count > (r.n - r.pos) / m)
      r.fail(key + " claims " + std::to_string(count) + " elements, more than the rest of the file can hold");
    for (uint64_t k = 0; k < count; k++) {
      if (v.elem == 8) {
        v.strs.push_back(r.str(key + "[" + std::to_string(k) + "]"));
      } else {
        bool is_int;
        int64_t iv = 0;
        v.nums.push_back(scalar(r, v.elem, key + "[" + std::to_string(k) + "]", is_int, iv));
      }
    }
  } else {
    v.num = scalar(r, t, key, v.is_int, v.i);
  }
  return v;
}

uint64_t tensor_bytes(uint32_t type, uint64_t count) {
  return type == T_F32 ? 4 * count : type == T_Q8_0 ? count / 32 * 34 : 2 * count;
}

struct Gguf {
  std::string path;
  std::map<std::string, Value> kv;
  std::map<std::string, TensorIn> tensors;
  const uint8_t* data = nullptr;

  [[noreturn]] void fail(const std::string& why) const { throw Error(ErrorKind::data, "GGUF file " + path + ": " + why); }
  const Value* find(const std::string& key) const {
    auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  }
  std::string string(const std::string& key, bool required = true) const {
    const Value* v = find(key);
    if (!v) {
      if (required) fail("key " + key + " is missing");
      return "";
    }
    if (v->type != 8) fail("key " + key + " is not a string");
    return v->str;
  }
  // A non-negative integer no larger than max, or dflt when absent (-1: required).
  int64_t count(const std::string& key, int64_t dflt = -1, int64_t max = int64_t(1) << 40) const {
    const Value* v = find(key);
    if (!v) {
      if (dflt < 0) fail("key " + key + " is missing");
      return dflt;
    }
    if (v->type == 9) fail("key " + key + " is an array (per-layer values), which tapelm does not read");
    if (!v->is_int || v->i < 0 || v->i > max) fail("key " + key + " is " + (v->is_int ? std::to_string(v->i) : std::to_string(v->num)) + ", not a count up to " + std::to_string(max));
    return v->i;
  }
  double real(const std::string& key, double dflt, bool required) const {
    const Value* v = find(key);
    if (!v) {
      if (required) fail("key " + key + " is missing");
      return dflt;
    }
    if (v->type == 8 || v->type == 9 || v->type == 7 || !std::isfinite(v->num)) fail("key " + key + " is not a finite number");
    return v->num;
  }
};

Gguf parse(const MappedFile& m, const std::string& path) {
  Reader r{m.data(), m.size(), 0, path};
  Gguf g;
  g.path = path;
  if (m.size() < 4 || r.get<uint32_t>("the magic") != kMagic) r.fail("does not start with GGUF's magic \"GGUF\"");
  const uint32_t version = r.get<uint32_t>("the version");
  if (version != 2 && version != 3) r.fail("version " + std::to_string(version) + ": tapelm reads GGUF 2 and 3");
  const uint64_t n_tensors = r.get<uint64_t>("the tensor count"), n_kv = r.get<uint64_t>("the metadata count");
  if (n_kv > (r.n - r.pos) / 13) r.fail("claims " + std::to_string(n_kv) + " metadata entries, more than the file can hold");
  for (uint64_t k = 0; k < n_kv; k++) {
    const std::string key = r.str("metadata key " + std::to_string(k));
    const uint32_t t = r.get<uint32_t>("the value type of " + key);
    Value v = read_value(r, t, key);
    if (!g.kv.emplace(key, std::move(v)).second) r.fail("key " + key + " appears twice");
  }
  if (n_tensors > (r.n - r.pos) / 24) r.fail("claims " + std::to_string(n_tensors) + " tensors, more than the file can hold");
  std::vector<TensorIn> order;
  for (uint64_t k = 0; k < n_tensors; k++) {
    TensorIn t;
    t.name = r.str("tensor name " + std::to_string(k));
    const uint32_t nd = r.get<uint32_t>("the dimension count of " + t.name);
    if (nd < 1 || nd > 4) r.fail("tensor " + t.name + " has " + std::to_string(nd) + " dimensions (1 to 4 are read)");
    t.count = 1;
    for (uint32_t d = 0; d < nd; d++) {
      const uint64_t e = r.get<uint64_t>("a dimension of " + t.name);
      if (e == 0 || e > (uint64_t(1) << 40) || t.count > (uint64_t(1) << 40) / e)
        r.fail("tensor " + t.name + " has dimension " + std::to_string(e) + ": its element count is zero or overflows");
      t.ne.push_back(e);
      t.count *= e;
    }
    t.type = r.get<uint32_t>("the type of " + t.name);
    if (t.type != T_F32 && t.type != T_F16 && t.type != T_BF16 && t.type != T_Q8_0)
      r.fail("tensor " + t.name + " has ggml type " + std::to_string(t.type) + ": tapelm reads F32 (0), F16 (1), Q8_0 (8) and BF16 (30)");
    if (t.type == T_Q8_0 && t.ne[0] % 32) r.fail("tensor " + t.name + " is Q8_0 with rows of " + std::to_string(t.ne[0]) + ", not a multiple of 32");
    t.offset = r.get<uint64_t>("the offset of " + t.name);
    t.bytes = tensor_bytes(t.type, t.count);
    order.push_back(t);
  }
  uint64_t align = kAlign;
  if (const Value* a = g.find("general.alignment")) {
    if (!a->is_int || a->i <= 0 || a->i > 65536 || (a->i & (a->i - 1))) r.fail("general.alignment is not a power of two up to 65536");
    align = static_cast<uint64_t>(a->i);
  }
  const uint64_t data_start = (r.pos + align - 1) / align * align;
  if (data_start > m.size()) r.fail("the tensor data would start at byte " + std::to_string(data_start) + ", past the end of the file");
  const uint64_t data_bytes = m.size() - data_start;
  std::sort(order.begin(), order.end(), [](const TensorIn& a, const TensorIn& b) { return a.offset < b.offset; });
  uint64_t end = 0;
  for (const TensorIn& t : order) {
    if (t.offset % align) r.fail("tensor " + t.name + " starts at data offset " + std::to_string(t.offset) + ", not a multiple of the alignment " + std::to_string(align));
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset)
      r.fail("tensor " + t.name + " (" + std::to_string(t.bytes) + " bytes at data offset " + std::to_string(t.offset) + ") runs past the end of the file");
    if (t.offset < end) r.fail("tensor " + t.name + " overlaps the tensor before it");
    end = t.offset + t.bytes;
    if (!g.tensors.emplace(t.name, t).second) r.fail("tensor " + t.name + " appears twice");
  }
  g.data = m.data() + data_start;
  return g;
}

std::vector<float> values_of(const Gguf& g, const TensorIn& t) {
  const uint8_t* b = g.data + t.offset;
  std::vector<float> v(t.count);
  if (t.type == T_F32) {
    std::memcpy(v.data(), b, t.count * 4);
  } else if (t.type == T_Q8_0) {
    v = dequantize_q8_0(b, static_cast<int64_t>(t.count));
  } else {
    for (uint64_t i = 0; i < t.count; i++) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      v[i] = t.type == T_F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  for (uint64_t i = 0; i < t.count; i++)
    if (!std::isfinite(v[i])) g.fail("tensor " + t.name + " holds a non-finite value at element " + std::to_string(i));
  return v;
}

// ---- tokenizers from metadata ----

const std::vector<std::string>& str_array(const Gguf& g, const std::string& key) {
  const Value* v = g.find(key);
  if (!v || v->type != 9 || v->elem != 8) g.fail("key " + key + " is missing or not an array of strings");
  return v->strs;
}
const std::vector<double>& num_array(const Gguf& g, const std::string& key, size_t n) {
  const Value* v = g.find(key);
  if (!v || v->type != 9 || v->elem == 8 || v->elem == 9 || v->nums.size() != n)
    g.fail("key " + key + " is missing or not an array of " + std::to_string(n) + " numbers");
  return v->nums;
}
bool flag_of(const Gguf& g, const std::string& key, bool dflt) {
  const Value* v = g.find(key);
  if (!v) return dflt;
  if (v->type != 7) g.fail("key " + key + " is not a bool");
  return v->num != 0;
}

// llama.cpp's "llama" vocabulary as a sentencepiece model (token types are sentencepiece's: 1
// normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
Tokenizer spm_tokenizer(const Gguf& g) {
  const std::vector<std::string>& tokens = str_array(g, "tokenizer.ggml.tokens");
  const std::vector<double>& scores = num_array(g, "tokenizer.ggml.scores", tokens.size());
  const std::vector<double>& types = num_array(g, "tokenizer.ggml.token_type", tokens.size());
  std::vector<SentencePiecePiece> pieces;
  int64_t unk = -1;
  for (size_t i = 0; i < tokens.size(); i++) {
    const int type = static_cast<int>(types[i]);
    if (types[i] != type || type < 1 || type > 6) g.fail("tokenizer.ggml.token_type[" + std::to_string(i) + "] is not a token type 1-6");
    if (type == 2 && unk < 0) unk = static_cast<int64_t>(i);
    pieces.push_back({tokens[i], static_cast<float>(scores[i]), static_cast<PieceKind>(type - 1)});
  }
  const int64_t V = static_cast<int64_t>(tokens.size());
  auto id = [&](const char* key) { return g.find(key) ? g.count(key, -1, V - 1) : -1; };
  try {
    return SentencePiece::from_pieces(pieces, g.count("tokenizer.ggml.unknown_token_id", unk < 0 ? 0 : unk, V - 1),
                                      id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"),
                                      flag_of(g, "tokenizer.ggml.add_space_prefix", true));
  } catch (const Error& e) {
    g.fail(std::string("its llama vocabulary is not a valid sentencepiece model: ") + e.what());
  }
}

// llama.cpp's "gpt2" vocabulary as a byte-level BPE tokenizer.json.
Tokenizer bpe_tokenizer(const Gguf& g) {
  using json = nlohmann::json;
  const std::vector<std::string>& tokens = str_array(g, "tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = str_array(g, "tokenizer.ggml.merges");
  const Value* tv = g.find("tokenizer.ggml.token_type");
  const std::vector<double> types = tv ? num_array(g, "tokenizer.ggml.token_type", tokens.size()) : std::vector<double>(tokens.size(), 1);
  const int64_t V = static_cast<int64_t>(tokens.size());
  const int64_t bos = g.find("tokenizer.ggml.bos_token_id") ? g.count("tokenizer.ggml.bos_token_id", -1, V - 1) : -1;
  const int64_t eos = g.find("tokenizer.ggml.eos_token_id") ? g.count("tokenizer.ggml.eos_token_id", -1, V - 1) : -1;
  json vocab = json::object(), added = json::array();
  for (int64_t i = 0; i < V; i++) {
    if (vocab.contains(tokens[i])) g.fail("tokenizer.ggml.tokens[" + std::to_string(i) + "] repeats an earlier token");
    vocab[tokens[i]] = i;
    const double t = types[i];
    if (t == 3 || t == 4)  // control and user-defined tokens: added tokens, special when control or BOS/EOS
      added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", t == 3 || i == bos || i == eos}});
  }
  const std::string name = g.string("tokenizer.ggml.pre", false).empty() ? "default" : g.string("tokenizer.ggml.pre");
  const KnownPre* k = known_pre(name);
  if (!k) g.fail("tokenizer.ggml.pre \"" + cut_for_message(name) + "\": tapelm knows gpt-2, llama-bpe, qwen2 and smollm");
  json t = ByteBpe::assemble(std::move(vocab), merges, std::move(added), k->pre, k->nfc, k->ignore_merges);
  return Tokenizer(ByteBpe::from_parsed(std::move(t), "GGUF file " + g.path + ": its gpt2 vocabulary",
                                                       bos >= 0 ? tokens[bos] : "", eos >= 0 ? tokens[eos] : ""));
}

}  // namespace

ImportResult import_model(const std::string& path, const std::string& out) {
  const MappedFile m(path, "GGUF file");
  const Gguf g = parse(m, path);
  ImportResult r;
  const std::string a = g.string("general.architecture");
  if (a != "llama" && a != "qwen2" && a != "gpt2")
    g.fail("general.architecture \"" + cut_for_message(a) + "\": tapelm reads llama, qwen2 and gpt2");
  r.architecture = a;
  for (const char* k : {".expert_count", ".attention.sliding_window", ".rope.scaling.factor", ".attention.key_length"}) {
    const Value* v = g.find(a + k);
    if (!v) continue;
    const std::string key = a + k;
    if (key.ends_with("expert_count") && v->is_int && v->i == 0) continue;
    if (key.ends_with("scaling.factor") && !v->is_int && (v->num == 1.0 || v->num == 0.0)) continue;
    if (key.ends_with("key_length") && v->is_int && g.find(a + ".embedding_length") && g.find(a + ".attention.head_count") &&
        v->i * g.count(a + ".attention.head_count") == g.count(a + ".embedding_length"))
      continue;
    g.fail("key " + key + " is set: tapelm's model has no " +
           (key.ends_with("expert_count") ? std::string("mixture of experts") : key.ends_with("sliding_window") ? "sliding window" :
            key.ends_with("key_length") ? "head size other than embedding / heads" : "rope scaling"));
  }
  if (g.find(a + ".rope.scaling.type") && g.string(a + ".rope.scaling.type") != "none")
    g.fail("key " + a + ".rope.scaling.type is \"" + cut_for_message(g.string(a + ".rope.scaling.type")) + "\": tapelm has no rope scaling");
  if (g.tensors.count("rope_freqs.weight")) g.fail("tensor rope_freqs.weight (rope frequency factors): tapelm has no rope scaling");

  GPTConfig c;
  c.n_layer = g.count(a + ".block_count", -1, 1 << 16);
  c.n_embd = g.count(a + ".embedding_length", -1, 1 << 20);
  c.n_head = g.count(a + ".attention.head_count", -1, 1 << 12);
  c.n_kv_head = g.count(a + ".attention.head_count_kv", c.n_head, 1 << 12);
  c.mlp_hidden = g.count(a + ".feed_forward_length", -1, 1 << 22);
  c.block_size = g.count(a + ".context_length", -1, 1 << 24);
  auto te = g.tensors.find("token_embd.weight");
  if (te == g.tensors.end()) g.fail("tensor token_embd.weight is missing");
  if (te->second.ne.size() != 2) g.fail("tensor token_embd.weight is not a matrix");
  c.vocab_size = static_cast<int64_t>(te->second.ne[1]);
  c.tie_embeddings = !g.tensors.count("output.weight");
  if (a == "gpt2") {
    c.norm = NormKind::LayerNorm, c.mlp = MlpKind::GeluTanh, c.pos = PosKind::Learned, c.bias = true;
    c.norm_eps = g.real(a + ".attention.layer_norm_epsilon", 0, true);
  } else {
    c.norm = NormKind::RMSNorm, c.mlp = MlpKind::SwiGLU, c.pos = PosKind::Rope;
    c.norm_eps = g.real(a + ".attention.layer_norm_rms_epsilon", 0, true);
    c.rope_theta = g.real(a + ".rope.freq_base", 10000.0, false);
    c.qkv_bias = g.tensors.count("blk.0.attn_q.bias") > 0;
    c.bias = g.tensors.count("blk.0.attn_output.bias") > 0;
    if (c.bias) c.qkv_bias = false;
  }
  if (c.n_head == 0 || c.n_embd % c.n_head || c.n_kv_head == 0 || c.n_head % c.n_kv_head)
    g.fail("heads " + std::to_string(c.n_head) + " and KV heads " + std::to_string(c.n_kv_head) + " do not divide embedding " + std::to_string(c.n_embd));
  if (a != "gpt2" && g.count(a + ".rope.dimension_count", c.head_dim(), 1 << 16) != c.head_dim())
    g.fail("key " + a + ".rope.dimension_count is " + std::to_string(g.count(a + ".rope.dimension_count")) + ": tapelm rotates the whole head (" +
           std::to_string(c.head_dim()) + ")");
  try {
    c.validate();
  } catch (const Error& e) {
    g.fail(std::string("its hyperparameters are not a model tapelm builds: ") + e.what());
  }
  GPT model(c);

  // Every tensor the model needs, from the file, in llama.cpp's layout; none left over.
  std::set<std::string> used;
  std::set<std::string> types;
  auto take = [&](const std::string& name, std::vector<uint64_t> ne) -> std::vector<float> {
    auto it = g.tensors.find(name);
    if (it == g.tensors.end()) g.fail("tensor " + name + " is missing");
    if (it->second.ne != ne) {
      std::string want, got;
      for (uint64_t d : ne) want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (uint64_t d : it->second.ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
      g.fail("tensor " + name + " has shape [" + got + "], the model needs [" + want + "]");
    }
    used.insert(name);
    static const std::map<uint32_t, std::string> tn{{T_F32, "F32"}, {T_F16, "F16"}, {T_BF16, "BF16"}, {T_Q8_0, "Q8_0"}};
    types.insert(tn.at(it->second.type));
    return values_of(g, it->second);
  };
  for (const Slot& slot : layout(model, a)) {
    const std::vector<float> v = reorder(take(slot.name, slot.ne()), slot, c, false);
    const float* from = v.data();
    for (const Tensor& t : slot.parts) {
      std::memcpy(const_cast<float*>(t.data()), from, static_cast<size_t>(t.numel()) * sizeof(float));
      from += t.numel();
    }
  }
  for (const auto& [name, t] : g.tensors)
    if (!used.count(name)) g.fail("tensor " + cut_for_message(name) + " has no place in " + a + " as its metadata describes it");
  for (const std::string& t : types) r.types += (r.types.empty() ? "" : ", ") + t;
  r.dequantized = types.count("Q8_0") > 0;

  std::optional<Tokenizer> tok;
  const std::string tm = g.string("tokenizer.ggml.model", false);
  if (tm == "llama") tok = spm_tokenizer(g);
  else if (tm == "gpt2") tok = bpe_tokenizer(g);
  else if (!tm.empty()) g.fail("tokenizer.ggml.model \"" + cut_for_message(tm) + "\": tapelm reads llama (sentencepiece) and gpt2 (byte-level BPE)");
  if (tok && tok->vocab_size() > c.vocab_size)
    g.fail("its vocabulary has " + std::to_string(tok->vocab_size()) + " tokens, more than token_embd's " + std::to_string(c.vocab_size));
  r.tokenizer = tm;
  nlohmann::json from{{"format", "gguf"}, {"architecture", a}, {"types", r.types}};
  write_imported(out, model, tok ? &*tok : nullptr, from.dump(), {});
  return r;
}

}  // namespace tapelm::gguf
