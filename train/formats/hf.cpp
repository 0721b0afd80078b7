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

// The longest context read: GGUF's context_length limit, so every import can be exported.
constexpr int64_t kMaxPositions = int64_t(1) << 24;

// config.json read as the family rows' hooks read it (formats::HfJson): typed reads and refusals
// naming the file.
[[noreturn]] void refuse(const std::string& what, const std::string& why) { formats::HfJson(json(), what).refuse(why); }
template <class T> void get(const json& j, const std::string& key, T& out, const std::string& what) { formats::HfJson(j, what).get(key, out); }
bool present(const json& j, const std::string& key) { return formats::HfJson(j, "").has(key); }

std::string arch_of(const json& j, const std::string& what) {
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string())
      refuse(what, "architectures must be a list of names, got " + echo_json(a));
    return a[0].get<std::string>();
  }
  std::string mt;
  get(j, "model_type", mt, what);
  if (const formats::FamilyInfo* f = formats::find_family(mt)) {
    if (mt == f->hf.model_type) return f->hf_architecture;
    for (const auto& [arch, model_type] : f->hf_aliases)
      if (mt == model_type) return arch;
  }
  refuse(what, mt.empty() ? "names neither architectures nor model_type" : "model_type \"" + cut_for_message(mt) + "\" is not one tapelm reads");
}

// partial_rotary_factor f: RoPE on int(head_dim · f) dims of each head, as transformers sizes it.
void read_partial_rotary(const json& j, const formats::FamilyInfo& f, GPTConfig& c, const std::string& what) {
  double pf = 1;
  get(j, "partial_rotary_factor", pf, what);
  if (pf == 1) return;
  if (!f.partial_rotary) refuse(what, "partial_rotary_factor " + echo_json(j["partial_rotary_factor"]) + ": tapelm rotates the whole head");
  if (c.n_head <= 0 || (c.head_size == 0 && c.n_embd % c.n_head)) return;  // no head width: the config's check names the counts
  const int64_t rot = pf > 0 && pf < 1 ? static_cast<int64_t>(static_cast<double>(c.head_dim()) * pf) : 0;
  if (rot <= 0 || rot % 2)
    refuse(what, "partial_rotary_factor " + echo_json(j["partial_rotary_factor"]) + " rotates " + std::to_string(rot) + " of " +
                     std::to_string(c.head_dim()) + " dims a head: RoPE needs a positive even count");
  c.rotary_dims = rot;
}

void read_rope(const json& j, const formats::FamilyInfo& f, GPTConfig& c, const std::string& what) {
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
      } else if (it.key() == "partial_rotary_factor") {
        read_partial_rotary(r, f, c, what);
      } else {
        refuse(what, "rope_parameters." + cut_for_message(it.key()) + " " + echo_json(it.value()) + ": tapelm's RoPE has no scaling");
      }
    }
  }
  if (present(j, "partial_rotary_factor")) read_partial_rotary(j, f, c, what);
}

// A size: the key's value, or its fallback when absent or null (-1: required).
int64_t size_of(const json& j, const formats::HfKey& k, const std::string& what) {
  int64_t v = k.fallback;
  if (present(j, k.key)) get(j, k.key, v, what);
  else if (k.fallback < 0) refuse(what, std::string("has no ") + k.key);
  return v;
}

