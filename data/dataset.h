#pragma once
// Corpora: a UTF-8 text file (tokenized and split 90/10 on load) or a directory written by
// `tapelm prepare` (train.bin, val.bin, tokenizer.json).
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "data/tokenizer.h"

namespace tapelm {

struct TokenSplit {
  std::vector<int32_t> train, val;
};

struct Corpus {
  Tokenizer tok;
  std::vector<int32_t> train, val;
};

/// The bytes of a text file; missing, unreadable or empty -> data Error naming the file.
std::string read_text_file(const std::string& path);
/// First 90 % train, last 10 % val, cut at int(n * 0.9) as nanoGPT.
TokenSplit split_90_10(const std::vector<int32_t>& ids);
/// Throws data Error "<what>: token id I at position P is >= vocab_size V" for the first bad id.
void check_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& what);
/// Tokenizes and splits a text file, writing out_dir/{train.bin, val.bin, tokenizer.json}.
Corpus prepare(const std::string& text_path, const std::string& out_dir);
/// A text file (tokenized and split) or a directory written by prepare.
Corpus load_corpus(const std::string& path_or_dir);

}  // namespace tapelm
