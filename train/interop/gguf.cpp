#include "train/interop/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "autograd/error.h"
#include "data/bytebpe.h"
#include "data/io.h"
#include "data/tokenizer.h"
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
// head, row j goes to 2j and row j + hd/2 to 2j + 1 (llama.cpp's convert_hf_to_gguf permute).
std::vector<float> interleave_rope_rows(const std::vector<float>& w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < hd / 2; j++)
      for (int64_t s = 0; s < 2; s++) {
        const int64_t from = h * hd + s * (hd / 2) + j, to = h * hd + 2 * j + s;
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

void tokenizer_meta(Meta& m, const Tokenizer& tok, const std::string& what, ExportResult& r) {
  const int32_t V = tok.vocab_size();
  std::vector<std::string> tokens(V);
  std::vector<int32_t> types(V);
  for (int32_t i = 0; i < V; i++) {
    tokens[i] = tok.piece(i);
    // llama.cpp's token types: normal 1, unknown 2, control 3, user-defined 4, unused 5, byte 6
    types[i] = 1 + static_cast<int32_t>(tok.piece_kind(i));
  }
  if (tok.kind_name() == "sentencepiece") {
    r.tokenizer = "llama";
    std::vector<float> scores(V);
    for (int32_t i = 0; i < V; i++) scores[i] = tok.score(i);
    m.str("tokenizer.ggml.model", "llama");
    m.strs("tokenizer.ggml.tokens", tokens);
    m.f32s("tokenizer.ggml.scores", scores);
    m.i32s("tokenizer.ggml.token_type", types);
    for (int32_t i = 0; i < V; i++)
      if (tok.piece_kind(i) == Tokenizer::PieceKind::unknown) m.u32("tokenizer.ggml.unknown_token_id", i);
    m.flag("tokenizer.ggml.add_space_prefix", tok.adds_dummy_prefix());
  } else if (const ByteBpe* b = tok.byte_bpe()) {
    r.tokenizer = "gpt2";
    const std::string pre = b->llama_cpp_pre();
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

// The tensors of the model as llama.cpp names and lays them out.
std::vector<Out> tensors_of(const GPT& m, const std::string& arch, const std::string& dtype) {
  const GPTConfig& c = m.config();
  std::vector<Out> out;
  auto vec = [&](const std::string& name, const Tensor& t) {
    out.push_back({name, {static_cast<uint64_t>(t.numel())}, T_F32, [t] { return concat({t}); }});
  };
  auto mat = [&](const std::string& name, std::vector<Tensor> parts, std::function<std::vector<float>(std::vector<float>)> f = nullptr) {
    int64_t rows = 0;
    for (const Tensor& t : parts) rows += t.shape()[0];
    const int64_t cols = parts[0].shape()[1];
    out.push_back({name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, matrix_type(dtype, cols),
                   [parts, f] { return f ? f(concat(parts)) : concat(parts); }});
  };
  auto norm = [&](const std::string& name, const Norm& n) {
    vec(name + ".weight", n.weight.val());
    if (n.bias.defined()) vec(name + ".bias", n.bias.val());
  };
  auto linear = [&](const std::string& name, const Linear& l, std::function<std::vector<float>(std::vector<float>)> f = nullptr) {
    mat(name + ".weight", {l.weight.val()}, f);
    if (l.bias.defined()) {
      const Tensor b = l.bias.val();
      out.push_back({name + ".bias", {static_cast<uint64_t>(b.numel())}, T_F32, [b, f] {
                       return f ? f(concat({b})) : concat({b});  // a bias is a one-column matrix to the permutation
                     }});
    }
  };
  const int64_t hd = c.head_dim();
  mat("token_embd.weight", {m.wte->weight.val()});
  if (arch == "gpt2") mat("position_embd.weight", {m.wpe->weight.val()});
  for (int64_t i = 0; i < c.n_layer; i++) {
    const Block& b = *m.blocks[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm", *b.ln1);
    if (arch == "gpt2") {
      mat(p + "attn_qkv.weight", {b.attn->wq->weight.val(), b.attn->wk->weight.val(), b.attn->wv->weight.val()});
      const Tensor bq = b.attn->wq->bias.val(), bk = b.attn->wk->bias.val(), bv = b.attn->wv->bias.val();
      out.push_back({p + "attn_qkv.bias", {static_cast<uint64_t>(bq.numel() + bk.numel() + bv.numel())}, T_F32,
                     [bq, bk, bv] { return concat({bq, bk, bv}); }});
      linear(p + "attn_output", *b.attn->wo);
      norm(p + "ffn_norm", *b.ln2);
      linear(p + "ffn_up", *b.mlp->fc);
      linear(p + "ffn_down", *b.mlp->proj);
      continue;
    }
    std::function<std::vector<float>(std::vector<float>)> pq, pk;
    if (arch == "llama") {
      const int64_t H = c.n_head, KV = c.n_kv_head;
      pq = [H, hd](std::vector<float> w) { return interleave_rope_rows(w, H, hd, static_cast<int64_t>(w.size()) / (H * hd)); };
      pk = [KV, hd](std::vector<float> w) { return interleave_rope_rows(w, KV, hd, static_cast<int64_t>(w.size()) / (KV * hd)); };
    }
    linear(p + "attn_q", *b.attn->wq, pq);
    linear(p + "attn_k", *b.attn->wk, pk);
    linear(p + "attn_v", *b.attn->wv);
    linear(p + "attn_output", *b.attn->wo);
    norm(p + "ffn_norm", *b.ln2);
    linear(p + "ffn_gate", *b.mlp->gate);
    linear(p + "ffn_up", *b.mlp->up);
    linear(p + "ffn_down", *b.mlp->down);
  }
  norm("output_norm", *m.ln_f);
  if (!c.tie_embeddings) mat("output.weight", {m.lm_head.val()});
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
    GPTConfig with = c;
    with.bias = true;
    auto m = std::make_unique<GPT>(with);
    const NamedParams src = model->named_parameters();
    for (auto& [name, p] : m->named_parameters()) {
      auto it = std::find_if(src.begin(), src.end(), [&](const auto& q) { return q.first == name; });
      if (it != src.end()) std::memcpy(p.val().data(), it->second.val().data(), static_cast<size_t>(p.val().numel()) * 4);
      else std::fill(p.val().data(), p.val().data() + p.val().numel(), 0.f);
    }
    model = std::move(m);
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

}  // namespace tapelm::gguf
