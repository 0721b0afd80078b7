#include "train/formats/gguf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "autograd/error.h"
#include "data/io.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "data/tokenizer/sentencepiece.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/utf8.h"
#include "nn/accounting.h"
#include "nn/gpt.h"
#include "train/formats/checkpoint.h"
#include "autograd/float16.h"
#include "train/formats/gguf_file.h"
#include "train/formats/layout.h"
#include "train/formats/tensor_source.h"

namespace tapelm::gguf {

namespace {

namespace fs = std::filesystem;
using formats::Family;

[[noreturn]] void refuse(const std::string& what, const std::string& why) { throw Error(ErrorKind::config, what + ": " + why); }

// general.file_type (llama_ftype).
uint32_t file_type(WeightType dtype) {
  switch (dtype) {
    case WeightType::f32: return 0;
    case WeightType::f16: return 1;
    case WeightType::q8_0: return 7;
    case WeightType::bf16: return 32;
  }
  return 0;
}

// A matrix's type in dtype (a q8_0 matrix whose rows are not a multiple of 32 is written f16).
TensorType matrix_type(WeightType dtype, int64_t row) {
  if (dtype == WeightType::f32) return T_F32;
  if (dtype == WeightType::f16) return T_F16;
  if (dtype == WeightType::bf16) return T_BF16;
  return row % 32 == 0 ? T_Q8_0 : T_F16;
}

// The family llama.cpp runs a config as, with what GGUF adds to the family's own refusals.
Family family_for_gguf(const GPTConfig& c, const std::string& what) {
  const Family f = formats::family_of(c, what);
  const formats::FamilyInfo& x = formats::family_info(f);
  if (x.gguf.none) refuse(what, std::string(x.hf_architecture) + ": llama.cpp has no architecture for " + x.name + " (export it as HF)");
  if (x.embed_scale && !formats::is_sqrt_d(c.embed_scale, c.n_embd))
    refuse(what, "embed_scale " + std::to_string(c.embed_scale) + ": llama.cpp's " + x.name + " multiplies the embeddings by √" + std::to_string(c.n_embd));
  if (x.pos == PosKind::Rope && c.head_dim() % 2)
    refuse(what, "head_dim " + std::to_string(c.head_dim()) + " is odd: RoPE needs pairs");
  if (!x.swiglu && c.mlp != x.gguf.gelu)
    refuse(what, "mlp \"" + to_string(c.mlp) + "\": llama.cpp's " + x.name + " computes mlp \"" + to_string(x.gguf.gelu) + "\"; train or import with it");
  if (!*x.gguf.per_layer_kv_arch && c.per_layer_kv()) {
    std::string with, as;
    for (const formats::FamilyInfo& o : formats::families())
      if (*o.gguf.per_layer_kv_arch)
        with += std::string(with.empty() ? "" : ", ") + o.name, as += std::string(as.empty() ? "" : ", ") + o.gguf.per_layer_kv_arch;
    refuse(what, "key/value heads per layer (" + c.kv_heads_str() + ") in " + x.name + "'s layout: llama.cpp runs them in the " + with +
                     " layout alone (as its " + as + " architecture)");
  }
  return f;
}

// The architecture a model is written as: its family's, or the one llama.cpp runs its per-layer
// KV heads as.
std::string gguf_arch(const GPTConfig& c, Family f) {
  const formats::FamilyInfo& x = formats::family_info(f);
  return c.per_layer_kv() && *x.gguf.per_layer_kv_arch ? x.gguf.per_layer_kv_arch : x.name;
}

// The family of a file's general.architecture, or null.
const formats::FamilyInfo* family_of_arch(const std::string& a) {
  for (const formats::FamilyInfo& x : formats::families())
    if (!x.gguf.none && (a == x.name || (*x.gguf.per_layer_kv_arch && a == x.gguf.per_layer_kv_arch))) return &x;
  return nullptr;
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
  } else if (tok.kind() == TokenizerKind::fallback_bpe) {
    // llama.cpp's "llama" vocabulary merges by piece scores, a tokenizer.json by merge ranks: not
    // one function in general, so no scores are made up.
    refuse(what, "the byte-fallback BPE tokenizer (a sentencepiece-style tokenizer.json) has no llama.cpp form tapelm writes: "
                 "import the model's directory with its tokenizer.model, which llama.cpp's \"llama\" vocabulary is");
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

// The hyperparameter keys of the file, as llama.cpp names them for architecture a.
void config_meta(Meta& m, const GPTConfig& c, Family f) {
  const std::string a = gguf_arch(c, f);
  m.u32(a + ".context_length", c.block_size);
  m.u32(a + ".embedding_length", c.n_embd);
  m.u32(a + ".block_count", c.n_layer);
  m.u32(a + ".feed_forward_length", c.mlp_hidden);
  m.u32(a + ".attention.head_count", c.n_head);
  if (c.per_layer_kv()) m.u32s(a + ".attention.head_count_kv", c.layer_kv_heads);  // llama.cpp reads a count per layer
  else m.u32(a + ".attention.head_count_kv", c.n_kv_head);
  const formats::FamilyInfo& x = formats::family_info(f);
  if (x.gguf.rope) m.f32(a + ".rope.freq_base", c.rope_theta);
  m.f32(a + "." + x.gguf.eps, c.norm_eps);
  if (x.gguf.rope) {
    m.u32(a + ".rope.dimension_count", c.rope_dims());
    m.u32(a + ".vocab_size", c.vocab_size);
  }
  if (x.gguf.no_window_key) m.u32(a + ".attention.sliding_window", 0);
  if (x.parallel_residual) m.flag(a + ".use_parallel_residual", c.parallel_residual);
  if (c.head_dim() * c.n_head != c.n_embd) {  // a head width of its own
    m.u32(a + ".attention.key_length", c.head_dim());
    m.u32(a + ".attention.value_length", c.head_dim());
  }
}

// llama.cpp's "llama" vocabulary as a sentencepiece model (token types are sentencepiece's: 1
// normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
Tokenizer spm_tokenizer(const File& g) {
  const std::vector<std::string>& tokens = g.strings("tokenizer.ggml.tokens");
  const std::vector<double>& scores = g.numbers("tokenizer.ggml.scores", tokens.size());
  const std::vector<double>& types = g.numbers("tokenizer.ggml.token_type", tokens.size());
  std::vector<SentencePiecePiece> pieces;
  int64_t unk = -1;
  for (size_t i = 0; i < tokens.size(); i++) {
    const int type = static_cast<int>(types[i]);
    if (types[i] != type || type < 1 || type > 6) g.fail("tokenizer.ggml.token_type[" + std::to_string(i) + "] is not a token type 1-6");
    if (type == 2 && unk < 0) unk = static_cast<int64_t>(i);
    pieces.push_back({tokens[i], static_cast<float>(scores[i]), static_cast<PieceKind>(type - 1)});
  }
  const int64_t V = static_cast<int64_t>(tokens.size());
  auto id = [&](const char* key) { return g.find_key(key) ? g.count(key, -1, V - 1) : -1; };
  try {
    return SentencePiece::from_pieces(pieces, g.count("tokenizer.ggml.unknown_token_id", unk < 0 ? 0 : unk, V - 1),
                                      id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"),
                                      g.flag("tokenizer.ggml.add_space_prefix", true));
  } catch (const Error& e) {
    g.fail(std::string("its llama vocabulary is not a valid sentencepiece model: ") + e.what());
  }
}

// llama.cpp's "gpt2" vocabulary as a byte-level BPE tokenizer.json.
Tokenizer bpe_tokenizer(const File& g) {
  using json = nlohmann::json;
  const std::vector<std::string>& tokens = g.strings("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = g.strings("tokenizer.ggml.merges");
  const Value* tv = g.find_key("tokenizer.ggml.token_type");
  const std::vector<double> types = tv ? g.numbers("tokenizer.ggml.token_type", tokens.size()) : std::vector<double>(tokens.size(), 1);
  const int64_t V = static_cast<int64_t>(tokens.size());
  const int64_t bos = g.find_key("tokenizer.ggml.bos_token_id") ? g.count("tokenizer.ggml.bos_token_id", -1, V - 1) : -1;
  const int64_t eos = g.find_key("tokenizer.ggml.eos_token_id") ? g.count("tokenizer.ggml.eos_token_id", -1, V - 1) : -1;
  json vocab = json::object(), added = json::array();
  for (int64_t i = 0; i < V; i++) {
    // A gpt2 vocabulary's tokens are byte-alphabet text, always valid UTF-8 (was a raw JSON
    // library message); token types as the sentencepiece path checks them.
    if (const size_t bad = utf8_first_invalid(tokens[i]); bad != std::string::npos)
      g.fail("tokenizer.ggml.tokens[" + std::to_string(i) + "] is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    if (vocab.contains(tokens[i])) g.fail("tokenizer.ggml.tokens[" + std::to_string(i) + "] repeats an earlier token");
    vocab[tokens[i]] = i;
    const double t = types[i];
    if (t != static_cast<int>(t) || t < 1 || t > 6)
      g.fail("tokenizer.ggml.token_type[" + std::to_string(i) + "] is not a token type 1-6");
    if (t == 3 || t == 4)  // control and user-defined tokens: added tokens, special when control or BOS/EOS
      added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", t == 3 || i == bos || i == eos}});
  }
  const std::string name = g.string("tokenizer.ggml.pre", false).empty() ? "default" : g.string("tokenizer.ggml.pre");
  const KnownPre* k = known_pre(name);
  if (!k) g.fail("tokenizer.ggml.pre \"" + cut_for_message(name) + "\": tapelm knows gpt-2, llama-bpe, qwen2 and smollm");
  json t = ByteBpe::assemble(std::move(vocab), merges, std::move(added), k->pre, k->nfc, k->ignore_merges);
  return Tokenizer(ByteBpe::from_parsed(std::move(t), "GGUF file " + g.path() + ": its gpt2 vocabulary",
                                                       bos >= 0 ? tokens[bos] : "", eos >= 0 ? tokens[eos] : ""));
}

// Keys that would change the function tapelm computes: refused unless they hold the value that
// changes nothing.
void refuse_unsupported_keys(const File& g, const std::string& a) {
  for (const char* k : {".expert_count", ".attention.sliding_window", ".rope.scaling.factor"}) {
    const Value* v = g.find_key(a + k);
    if (!v) continue;
    const std::string key = a + k;
    if ((key.ends_with("expert_count") || key.ends_with("sliding_window")) && v->is_int && v->i == 0) continue;  // none
    if (key.ends_with("scaling.factor") && !v->is_int && (v->num == 1.0 || v->num == 0.0)) continue;
    g.fail("key " + key + " is set: tapelm's model has no " +
           (key.ends_with("expert_count") ? std::string("mixture of experts") : key.ends_with("sliding_window") ? "sliding window" : "rope scaling"));
  }
  if (g.find_key(a + ".rope.scaling.type") && g.string(a + ".rope.scaling.type") != "none")
    g.fail("key " + a + ".rope.scaling.type is \"" + cut_for_message(g.string(a + ".rope.scaling.type")) + "\": tapelm has no rope scaling");
  if (g.tensor("rope_freqs.weight")) g.fail("tensor rope_freqs.weight (rope frequency factors): tapelm has no rope scaling");
}

// The model a file's metadata describes.
GPTConfig config_of(const File& g, Family f, const std::string& a) {
  GPTConfig c;
  formats::apply_family(f, c);
  c.n_layer = g.count(a + ".block_count", -1, 1 << 16);
  c.n_embd = g.count(a + ".embedding_length", -1, 1 << 20);
  c.n_head = g.count(a + ".attention.head_count", -1, 1 << 12);
  const std::vector<int64_t> kv = g.counts(a + ".attention.head_count_kv", static_cast<size_t>(c.n_layer), c.n_head, 1 << 12);
  if (std::count(kv.begin(), kv.end(), 0) > 0) g.fail("key " + a + ".attention.head_count_kv holds 0 key/value heads for a layer");
  if (!kv.empty()) c.set_kv_heads(kv);  // no layers: refused below
  c.mlp_hidden = g.count(a + ".feed_forward_length", -1, 1 << 22);
  c.block_size = g.count(a + ".context_length", -1, 1 << 24);
  const TensorInfo* te = g.tensor("token_embd.weight");
  if (!te) g.fail("tensor token_embd.weight is missing");
  if (te->ne.size() != 2) g.fail("tensor token_embd.weight is not a matrix");
  c.vocab_size = static_cast<int64_t>(te->ne[1]);
  c.tie_embeddings = !g.tensor("output.weight");
  if (static_cast<uint64_t>(c.n_layer) > g.table().size())
    g.fail("key " + a + ".block_count is " + std::to_string(c.n_layer) + ", but the file holds " + std::to_string(g.table().size()) +
           " tensors");
  const formats::FamilyInfo& x = formats::family_info(f);
  if (!x.swiglu) c.mlp = x.gguf.gelu;
  if (x.embed_scale) c.embed_scale = formats::sqrt_d_as(c.n_embd, "float32");  // llama.cpp's sqrtf(n_embd)
  c.norm_eps = g.real(a + "." + x.gguf.eps, 0, true);
  if (x.gguf.rope) c.rope_theta = g.real(a + ".rope.freq_base", 10000.0, false);
  if (x.gguf.optional_bias) c.bias = g.tensor("blk.0.attn_output.bias") != nullptr;
  if (c.n_head == 0 || c.n_kv_head == 0 || c.n_head % c.n_kv_head)
    g.fail("heads " + std::to_string(c.n_head) + " and KV heads " + std::to_string(c.n_kv_head) + " do not divide each other");
  // a head width of its own (Qwen3, Gemma): key_length, which value_length must equal
  const int64_t hd = g.count(a + ".attention.key_length", c.n_embd % c.n_head ? 0 : c.n_embd / c.n_head, 1 << 16);
  if (hd <= 0) g.fail("heads " + std::to_string(c.n_head) + " do not divide embedding " + std::to_string(c.n_embd) + " and no " + a + ".attention.key_length says the head width");
  if (g.count(a + ".attention.value_length", hd, 1 << 16) != hd)
    g.fail("key " + a + ".attention.value_length " + std::to_string(g.count(a + ".attention.value_length")) + " is not key_length " +
           std::to_string(hd) + ": tapelm's keys and values have one head width");
  c.head_size = hd * c.n_head == c.n_embd ? 0 : hd;
  if (x.gguf.rope) {
    const int64_t rot = g.count(a + ".rope.dimension_count", c.head_dim(), 1 << 16);
    if (rot != c.head_dim() && !x.partial_rotary)
      g.fail("key " + a + ".rope.dimension_count is " + std::to_string(rot) + ": tapelm rotates the whole head (" + std::to_string(c.head_dim()) +
             ") in " + x.name + "'s layout");
    if (rot == 0 || rot % 2 || rot > c.head_dim())
      g.fail("key " + a + ".rope.dimension_count is " + std::to_string(rot) + ": RoPE rotates an even count of a head's " +
             std::to_string(c.head_dim()) + " dims");
    c.rotary_dims = rot == c.head_dim() ? 0 : rot;
  }
  if (x.parallel_residual) {  // required, as llama.cpp requires it
    if (!g.find_key(a + ".use_parallel_residual")) g.fail("key " + a + ".use_parallel_residual is missing");
    c.parallel_residual = g.flag(a + ".use_parallel_residual", false);
  }
  c.family = formats::family_key(f, c);
  try {
    c.validate();
  } catch (const Error& e) {
    g.fail(std::string("its hyperparameters are not a model tapelm builds: ") + e.what());
  }
  return c;
}

}  // namespace

void round_like_export(GPT& model, WeightType dtype) {
  if (dtype == WeightType::f32) return;
  for (auto& [name, p] : model.named_parameters()) {
    Tensor t = p.val();
    if (t.ndim() != 2) continue;
    float* v = t.data();
    const int64_t n = t.numel(), cols = t.shape()[1];
    const TensorType ty = matrix_type(dtype, cols);
    if (ty == T_Q8_0) {
      const std::vector<float> back = dequantize_q8_0(quantize_q8_0(v, n, name).data(), n);
      std::copy(back.begin(), back.end(), v);
    } else {
      for (int64_t i = 0; i < n; i++) v[i] = ty == T_F16 ? f16_to_f32(f32_to_f16(v[i])) : bf16_to_f32(f32_to_bf16(v[i]));
    }
  }
}

void check_writable(const std::string& out, const GPTConfig& c, const Tokenizer* tok, WeightType, const std::string& what) {
  if (fs::is_directory(out)) throw Error(ErrorKind::usage, "--out " + out + " is a directory; GGUF is one file");
  family_for_gguf(c, what);
  if (!tok) refuse(what, "has no tokenizer: llama.cpp needs the vocabulary in the file");
  if (tok->vocab_size() > c.vocab_size)
    refuse(what, "the tokenizer has " + std::to_string(tok->vocab_size()) + " ids, more than the model's " + std::to_string(c.vocab_size));
  if (tok->vocab_size() != c.vocab_size)
    refuse(what, "the model has " + std::to_string(c.vocab_size) + " ids and its tokenizer " + std::to_string(tok->vocab_size()) +
                     ": llama.cpp needs one token per id");
}

ExportResult write_model(const std::string& out, const GPTConfig& c, const Tokenizer* tok, WeightType dtype, const std::string& what,
                         const formats::SinkFill& fill) {
  check_writable(out, c, tok, dtype, what);
  const Family f = family_for_gguf(c, what);
  ExportResult r;
  r.architecture = gguf_arch(c, f);
  Meta m;
  m.str("general.architecture", r.architecture);
  m.str("general.name", fs::path(what).stem().string());
  m.u32("general.file_type", file_type(dtype));
  if (dtype == WeightType::q8_0) m.u32("general.quantization_version", 2);
  config_meta(m, c, f);
  tokenizer_meta(m, *tok, what, r);

  const std::vector<formats::FileTensor> layout = formats::layout(c, f, formats::Format::gguf);
  std::vector<OutTensor> ts;
  for (const formats::FileTensor& t : layout) {
    const TensorType type = t.matrix ? matrix_type(dtype, t.shape.back()) : T_F32;
    ts.push_back({t.name, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), type, nullptr});
  }
  r.tensors = static_cast<int64_t>(ts.size());
  r.bytes = file_size(m, ts);
  const std::vector<uint64_t> at = tensor_offsets(m, ts);
  std::vector<formats::Placement> placements;
  for (size_t i = 0; i < ts.size(); i++)
    placements.push_back({layout[i], 0, at[i], [&t = ts[i], &out](const std::vector<float>& v) { return tensor_bytes(t, v, out); }});
  formats::write_placed("GGUF file " + out, c, {}, {{out, head_bytes(m, ts)}}, placements, fill);
  return r;
}

ExportResult export_model(const formats::OpenedModel& m, const std::string& out, WeightType dtype) {
  return write_model(out, m.config, m.tok ? &*m.tok : nullptr, dtype, m.path, [&](formats::ModelSink& s) { m.push_each(s); });
}

namespace {
formats::OpenedModel open_file(const std::string& path, ImportResult& r) {
  auto owned = std::make_unique<File>(path);
  const File& g = *owned;
  const std::string a = g.string("general.architecture");
  const formats::FamilyInfo* fam = family_of_arch(a);
  if (!fam) {
    std::string known;
    for (const formats::FamilyInfo& x : formats::families())
      if (!x.gguf.none) known += std::string(known.empty() ? "" : ", ") + x.name + (*x.gguf.per_layer_kv_arch ? std::string(" (and ") + x.gguf.per_layer_kv_arch + ", its layers' own KV heads)" : "");
    g.fail("general.architecture \"" + cut_for_message(a) + "\": tapelm reads " + known);
  }
  r.architecture = a;
  refuse_unsupported_keys(g, a);
  formats::OpenedModel m;
  m.path = path;
  m.format = "gguf";
  m.what = "GGUF file " + path;
  m.config = config_of(g, fam->family, a);
  // The metadata's sizes against the tensor table, before any memory is committed to them.
  m.layout = formats::layout(m.config, fam->family, formats::Format::gguf);
  m.rules = {a + " as its metadata describes it", ErrorKind::data, {}};
  formats::check_tensors(m.layout, g, m.rules);
  m.dtypes = r.types = formats::stored_dtypes(m.layout, g);
  r.dequantized = r.types.find("Q8_0") != std::string::npos;
  const std::string tm = g.string("tokenizer.ggml.model", false);
  if (tm == "llama") m.tok = spm_tokenizer(g);
  else if (tm == "gpt2") m.tok = bpe_tokenizer(g);
  else if (!tm.empty()) g.fail("tokenizer.ggml.model \"" + cut_for_message(tm) + "\": tapelm reads llama (sentencepiece) and gpt2 (byte-level BPE)");
  if (m.tok && m.tok->vocab_size() > m.config.vocab_size)
    g.fail("its vocabulary has " + std::to_string(m.tok->vocab_size()) + " tokens, more than token_embd's " + std::to_string(m.config.vocab_size));
  r.tokenizer = tm;
  m.from = {{"format", "gguf"}, {"architecture", a}, {"types", r.types}};
  m.src = std::move(owned);
  return m;
}
}  // namespace

formats::OpenedModel open_model(const std::string& path) {
  ImportResult r;
  return open_file(path, r);
}

ImportResult import_model(const std::string& path, const std::string& out) {
  ImportResult r;
  const formats::OpenedModel m = open_file(path, r);
  r.kept = m.kept_dtype();
  m.write_imported(out);
  return r;
}

}  // namespace tapelm::gguf
