#pragma once
// `tapelm prepare`: text files -> a directory of llm.c token shards, streamed. The text is read in
// chunks and encoded on every thread; it is never held whole. Output:
//   DIR/train_000000.bin ...   DIR/val_000000.bin ...   (llm.c shards, see data/shards.h)
//   DIR/tokenizer.json (char) or DIR/tokenizer.model (sentencepiece)
//   DIR/meta.json              tokenizer kind, vocab size, every shard with its token count, documents
// The files go into DIR as one set (DirectoryCommit, data/outdir.h): a folder of tapelm's own gets
// the old corpus or the new one at every instant; beside a user's files, each file is old or new.
// Nothing in DIR that tapelm did not write is touched, and another corpus's files there that no
// tapelm write recorded are refused. DIR is locked for the whole run.
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace tapelm {

struct PrepareOptions {
  std::vector<std::string> texts;   // UTF-8 files; each is a document unless doc_sep splits them
  std::string out_dir;
  std::string tokenizer = "char";   // char, bpe or unigram: what is trained when none is given
  int32_t vocab_size = 4096;        // bpe/unigram
  Tokenizer given;                  // a tokenizer to use instead (a sentencepiece model, tokenizer.json, ...)
  int64_t sample_bytes = 100 << 20; // bpe/unigram train on at most this much of the text
  std::string doc_sep;              // e.g. "<|endoftext|>": splits files into documents
  double val_fraction = 0.1;        // of the documents; of the tokens when there is one document
  int64_t shard_tokens = 100000000; // tokens per shard file (llm.c's fineweb shards hold 1e8)
  int64_t chunk_bytes = 1 << 20;    // text per encoding task
  int64_t encode_bytes = 4096;      // sentencepiece: text per Encode call (cut as tasks are)
  bool progress = false;            // MB/s and ETA on stdout
};

struct PrepareResult {
  Tokenizer tok;
  int64_t train_tokens = 0, val_tokens = 0, train_docs = 0, val_docs = 0, shards = 0;
  int64_t text_bytes = 0;
  double encode_seconds = 0, seconds = 0;  // encoding pass alone; everything
};

/// Prepares a corpus (see above). Bad input -> a one-line data Error naming the file, and the
/// output directory keeps what it held before (a directory this run made is removed again).
PrepareResult prepare_corpus(const PrepareOptions& o);

}  // namespace tapelm
