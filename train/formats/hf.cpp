#include "train/formats/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "autograd/error.h"
#include "data/io.h"
#include "data/outdir.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "data/tokenizer/sentencepiece.h"
#include "data/tokenizer/tokenizer.h"
#include "nn/accounting.h"
#include "nn/gpt.h"
#include "train/formats/checkpoint.h"
#include "train/formats/hf_tokenizer.h"
#include "train/formats/layout.h"
#include "train/formats/safetensors.h"
#include "train/formats/tensor_source.h"

namespace tapelm::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;
using formats::Family;

namespace {

// Mistral is Llama's function under another name (with a sliding window by default).
constexpr const char* kMistral = "MistralForCausalLM";
// The longest context read: GGUF's context_length limit, so every import can be exported.
constexpr int64_t kMaxPositions = int64_t(1) << 24;

[[noreturn]] void refuse(const std::string& what, const std::string& why) { throw Error(ErrorKind::config, what + ": " + why); }

// Reads j[key] with config_get's type checks, naming the file in the error.
template <class T> void get(const json& j, const std::string& key, T& out, const std::string& what) {
  try {
    config_get(j, key, out);
  } catch (const Error& e) {
    refuse(what, e.what());
  }
}

bool present(const json& j, const std::string& key) { return j.contains(key) && !j[key].is_null(); }

std::string arch_of(const json& j, const std::string& what) {
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string())
      refuse(what, "architectures must be a list of names, got " + echo_json(a));
    return a[0].get<std::string>();
  }
  std::string mt;
  get(j, "model_type", mt, what);
  if (mt == "mistral") return kMistral;
  if (const formats::FamilyInfo* f = formats::find_family(mt); f && mt == f->hf_model_type) return f->hf_architecture;
  refuse(what, mt.empty() ? "names neither architectures nor model_type" : "model_type \"" + cut_for_message(mt) + "\" is not one tapelm reads");
}

void read_rope(const json& j, GPTConfig& c, const std::string& what) {
  c.rope_theta = 10000.0;
  get(j, "rope_theta", c.rope_theta, what);
  if (present(j, "rope_scaling")) refuse(what, "rope_scaling " + echo_json(j["rope_scaling"]) + ": tapelm's RoPE has no scaling");
  if (present(j, "rope_parameters")) {  // transformers 5's spelling of rope_theta and rope_scaling
    const json& r = j["rope_parameters"];
    if (!r.is_object()) refuse(what, "rope_parameters must be an object, got " + echo_json(r));
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key() == "rope_theta") get(r, "rope_theta", c.rope_theta, what);
      else if (it.key() == "rope_type") {
        std::string t;
        get(r, "rope_type", t, what);
        if (t != "default") refuse(what, "rope_parameters.rope_type \"" + cut_for_message(t) + "\": tapelm's RoPE has no scaling");
      } else {
        refuse(what, "rope_parameters." + cut_for_message(it.key()) + " " + echo_json(it.value()) + ": tapelm's RoPE has no scaling");
      }
    }
  }
  if (present(j, "partial_rotary_factor")) {
    double f = 1;
    get(j, "partial_rotary_factor", f, what);
    if (f != 1) refuse(what, "partial_rotary_factor " + echo_json(j["partial_rotary_factor"]) + ": tapelm rotates the whole head");
  }
}