// The config of a family's config.json, by the keys its row names.
void read_family(const json& j, const formats::FamilyInfo& f, HfConfig& h, const std::string& what) {
  const formats::HfConfigKeys& k = f.hf;
  GPTConfig& c = h.config;
  formats::apply_family(f.family, c);
  c.vocab_size = size_of(j, k.vocab, what);
  c.n_embd = size_of(j, k.hidden, what);
  c.n_layer = size_of(j, k.layers, what);
  c.n_head = size_of(j, k.heads, what);
  c.mlp_hidden = k.ffn.fallback == 0 && !present(j, k.ffn.key) ? 4 * c.n_embd : size_of(j, k.ffn, what);
  c.block_size = size_of(j, k.positions, what);
  if (c.block_size > kMaxPositions)
    refuse(what, std::string(k.positions.key) + " " + std::to_string(c.block_size) + " is beyond the " + std::to_string(kMaxPositions) +
                     " positions tapelm reads (as GGUF's context_length)");
  c.n_kv_head = c.n_head;
  if (*k.kv_heads && present(j, k.kv_heads)) get(j, k.kv_heads, c.n_kv_head, what);
  if (c.n_kv_head <= 0 || c.n_head % c.n_kv_head != 0)
    refuse(what, std::string(k.kv_heads) + " " + std::to_string(c.n_kv_head) + " does not divide " + k.heads.key + " " + std::to_string(c.n_head));
  c.norm_eps = k.eps_fallback;
  if (*k.eps) get(j, k.eps, c.norm_eps, what);
  c.tie_embeddings = k.tie_fallback;
  get(j, "tie_word_embeddings", c.tie_embeddings, what);
  std::string act = k.acts.front().first, known;
  if (present(j, k.act)) get(j, k.act, act, what);
  bool found = false;
  for (const auto& [name, kind] : k.acts) {
    known += std::string(known.empty() ? "" : ", ") + name;
    if (act == name) c.mlp = kind, found = true;
  }
  if (!found) refuse(what, std::string(k.act) + " \"" + cut_for_message(act) + "\": tapelm reads " + f.hf_architecture + " with " + known);
  if (*k.head_dim && (present(j, k.head_dim) || k.head_dim_fallback > 0)) {  // a head width of its own (Qwen3, Mistral-Nemo)
    int64_t hd = k.head_dim_fallback;
    get(j, k.head_dim, hd, what);
    if (hd <= 0 || hd > count_max / 4)
      refuse(what, std::string(k.head_dim) + " " + std::to_string(hd) + " is no head width");
    c.head_size = c.n_head > 0 && hd * c.n_head == c.n_embd ? 0 : hd;  // hidden / heads: said by no key
  }
  if (f.pos == PosKind::Rope) read_rope(j, f, c, what);
  if (present(j, "quantization_config")) refuse(what, "quantization_config: a quantized model (tapelm reads F32, F16 and BF16)");
  if (k.read) k.read(formats::HfJson(j, what), h.architecture, c);
  c.family = formats::family_key(f.family, c);
}

}  // namespace

HfConfig parse_config(const json& j, const std::string& what) {
  if (!j.is_object()) refuse(what, "is not a JSON object");
  HfConfig h;
  h.architecture = arch_of(j, what);
  const formats::FamilyInfo* f = formats::find_family(h.architecture);
  if (!f) {
    std::string known;
    for (const formats::FamilyInfo& x : formats::families()) {
      known += std::string(known.empty() ? "" : ", ") + x.hf_architecture;
      for (const auto& [arch, model_type] : x.hf_aliases) known += std::string(", ") + arch;
    }
    refuse(what, "architecture \"" + cut_for_message(h.architecture) + "\" is not one tapelm reads (" + known + ")");
  }
  h.family = f->family;
  read_family(j, *f, h, what);
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
  const formats::FamilyInfo& x = formats::family_info(f);
  if (x.embed_scale && !formats::is_sqrt_d(c.embed_scale, c.n_embd))
    throw Error(ErrorKind::config, what + ": embed_scale " + echo_json(c.embed_scale) + ": " + x.hf_architecture + " multiplies its embeddings by √" +
                                       std::to_string(c.n_embd) + " (in its dtype)");
  if (!*x.hf.eps && c.norm_eps != x.hf.eps_fallback)
    throw Error(ErrorKind::config, what + ": norm_eps " + echo_json(c.norm_eps) + ": " + x.hf_architecture + "'s config has no epsilon key (its norms use " +
                                       echo_json(x.hf.eps_fallback) + ")");
  if (!*x.hf.kv_heads && c.n_kv_head != c.n_head)
    throw Error(ErrorKind::config, what + ": " + std::to_string(c.n_kv_head) + " key/value heads for " + std::to_string(c.n_head) +
                                       " query heads: " + x.hf_architecture + " has no HF config with fewer KV heads");
  return x.hf_architecture;
}

