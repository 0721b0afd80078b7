#include "train/formats/hf_tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "autograd/json_read.h"

#include "data/io.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "data/tokenizer/sentencepiece.h"

namespace tapelm::hf {

using json = nlohmann::json;

namespace {

// A JSON file beside a tokenizer, or null when absent; hostile like the rest.
json sibling_json(const std::filesystem::path& p, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return json();
  require_regular_file(p.string(), what);
  if (std::filesystem::file_size(p, ec) > (64u << 20)) throw Error(ErrorKind::data, what + " " + p.string() + ": larger than 64 MiB");
  return parse_json(read_file_bytes(p.string(), what), what + " " + p.string());
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...}, or null.
bool config_token(const json& cfg, const char* key, const std::string& where, std::string& out) {
  if (!cfg.is_object() || !cfg.contains(key)) return false;
  const json& v = cfg[key];
  if (v.is_null()) out.clear();
  else if (v.is_string()) out = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) out = v["content"].get<std::string>();
  else throw Error(ErrorKind::data, where + ": " + key + " is not a string, {\"content\": ...} or null: " + v.dump().substr(0, 60));
  return true;
}

}  // namespace

Tokenizer read_tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  require_regular_file(path, "tokenizer file");
  std::error_code ec;
  if (fs::file_size(path, ec) > (1ull << 30)) throw Error(ErrorKind::data, "tokenizer file " + path + ": larger than 1 GiB");
  const std::string bytes = read_file_bytes(path, "tokenizer file");
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (bytes[first] != '{' && bytes[first] != '[')) {
    try {
      return SentencePiece::load(bytes);
    } catch (const Error& e) {
      throw Error(ErrorKind::data, "tokenizer file " + path + ": is not JSON (a tokenizer.json or vocab.json) and " + e.what());
    }
  }
  const fs::path dir = fs::path(path).parent_path();
  json probe;
  probe = parse_json(bytes, "tokenizer file " + path);
  if (!probe.is_object()) throw Error(ErrorKind::data, "tokenizer file " + path + ": is not a JSON object");
  if (!probe.contains("model") || !probe["model"].is_object()) {  // GPT-2's vocab.json: merges.txt beside it
    const fs::path merges = dir / "merges.txt";
    if (!fs::exists(merges, ec))
      throw Error(ErrorKind::data, "tokenizer file " + path + ": has no \"model\" (not a tokenizer.json) and no merges.txt beside it (not GPT-2's vocab.json)");
    probe = ByteBpe::gpt2_tokenizer(bytes, read_file_bytes(merges.string(), "merges file"), "vocab file " + path,
                                    "merges file " + merges.string());
  }
  // BOS/EOS: tokenizer_config.json, then config.json's ids, then GPT-2's <|endoftext|>.
  std::string bos, eos, unresolved;
  bool have_bos = false, have_eos = false;
  const fs::path tc_path = dir / "tokenizer_config.json";
  const json tc = sibling_json(tc_path, "tokenizer config");
  have_bos = config_token(tc, "bos_token", tc_path.string(), bos);
  have_eos = config_token(tc, "eos_token", tc_path.string(), eos);
  if (!have_bos || !have_eos) {
    const fs::path c_path = dir / "config.json";
    const json c = sibling_json(c_path, "model config");
    // Ids name tokens through the vocabulary and the added tokens.
    auto token_of = [&](const char* key, std::string& out) {
      if (!c.is_object() || !c.contains(key) || c[key].is_null()) return false;
      json v = c[key];
      if (v.is_array()) {  // several ids (Llama 3.1's eos_token_id): the first, as the model import takes it
        if (v.empty()) return false;
        v = json(v[0]);
      }
      if (!v.is_number_integer())
        throw Error(ErrorKind::data, "model config " + c_path.string() + ": " + key + " is not an integer: " + cut_for_message(c[key].dump(), 60));
      const int64_t id = v.get<int64_t>();
      if (probe.contains("added_tokens") && probe["added_tokens"].is_array())
        for (const json& a : probe["added_tokens"])
          if (a.is_object() && a.value("id", json()) == id && a.contains("content") && a["content"].is_string()) {
            out = a["content"].get<std::string>();
            return true;
          }
      if (probe.contains("model") && probe["model"].is_object() && probe["model"].contains("vocab") && probe["model"]["vocab"].is_object())
        for (auto it = probe["model"]["vocab"].begin(); it != probe["model"]["vocab"].end(); ++it)
          if (it.value() == id) {
            out = it.key();
            return true;
          }
      // Reported once the tokenizer itself has passed its checks: a broken tokenizer.json is named first.
      unresolved = "model config " + c_path.string() + ": " + key + " " + std::to_string(id) + " is not a token of " + path;
      return true;
    };
    if (!have_bos) have_bos = token_of("bos_token_id", bos);
    if (!have_eos) have_eos = token_of("eos_token_id", eos);
  }
  bool has_eot = false;
  if (probe["model"].contains("vocab") && probe["model"]["vocab"].is_object()) has_eot = probe["model"]["vocab"].contains("<|endoftext|>");
  if (probe.contains("added_tokens") && probe["added_tokens"].is_array())
    for (const json& a : probe["added_tokens"]) has_eot = has_eot || (a.is_object() && a.value("content", json()) == "<|endoftext|>");
  if (!have_bos && has_eot) bos = "<|endoftext|>";
  if (!have_eos && has_eot) eos = "<|endoftext|>";
  if (bos.empty()) bos = eos;  // no BOS: the previous document's EOS starts each document
  Tokenizer t(ByteBpe::from_parsed(std::move(probe), "tokenizer file " + path, bos, eos));
  if (!unresolved.empty()) throw Error(ErrorKind::data, unresolved);
  return t;
}

}  // namespace tapelm::hf