void llama_like(const json& j, HfConfig& h, const std::string& what) {
  GPTConfig& c = h.config;
  const bool qwen = h.family == Family::qwen2;
  formats::apply_family(h.family, c);
  c.tie_embeddings = false;
  for (const char* k : {"hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"})
    if (!j.contains(k)) refuse(what, std::string("has no ") + k);
  get(j, "vocab_size", c.vocab_size, what);
  get(j, "hidden_size", c.n_embd, what);
  get(j, "num_hidden_layers", c.n_layer, what);
  get(j, "num_attention_heads", c.n_head, what);
  c.n_kv_head = c.n_head;
  if (present(j, "num_key_value_heads")) get(j, "num_key_value_heads", c.n_kv_head, what);
  if (c.n_kv_head <= 0 || c.n_head % c.n_kv_head != 0)
    refuse(what, "num_key_value_heads " + std::to_string(c.n_kv_head) + " does not divide num_attention_heads " + std::to_string(c.n_head));
  get(j, "intermediate_size", c.mlp_hidden, what);
  c.norm_eps = 1e-6;
  get(j, "rms_norm_eps", c.norm_eps, what);
  c.block_size = 2048;
  get(j, "max_position_embeddings", c.block_size, what);
  if (c.block_size > kMaxPositions)
    refuse(what, "max_position_embeddings " + std::to_string(c.block_size) + " is beyond the " + std::to_string(kMaxPositions) +
                     " positions tapelm reads (as GGUF's context_length)");
  get(j, "tie_word_embeddings", c.tie_embeddings, what);
  std::string act = "silu";
  get(j, "hidden_act", act, what);
  if (act != "silu") refuse(what, "hidden_act \"" + cut_for_message(act) + "\": tapelm's gated MLP uses silu");
  read_rope(j, c, what);
  if (present(j, "head_dim")) {
    int64_t hd = 0;
    get(j, "head_dim", hd, what);
    if (c.n_head <= 0 || hd * c.n_head != c.n_embd)
      refuse(what, "head_dim " + std::to_string(hd) + " is not hidden_size / num_attention_heads (" + std::to_string(c.n_embd) +
                       " / " + std::to_string(c.n_head) + ")");
  }
  if (present(j, "quantization_config")) refuse(what, "quantization_config: a quantized model (tapelm reads F32, F16 and BF16)");
  // A sliding window at least as long as the context never applies. Qwen2 uses one only when
  // use_sliding_window is true; Mistral's config defaults to a 4096-token window, as transformers'.
  bool sliding = !qwen || (present(j, "use_sliding_window") && j["use_sliding_window"] == true);
  if (qwen) get(j, "use_sliding_window", sliding, what);
  const bool mistral_default = h.architecture == kMistral && !j.contains("sliding_window");
  if (sliding && (present(j, "sliding_window") || mistral_default)) {
    int64_t w = 4096;
    get(j, "sliding_window", w, what);
    if (w < c.block_size)
      refuse(what, std::string(mistral_default ? "no sliding_window (Mistral's default is 4096)" : "sliding_window " + std::to_string(w)) + " is shorter than the context (max_position_embeddings " +
                       std::to_string(c.block_size) + "): tapelm attends over the whole context");
  }
  if (!qwen) {
    bool attn_bias = false, mlp_bias = false;
    get(j, "attention_bias", attn_bias, what);
    get(j, "mlp_bias", mlp_bias, what);
    if (attn_bias != mlp_bias)
      refuse(what, std::string("attention_bias ") + (attn_bias ? "true" : "false") + " with mlp_bias " + (mlp_bias ? "true" : "false") +
                       ": tapelm's bias puts biases on every projection or none (Qwen2's q/k/v biases are qkv_bias)");
    c.bias = attn_bias;
  }
}

void gpt2(const json& j, HfConfig& h, const std::string& what) {
  GPTConfig& c = h.config;
  formats::apply_family(Family::gpt2, c);
  c.tie_embeddings = true;
  // GPT2Config's defaults: the 124M model
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  get(j, "vocab_size", c.vocab_size, what);
  get(j, "n_positions", c.block_size, what);
  if (c.block_size > kMaxPositions)
    refuse(what, "n_positions " + std::to_string(c.block_size) + " is beyond the " + std::to_string(kMaxPositions) + " positions tapelm reads");
  get(j, "n_embd", c.n_embd, what);
  get(j, "n_layer", c.n_layer, what);
  get(j, "n_head", c.n_head, what);
  c.n_kv_head = c.n_head;
  c.mlp_hidden = 4 * c.n_embd;
  if (present(j, "n_inner")) get(j, "n_inner", c.mlp_hidden, what);
  c.norm_eps = 1e-5;
  get(j, "layer_norm_epsilon", c.norm_eps, what);
  get(j, "tie_word_embeddings", c.tie_embeddings, what);
  std::string act = "gelu_new";
  get(j, "activation_function", act, what);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.mlp = MlpKind::GeluTanh;
  else if (act == "gelu") c.mlp = MlpKind::Gelu;
  else refuse(what, "activation_function \"" + cut_for_message(act) + "\": tapelm has GELU (exact, or tanh as gelu_new)");
  bool scale = true, by_layer = false, cross = false;
  get(j, "scale_attn_weights", scale, what);
  get(j, "scale_attn_by_inverse_layer_idx", by_layer, what);
  get(j, "add_cross_attention", cross, what);
  if (!scale) refuse(what, "scale_attn_weights false: tapelm scales scores by 1/sqrt(head dim)");
  if (by_layer) refuse(what, "scale_attn_by_inverse_layer_idx true: tapelm scales every layer's scores alike");
  if (cross) refuse(what, "add_cross_attention true: tapelm's blocks have no cross-attention");
}

}  // namespace

