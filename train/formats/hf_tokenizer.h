#pragma once
// Tokenizer files as Hugging Face and sentencepiece ship them, with the files beside them that
// name BOS and EOS.
#include <string>

#include "data/tokenizer/tokenizer.h"

namespace tapelm::hf {

/// A sentencepiece `.model`, a `tokenizer.json` (byte-level BPE), or GPT-2's `vocab.json` with
/// `merges.txt` beside it. A tokenizer.json takes its BOS/EOS from `tokenizer_config.json` beside
/// it (bos_token, eos_token), else from `config.json` (bos_token_id, eos_token_id), else
/// `<|endoftext|>`; with no BOS its EOS starts each document (as GPT-2 and Qwen2 pretrain).
/// A bad file -> data Error naming it.
Tokenizer read_tokenizer_file(const std::string& path);

}  // namespace tapelm::hf
