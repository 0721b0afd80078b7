#pragma once
// Corpora: a UTF-8 text file (tokenized by character and split 90/10 on load) or a directory of
// token shards, mapped in place: as `tapelm prepare` writes it (meta.json, train_*.bin, val_*.bin,
// the tokenizer), or train.bin, val.bin and tokenizer.json as earlier versions of prepare wrote.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "data/shards.h"
#include "data/tokenizer/tokenizer.h"

namespace tapelm {

struct TokenSplit {
  std::vector<int32_t> train, val;
};

struct Corpus {
  Tokenizer tok;
  TokenSeq train, val;  // in memory (a text file) or mapped shards (a directory)
};

/// The bytes of a text file; missing, unreadable or empty -> data Error naming the file.
std::string read_text_file(const std::string& path);
/// First 90 % train, last 10 % val, cut at int(n * 0.9) as nanoGPT.
TokenSplit split_90_10(const std::vector<int32_t>& ids);
/// Throws data Error "<what>: token id I at position P is >= vocab_size V" for the first bad id.
void check_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& what);
/// Prepares one text file with the char tokenizer (prepare_corpus's defaults) and loads the result.
Corpus prepare(const std::string& text_path, const std::string& out_dir);
/// A text file (tokenized and split) or a directory of shards. A directory's meta.json names the
/// tokenizer file and the shards: {"tokenizer": {"kind": "char"|"sentencepiece", "file": F},
/// "header": true|false, "train": {"shards": [{"file": F, "tokens": N}, ...]}, "val": {...}};
/// "header": false maps headerless uint16 files (llama2.c's and nanoGPT's). Every shard is
/// checked (header against size, count against meta.json, ids below the vocabulary) and mapped.
Corpus load_corpus(const std::string& path_or_dir);

}  // namespace tapelm