HfConfig parse_config(const json& j, const std::string& what) {
  if (!j.is_object()) refuse(what, "is not a JSON object");
  HfConfig h;
  h.architecture = arch_of(j, what);
  const formats::FamilyInfo* f = h.architecture == kMistral ? &formats::family_info(Family::llama) : formats::find_family(h.architecture);
  if (f && (h.architecture == f->hf_architecture || h.architecture == kMistral)) h.family = f->family;
  else f = nullptr;
  if (f && f->family == Family::gpt2)
    gpt2(j, h, what);
  else if (f)
    llama_like(j, h, what);
  else
    refuse(what, "architecture \"" + cut_for_message(h.architecture) +
                     "\" is not one tapelm reads (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel)");
  h.config.dropout = 0;
  for (const char* k : {"bos_token_id", "eos_token_id"}) {
    if (!present(j, k)) continue;
    const json& v = j[k];
    int64_t id = -1;
    if (v.is_array()) {  // several EOS ids (Llama 3.1): the first is the one tapelm uses
      if (!v.empty()) get(json{{k, v[0]}}, k, id, what);
    } else {
      get(j, k, id, what);
    }
    (std::string(k) == "bos_token_id" ? h.bos_token_id : h.eos_token_id) = id;
  }
  try {
    h.config.validate();
  } catch (const Error& e) {
    refuse(what, e.what());
  }
  return h;
}

HfConfig read_config(const std::string& path) { return parse_config(read_config_file(path), "HF config " + path); }

std::string architecture_for(const GPTConfig& c, const std::string& what) {
  const Family f = formats::family_of(c, what);
  if (c.per_layer_kv())
    throw Error(ErrorKind::config, what + ": key/value heads per layer (" + c.kv_heads_str() +
                                       "): a Hugging Face config has one num_key_value_heads (export to GGUF, which has a count per layer)");
  if (f == Family::gpt2 && c.n_kv_head != c.n_head)
    throw Error(ErrorKind::config, what + ": " + std::to_string(c.n_kv_head) + " key/value heads for " + std::to_string(c.n_head) +
                                       " query heads: GPT-2's layout (learned positions, LayerNorm, GELU) has no HF config with fewer KV heads");
  return formats::family_info(f).hf_architecture;
}

nlohmann::ordered_json config_json(const GPTConfig& c, const std::string& arch, const std::string& torch_dtype, int64_t bos,
                                   int64_t eos) {
  nlohmann::ordered_json j;
  j["architectures"] = {arch};
  auto ids = [&] {
    if (bos >= 0) j["bos_token_id"] = bos;
    if (eos >= 0) j["eos_token_id"] = eos;
  };
  if (arch == "GPT2LMHeadModel") {
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.block_size;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.mlp_hidden;
    j["activation_function"] = c.mlp == MlpKind::GeluTanh ? "gelu_new" : "gelu";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["initializer_range"] = 0.02;
  } else {
    const bool qwen = arch == "Qwen2ForCausalLM";
    j["model_type"] = qwen ? "qwen2" : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.mlp_hidden;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.block_size;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    if (qwen) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layer;
    } else {
      j["attention_bias"] = c.bias;
      j["mlp_bias"] = c.bias;
      j["pretraining_tp"] = 1;
    }
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  ids();
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j;
}

namespace {

// Tensors a file may hold that are no parameter: GPT-2's causal-mask buffers, old Llama files'
// RoPE frequencies.
bool buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with(".rotary_emb.inv_freq");
}

std::optional<Tokenizer> read_tokenizer(const std::string& dir, std::string& file) {
  const fs::path spm = fs::path(dir) / "tokenizer.model";
  if (fs::exists(spm)) {
    file = spm.string();
    return SentencePiece::load_file(file);
  }
  for (const char* name : {"tokenizer.json", "vocab.json"}) {  // byte-level BPE
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p)) {
      file = p.string();
      return hf::read_tokenizer_file(file);
    }
  }
  file.clear();
  return std::nullopt;
}

