// prepare: text into token shards and a tokenizer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/common.h"
#include "data/outdir.h"
#include "data/prepare.h"
#include "train/formats/hf_tokenizer.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

struct PrepareArgs {
  PrepareOptions o;
  std::string tokenizer_model;
  bool quiet = false;
  bool tokenizer_given = false;
};

void prepare_flags(CLI::App& c, PrepareArgs& a) {
  PrepareOptions& po = a.o;
  c.add_option("--text", po.texts, "UTF-8 text files (each a document unless --doc-sep splits them)")->required();
  c.add_option("--out", po.out_dir, "output directory")->required();
  c.add_option("--tokenizer", po.tokenizer, "char (default), bpe or unigram (sentencepiece)")
      ->check(CLI::IsMember({"char", "bpe", "unigram"}))
      ->each([&a](const std::string&) { a.tokenizer_given = true; });
  c.add_option("--vocab-size", po.vocab_size, "bpe/unigram: pieces in the trained model (default 4096)")
      ->check(CLI::Range(1, 1048576));
  c.add_option("--tokenizer-model", a.tokenizer_model,
               "use this tokenizer instead of training one: a sentencepiece .model, a Hugging Face tokenizer.json "
               "(byte-level BPE), or GPT-2's vocab.json with merges.txt beside it");
  c.add_option("--sample-bytes", po.sample_bytes, "bpe/unigram: train on at most this much text (default 100 MB)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  c.add_option("--doc-sep", po.doc_sep, "document separator, e.g. <|endoftext|> (default: one document per file)");
  c.add_option("--val-fraction", po.val_fraction, "fraction of the documents (of the tokens, for one) in val (default 0.1)")
      ->check(CLI::Range(0.0, 0.99));
  c.add_option("--shard-tokens", po.shard_tokens, "tokens per shard file (default 100000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}));
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_prepare(const PrepareArgs& a) {
  PrepareOptions po = a.o;
  std::vector<FlagPath> inputs{{"--tokenizer-model", a.tokenizer_model}};
  for (const std::string& t : po.texts) inputs.push_back({"--text", t});
  refuse_outputs_over_inputs({{"--out", po.out_dir}}, inputs);
  if (!a.tokenizer_model.empty()) {
    if (a.tokenizer_given && po.tokenizer == "char")
      throw Error(ErrorKind::usage, "a tokenizer model is a subword tokenizer: use it with the bpe or unigram tokenizer");
    po.given = hf::read_tokenizer_file(a.tokenizer_model);
    po.tokenizer = "bpe";
  }
  po.progress = !a.quiet;
  const PrepareResult r = prepare_corpus(po);
  std::printf("prepared %s: %s tokenizer of %d ids; train %ld tokens (%ld documents), val %ld tokens (%ld documents) "
              "in %ld shards; %.1f MB of text encoded at %.2f MB/s (%.1fs in all)\n",
              po.out_dir.c_str(), r.tok.kind_name().c_str(), r.tok.vocab_size(), (long)r.train_tokens, (long)r.train_docs,
              (long)r.val_tokens, (long)r.val_docs, (long)r.shards, r.text_bytes / 1e6,
              r.text_bytes / 1e6 / std::max(r.encode_seconds, 1e-9), r.seconds);
  return 0;
}

}  // namespace

Command prepare_command(CLI::App& app) {
  return command(app, "prepare", "tokenize text files into llm.c token shards, meta.json and the tokenizer", prepare_flags, run_prepare);
}

}  // namespace tapelm::cli
