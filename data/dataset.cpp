#include "data/dataset.h"

#include <filesystem>

#include "data/io.h"
#include "data/tokens.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

// Tokenizer and ids of a text file; UTF-8 errors are prefixed with the file name.
Corpus tokenize_file(const std::string& path) {
  const std::string text = read_text_file(path);
  Corpus c;
  try {
    c.tok = Tokenizer::from_char(CharTokenizer::from_text(text));
    TokenSplit s = split_90_10(c.tok.encode(text));
    c.train = std::move(s.train);
    c.val = std::move(s.val);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::data) throw;
    throw Error(ErrorKind::data, "data file " + path + ": " + e.what());
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
  Corpus c = tokenize_file(text_path);
  if (c.tok.vocab_size() > 65536)
    throw Error(ErrorKind::data, "data file " + text_path + ": " + std::to_string(c.tok.vocab_size()) +
                    " distinct characters do not fit uint16 token files (at most 65536)");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir, ec))
    throw Error(ErrorKind::data, "output directory " + out_dir +
                    ": cannot create: " + (ec ? ec.message() : std::string("a file of that name exists")));
  const fs::path dir(out_dir);
  const std::string train_path = (dir / "train.bin").string(), val_path = (dir / "val.bin").string();
  const std::string tok_path = (dir / "tokenizer.json").string();
  write_files_atomic({{train_path, token_file_bytes(c.train, train_path)},
                      {val_path, token_file_bytes(c.val, val_path)},
                      {tok_path, c.tok.serialized() + "\n"}});
  return c;
}

Corpus load_corpus(const std::string& path_or_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(path_or_dir, ec);
  if (!fs::exists(st)) throw Error(ErrorKind::data, "data path " + path_or_dir + ": no such file or directory");
  if (!fs::is_directory(st)) return tokenize_file(path_or_dir);
  const fs::path dir(path_or_dir);
  const std::string tok_path = (dir / "tokenizer.json").string();
  Corpus c;
  try {
    c.tok = Tokenizer::from_char(CharTokenizer::from_json(read_file_bytes(tok_path, "tokenizer file")));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::data) throw;
    const std::string msg = e.what();
    throw Error(ErrorKind::data, msg.rfind("tokenizer file ", 0) == 0 ? msg : "tokenizer file " + tok_path + ": " + msg);
  }
  for (auto [name, ids] : {std::pair{"train.bin", &c.train}, std::pair{"val.bin", &c.val}}) {
    const std::string path = (dir / name).string();
    *ids = read_token_file(path);
    check_ids(*ids, c.tok.vocab_size(), "token file " + path);
  }
  return c;
}

}  // namespace tapelm