// The files an HF model directory holds that loaders read: what an export replaces (anything else
// in the directory, a user's README, is kept).
bool hf_model_file(const std::string& n) {
  static const std::set<std::string> names{"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                                           "pytorch_model.bin", "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer.model",
                                           "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                                           "added_tokens.json"};
  return names.count(n) || ((n.starts_with("model-") || n.starts_with("pytorch_model-")) &&
                            (n.ends_with(".safetensors") || n.ends_with(".bin")));
}

// The tokenizer files of an export, and what could not be written.
void tokenizer_files(const Tokenizer* tok, int64_t block_size, std::vector<std::pair<std::string, std::string>>& files,
                     std::string& note) {
  auto add = [&](const std::string& name, std::string bytes) { files.emplace_back(name, std::move(bytes)); };
  if (tok && tok->kind() == TokenizerKind::sentencepiece) {
    add("tokenizer.model", tok->serialized());
    nlohmann::ordered_json tc;
    tc["tokenizer_class"] = "LlamaTokenizer";
    tc["bos_token"] = tok->piece(tok->bos_id());
    tc["eos_token"] = tok->piece(tok->eos_id());
    tc["unk_token"] = tok->piece(0);
    tc["add_bos_token"] = true;
    tc["add_eos_token"] = false;
    tc["legacy"] = true;
    tc["model_max_length"] = block_size;
    add("tokenizer_config.json", tc.dump(2) + "\n");
  } else if (tok && tok->as<ByteBpe>()) {
    add("tokenizer.json", tok->as<ByteBpe>()->tokenizer_json() + "\n");
    nlohmann::ordered_json tc;
    tc["tokenizer_class"] = "PreTrainedTokenizerFast";
    if (tok->bos_id() >= 0) tc["bos_token"] = tok->piece(tok->bos_id());
    if (tok->eos_id() >= 0) tc["eos_token"] = tok->piece(tok->eos_id());
    tc["add_bos_token"] = false;
    tc["model_max_length"] = block_size;
    add("tokenizer_config.json", tc.dump(2) + "\n");
  } else if (tok) {
    note += std::string(note.empty() ? "" : "; ") + "the " + tok->kind_name() + " tokenizer has no HF form and was not written";
  }
}

}  // namespace

namespace {
// Opens the directory, filling r with what an import reports.
formats::OpenedModel open_dir(const std::string& dir, ImportResult& r) {
  if (!fs::is_directory(dir)) throw Error(ErrorKind::data, "HF model directory " + dir + ": not a directory");
  require_complete_output(dir, "HF model directory");
  r.hf = read_config((fs::path(dir) / "config.json").string());
  formats::OpenedModel m;
  m.path = dir;
  m.format = "hf";
  m.what = "HF model " + dir;
  m.config = r.hf.config;
  std::unique_ptr<safetensors::ModelFiles> src = safetensors::ModelFiles::open(dir);
  r.weight_files = src->files();
  formats::LayoutOptions lo;
  if (r.hf.family == Family::gpt2 && src->find("transformer.wte.weight")) lo.hf_prefix = "transformer.";
  formats::check_layer_count(m.config, r.hf.family, formats::Format::hf, lo, src->tensors().size(), "HF model " + dir);
  m.layout = formats::layout(m.config, r.hf.family, formats::Format::hf, lo);
  const safetensors::ModelFiles* files = src.get();
  const std::string emb = m.layout.front().name;
  const bool tied = m.config.tie_embeddings;
  m.rules = {r.hf.architecture + " as config.json describes it", ErrorKind::data,
             [files, emb, tied, dir](const formats::TensorSource::Info& t) {
               if (buffer(t.name)) return true;
               // a tied head stored anyway must be the embedding itself
               const formats::TensorSource::Info* e = files->find(emb);
               if (t.name != "lm_head.weight" || !tied || !e) return false;
               if (t.shape == e->shape && t.dtype == e->dtype && files->bytes(t) == files->bytes(*e)) return true;
               throw Error(ErrorKind::data, "HF model " + dir + ": lm_head.weight differs from " + emb +
                                                " but config.json ties them (tie_word_embeddings)");
             }};
  formats::check_tensors(m.layout, *src, m.rules);  // the config's sizes against the files, before any memory is committed
  m.dtypes = r.dtypes = formats::stored_dtypes(m.layout, *src);
  m.src = std::move(src);
  m.tok = read_tokenizer(dir, r.tokenizer_file);
  if (m.tok && m.tok->vocab_size() > m.config.vocab_size)
    throw Error(ErrorKind::data, r.tokenizer_file + ": " + std::to_string(m.tok->vocab_size()) + " tokens, more than the model's vocab_size " +
                                     std::to_string(m.config.vocab_size));
  m.from = {{"format", "hf"}, {"architecture", r.hf.architecture}, {"dtype", r.dtypes}};
  if (r.hf.bos_token_id >= 0) m.from["bos_token_id"] = r.hf.bos_token_id;
  if (r.hf.eos_token_id >= 0) m.from["eos_token_id"] = r.hf.eos_token_id;
  return m;
}
}  // namespace

formats::OpenedModel open_model(const std::string& dir) {
  ImportResult r;
  return open_dir(dir, r);
}

ImportResult import_model(const std::string& dir, const std::string& out) {
  ImportResult r;
  const formats::OpenedModel m = open_dir(dir, r);
  r.kept = m.kept_dtype();
  m.write_imported(out);
  return r;
}

