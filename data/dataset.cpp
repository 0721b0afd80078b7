#include "data/dataset.h"

#include <filesystem>

#include "autograd/json_read.h"
#include "data/io.h"
#include "data/outdir.h"
#include "data/prepare.h"
#include "data/tokens.h"
#include "data/tokenizer/char.h"

#include <nlohmann/json.hpp>

namespace tapelm {

namespace fs = std::filesystem;

namespace {

// Tokenizer and ids of a text file; UTF-8 errors are prefixed with the file name.
Corpus tokenize_file(const std::string& path) {
  const std::string text = read_text_file(path);
  Corpus c;
  try {
    c.tok = Tokenizer::of(CharTokenizer::from_text(text));
    TokenSplit s = split_90_10(c.tok.encode(text));
    c.train = std::move(s.train);
    c.val = std::move(s.val);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::data) throw;
    throw Error(ErrorKind::data, "data file " + path + ": " + e.what());
  }
  return c;
}

Corpus load_sharded(const fs::path& dir) {
  const std::string meta_path = (dir / "meta.json").string();
  auto bad = [&](const std::string& why) { return Error(ErrorKind::data, "corpus " + meta_path + ": " + why); };
  nlohmann::json m;
  m = parse_json(read_file_bytes(meta_path, "corpus file"), "corpus " + meta_path);
  if (!m.is_object() || !m.contains("tokenizer") || !m["tokenizer"].is_object())
    throw bad("no \"tokenizer\" object");
  const nlohmann::json& t = m["tokenizer"];
  if (!t.contains("kind") || !t["kind"].is_string() || !t.contains("file") || !t["file"].is_string())
    throw bad("the tokenizer needs \"kind\" and \"file\" strings");
  const std::string tok_path = (dir / t["file"].get<std::string>()).string();
  Corpus c;
  try {
    c.tok = Tokenizer::deserialize(t["kind"].get<std::string>(), read_file_bytes(tok_path, "tokenizer file"));
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(ErrorKind::data, msg.rfind("tokenizer file ", 0) == 0 ? msg : "tokenizer file " + tok_path + ": " + msg);
  }
  if (t.contains("vocab_size") && (!t["vocab_size"].is_number_integer() || t["vocab_size"].get<int64_t>() != c.tok.vocab_size()))
    throw bad("vocab_size " + t["vocab_size"].dump() + " disagrees with the " + std::to_string(c.tok.vocab_size()) + " ids of " + tok_path);
  if (m.contains("header") && !m["header"].is_boolean()) throw bad("\"header\" must be true or false, got " + m["header"].dump());
  const bool header = m.value("header", true);
  for (auto [name, seq] : {std::pair{"train", &c.train}, std::pair{"val", &c.val}}) {
    if (!m.contains(name) || !m[name].is_object() || !m[name].contains("shards") || !m[name]["shards"].is_array())
      throw bad(std::string("no \"") + name + "\": {\"shards\": [...]}");
    std::vector<std::string> paths;
    std::vector<int64_t> counts;
    for (const auto& s : m[name]["shards"]) {
      if (!s.is_object() || !s.contains("file") || !s["file"].is_string()) throw bad(std::string(name) + " shard without a \"file\"");
      const std::string p = (dir / s["file"].get<std::string>()).string();
      if (!fs::exists(p)) throw bad("names the shard " + p + ", which is missing");
      paths.push_back(p);
      int64_t count = -1;  // not given
      if (s.contains("tokens")) {
        const nlohmann::json& t = s["tokens"];
        const bool ok = t.is_number_unsigned() ? t.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                               : t.is_number_integer() && t.get<int64_t>() >= 0;
        if (!ok) throw bad("the \"tokens\" of " + p + " must be a count, got " + t.dump().substr(0, 40));
        count = t.get<int64_t>();
      }
      counts.push_back(count);
    }
    for (size_t i = 0; i < paths.size(); i++) {
      const TokenSeq one = TokenSeq::map_files({paths[i]}, !header);
      if (counts[i] >= 0 && counts[i] != one.size())
        throw bad("says " + paths[i] + " holds " + std::to_string(counts[i]) + " tokens, its header " + std::to_string(one.size()));
    }
    *seq = TokenSeq::map_files(paths, !header);
    seq->check_below(c.tok.vocab_size(), std::string(name) + " shards");
  }
  return c;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::string text = read_file_bytes(path, "data file");
  if (text.empty()) throw Error(ErrorKind::data, "data file " + path + ": is empty");
  return text;
}

TokenSplit split_90_10(const std::vector<int32_t>& ids) {
  // nanoGPT's int(n * 0.9), in double precision as Python computes it.
  const auto n_train = static_cast<size_t>(static_cast<double>(ids.size()) * 0.9);
  return {{ids.begin(), ids.begin() + n_train}, {ids.begin() + n_train, ids.end()}};
}

void check_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& what) {
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      throw Error(ErrorKind::data, what + ": token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      (ids[i] < 0 ? " is negative" : " is >= vocab_size " + std::to_string(vocab_size)));
}

Corpus prepare(const std::string& text_path, const std::string& out_dir) {
  PrepareOptions o;
  o.texts = {text_path};
  o.out_dir = out_dir;
  prepare_corpus(o);
  return load_corpus(out_dir);
}

Corpus load_corpus(const std::string& path_or_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(path_or_dir, ec);
  if (!fs::exists(st)) throw Error(ErrorKind::data, "data path " + path_or_dir + ": no such file or directory");
  if (!fs::is_directory(st)) return tokenize_file(path_or_dir);
  const fs::path dir(path_or_dir);
  require_complete_output(path_or_dir, "corpus directory");
  if (fs::exists(dir / "meta.json")) return load_sharded(dir);
  // train.bin, val.bin and tokenizer.json, as earlier versions of prepare wrote them
  const std::string tok_path = (dir / "tokenizer.json").string();
  Corpus c;
  try {
    c.tok = Tokenizer::of(CharTokenizer::from_json(read_file_bytes(tok_path, "tokenizer file")));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::data) throw;
    const std::string msg = e.what();
    throw Error(ErrorKind::data, msg.rfind("tokenizer file ", 0) == 0 ? msg : "tokenizer file " + tok_path + ": " + msg);
  }
  for (auto [name, ids] : {std::pair{"train.bin", &c.train}, std::pair{"val.bin", &c.val}}) {
    const std::string path = (dir / name).string();
    *ids = TokenSeq::map_files({path});
    ids->check_below(c.tok.vocab_size(), "token file " + path);
  }
  return c;
}

}  // namespace tapelm