nlohmann::ordered_json config_json(const GPTConfig& c, const std::string& arch, const std::string& torch_dtype, int64_t bos,
                                   int64_t eos) {
  nlohmann::ordered_json j;
  j["architectures"] = {arch};
  auto ids = [&] {
    if (bos >= 0) j["bos_token_id"] = bos;
    if (eos >= 0) j["eos_token_id"] = eos;
  };
  const formats::FamilyInfo* f = formats::find_family(arch);
  if (!f) throw Error(ErrorKind::internal, "config_json: no family is " + arch);
  const formats::HfConfigKeys& k = f->hf;
  j["model_type"] = k.model_type;
  j[k.vocab.key] = c.vocab_size;
  j[k.hidden.key] = c.n_embd;
  j[k.ffn.key] = c.mlp_hidden;
  j[k.layers.key] = c.n_layer;
  j[k.heads.key] = c.n_head;
  if (*k.kv_heads) j[k.kv_heads] = c.n_kv_head;
  if (*k.head_dim) j[k.head_dim] = c.head_dim();
  for (const auto& [name, kind] : k.acts)
    if (kind == c.mlp) {
      j[k.act] = name;
      break;
    }
  j[k.positions.key] = c.block_size;
  if (*k.eps) j[k.eps] = c.norm_eps;
  if (f->pos == PosKind::Rope) {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
  }
  if (k.write) k.write(c, j);
  j["tie_word_embeddings"] = c.tie_embeddings;
  ids();
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j;
}

namespace {

// Tensors a file may hold that are no parameter: GPT-2's and GPT-NeoX's causal-mask buffers, old
// Llama files' RoPE frequencies.
bool buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with(".rotary_emb.inv_freq") ||
         name.ends_with(".attention.bias") || name.ends_with(".attention.masked_bias");  // GPT-NeoX's, in Pythia's files
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
  const formats::FamilyInfo& fam = formats::family_info(r.hf.family);
  for (const formats::TensorSource::Info& t : src->tensors())  // names saved with the prefix (GPT-2's "transformer.")
    if (*fam.hf.prefix && t.name.starts_with(fam.hf.prefix)) lo.hf_prefix = fam.hf.prefix;
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
const std::map<WeightType, std::pair<std::string, std::string>> kDtypes{
    {WeightType::f32, {"F32", "float32"}}, {WeightType::bf16, {"BF16", "bfloat16"}}, {WeightType::f16, {"F16", "float16"}}};
}  // namespace

namespace {
void check_output(const std::string& dir, WeightType dtype) {
  if (!kDtypes.count(dtype)) throw Error(ErrorKind::usage, "--dtype " + to_string(dtype) + ": an HF model directory holds f32, bf16 or f16");
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(ErrorKind::data, "HF model directory " + dir + ": exists and is not a directory");
}
}  // namespace

void check_writable(const std::string& dir, const GPTConfig& c, WeightType dtype, const std::string& what) {
  check_output(dir, dtype);
  architecture_for(c, what);
  // transformers multiplies Gemma's embeddings by √d rounded to the dtype it runs in, torch_dtype
  const formats::FamilyInfo& fam = formats::family_info(formats::family_of(c, what));
  const std::string torch_dtype = kDtypes.find(dtype)->second.second;
  if (fam.embed_scale && c.embed_scale != formats::sqrt_d_as(c.n_embd, torch_dtype))
    throw Error(ErrorKind::config, what + ": embed_scale " + echo_json(c.embed_scale) + " is not √" + std::to_string(c.n_embd) + " as " +
                                       torch_dtype + " rounds it, which " + fam.hf_architecture + " multiplies by in " + torch_dtype +
                                       " (write the dtype the model came in)");
}

ExportResult write_model(const std::string& dir, const GPTConfig& cfg, const Tokenizer* tok, WeightType dtype, const std::string& what,
                         const formats::SinkFill& fill, uint64_t max_shard_bytes) {
  check_writable(dir, cfg, dtype, what);
  const auto dt = kDtypes.find(dtype);
  ExportResult r;
  r.architecture = architecture_for(cfg, what);
  const Family f = formats::family_of(cfg, what);
  const formats::FamilyInfo& fam = formats::family_info(f);
  if (fam.all_biases && !cfg.bias) r.note = "biases written as zeros (" + std::string(fam.hf_architecture) + "'s layout has them everywhere)";

  const std::vector<formats::FileTensor> layout = formats::layout(cfg, f, formats::Format::hf, {.hf_prefix = fam.hf.prefix});
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

ExportResult export_model(const formats::OpenedModel& m, const std::string& dir, WeightType dtype, uint64_t max_shard_bytes) {
  return write_model(dir, m.config, m.tok ? &*m.tok : nullptr, dtype, m.path, [&](formats::ModelSink& s) { m.push_each(s); }, max_shard_bytes);
}

}  // namespace tapelm::hf