namespace {
// --dtype: safetensors' dtype and config.json's torch_dtype.
const std::map<std::string, std::pair<std::string, std::string>> kDtypes{
    {"f32", {"F32", "float32"}}, {"bf16", {"BF16", "bfloat16"}}, {"f16", {"F16", "float16"}}};
}  // namespace

namespace {
void check_output(const std::string& dir, const std::string& dtype) {
  if (!kDtypes.count(dtype)) throw Error(ErrorKind::usage, "dtype \"" + dtype + "\": an HF model directory holds f32, bf16 or f16");
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(ErrorKind::data, "HF model directory " + dir + ": exists and is not a directory");
}
}  // namespace

void check_writable(const std::string& dir, const GPTConfig& c, const std::string& dtype, const std::string& what) {
  check_output(dir, dtype);
  architecture_for(c, what);
}

ExportResult write_model(const std::string& dir, const GPTConfig& cfg, const Tokenizer* tok, const std::string& dtype, const std::string& what,
                         const formats::SinkFill& fill, uint64_t max_shard_bytes) {
  check_writable(dir, cfg, dtype, what);
  const auto dt = kDtypes.find(dtype);
  ExportResult r;
  r.architecture = architecture_for(cfg, what);
  const Family f = formats::family_of(cfg, what);
  if (formats::family_info(f).all_biases && !cfg.bias) r.note = "biases written as zeros (GPT-2's layout has them everywhere)";

  const std::vector<formats::FileTensor> layout = formats::layout(cfg, f, formats::Format::hf, {.hf_prefix = "transformer."});
  std::vector<safetensors::OutTensor> tensors;
  for (const formats::FileTensor& t : layout) tensors.push_back({t.name, t.shape, nullptr});
  const std::string& st = dt->second.first;
  const safetensors::ShardPlan plan = safetensors::plan_shards(tensors, st, max_shard_bytes);

  const int64_t bos = tok ? tok->bos_id() : -1, eos = tok ? tok->eos_id() : -1;
  std::vector<std::pair<std::string, std::string>> small{{"config.json", config_json(cfg, r.architecture, dt->second.second, bos, eos).dump(2) + "\n"}};
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (bos >= 0) gen["bos_token_id"] = bos;
  if (eos >= 0) gen["eos_token_id"] = eos;
  small.emplace_back("generation_config.json", gen.dump(2) + "\n");
  if (!plan.index_json.empty()) small.emplace_back("model.safetensors.index.json", plan.index_json);
  tokenizer_files(tok, cfg.block_size, small, r.note);

  // One set: never a new config.json beside old weights (DirectoryCommit). The shards are named
  // first, so that where the files are renamed one at a time, config.json comes last.
  DirectoryCommit out(dir, "HF model", hf_model_file, ErrorKind::data);
  std::vector<formats::PlacedFile> placed;
  std::vector<formats::Placement> placements;
  size_t next = 0;  // the shards hold the layout's tensors in order
  for (size_t i = 0; i < plan.shards.size(); i++) {
    placed.push_back({out.path(plan.names[i]), safetensors::header_bytes(plan.shards[i], st, {{"format", "pt"}})});
    const std::vector<uint64_t> at = safetensors::data_offsets(plan.shards[i], st, placed.back().header.size());
    const std::string p = (fs::path(dir) / plan.names[i]).string();
    for (size_t j = 0; j < plan.shards[i].size(); j++, next++)
      placements.push_back({layout[next], i, at[j], [t = plan.shards[i][j], &st, p](const std::vector<float>& v) { return safetensors::encode(t, v, st, p); }});
  }
  std::vector<std::pair<std::string, std::string>> whole;
  for (auto it = small.rbegin(); it != small.rend(); ++it) whole.emplace_back(out.path(it->first), it->second);
  formats::write_placed("HF model directory " + dir, cfg, whole, placed, placements, fill);
  out.commit();
  for (const auto& [name, bytes] : small) r.files.push_back((fs::path(dir) / name).string());
  for (const std::string& n : plan.names) r.files.push_back((fs::path(dir) / n).string());
  return r;
}

ExportResult export_model(const std::string& checkpoint, const std::string& dir, const std::string& dtype, uint64_t max_shard_bytes) {
  check_output(dir, dtype);  // before the model is opened
  const formats::OpenedModel m = formats::open_model(checkpoint);
  return write_model(dir, m.config, m.tok ? &*m.tok : nullptr, dtype, checkpoint, [&](formats::ModelSink& s) { m.push_each(s); },
                     max_shard_bytes);
}

}  // namespace tapelm::hf
