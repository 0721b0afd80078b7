// Byte-level BPE against Hugging Face's own tokenizer code. tests/fixtures/bytebpe/cases.json
// holds what transformers.js (npm @huggingface/transformers, run once by
// make_bytebpe_fixtures.mjs) gives for a stress text, short edge cases and tinyshakespeare under
// four tokenizer.json layouts on GPT-2's real vocabulary and merges: GPT-2's own (where OpenAI's
// gpt-3-encoder and tiktoken gave the same ids), Llama 3's (split regex, ignore_merges, added
// tokens), Qwen2's (NFC, single digits) and SmolLM's (digits split before GPT-2's pattern).
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "data/io.h"
#include "data/prepare.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "train/formats/hf_tokenizer.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string bx(const std::string& name) { return fixture_path("bytebpe/" + name); }

const json& cases() {
  static const json j = json::parse(read_file_bytes(bx("cases.json"), "fixture"));
  return j;
}

// GPT-2's tokenizer.json as tapelm converts vocab.json + merges.txt, with a layout's overrides.
std::string layout_json(const json& overrides) {
  json t = ByteBpe::gpt2_tokenizer(read_file_bytes(bx("vocab.json"), "vocab"), read_file_bytes(bx("merges.txt"), "merges"),
                                   "vocab.json", "merges.txt");
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    if (it.key() == "ignore_merges") t["model"]["ignore_merges"] = it.value();
    else t[it.key()] = it.value();
  }
  return t.dump();
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

// "equal" or where the two first differ.
std::string compare(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) i++;
  if (i == got.size() && i == want.size()) return "equal";
  return "first difference at " + std::to_string(i) + " of " + std::to_string(want.size()) + ": got " +
         (i < got.size() ? std::to_string(got[i]) : "end") + ", want " + (i < want.size() ? std::to_string(want[i]) : "end");
}

// FNV-1a 64 over the ids as little-endian int32, as the fixture script hashes them.
std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids)
    for (int k = 0; k < 4; k++) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Tokenizer layout_tokenizer(const json& layout, const std::string& bos = "", const std::string& eos = "") {
  return Tokenizer(ByteBpe::from_json(layout_json(layout["overrides"]), layout["name"].get<std::string>(), bos, eos));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bytebpe)

BOOST_AUTO_TEST_CASE(ids_equal_hugging_face_on_four_layouts) {
  const std::string stress = cases()["stress"];
  const std::string corpus = read_file_bytes(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt", "corpus");
  BOOST_TEST_REQUIRE(corpus.size() == cases()["corpus_bytes"].get<size_t>());
  BOOST_TEST_REQUIRE(cases()["layouts"].size() == 4u);
  for (const json& layout : cases()["layouts"]) {
    const std::string name = layout["name"];
    BOOST_TEST_CONTEXT(name) {
      const Tokenizer tok = layout_tokenizer(layout);
      BOOST_TEST(compare(tok.encode(layout.value("stress_text", stress)), ids_of(layout["stress"])) == "equal");
      for (size_t i = 0; i < cases()["short"].size(); i++)  // (no short text holds a numeral beyond 0-9)
        BOOST_TEST(compare(tok.encode(cases()["short"][i]), ids_of(layout["short"][i])) == "equal",
                   "short text " << cases()["short"][i].dump());
      const std::vector<int32_t> ids = tok.encode(corpus);
      const std::vector<int32_t> head = ids_of(layout["corpus"]["head"]);
      BOOST_TEST(compare(std::vector<int32_t>(ids.begin(), ids.begin() + std::min(ids.size(), head.size())), head) == "equal");
      BOOST_TEST(ids.size() == layout["corpus"]["tokens"].get<size_t>());
      BOOST_TEST(fnv1a64(ids) == layout["corpus"]["fnv1a64"].get<std::string>());
    }
  }
  // Digits isolates every character Rust's char::is_numeric accepts (Hugging Face's tokenizers;
  // transformers.js splits ASCII digits only, so the fixture leaves these out): " ½²" is " ", "½",
  // "²", each then byte-level BPE'd alone, as GPT-2's layout encodes them one by one.
  const Tokenizer gpt2 = layout_tokenizer(cases()["layouts"][0]), smollm = layout_tokenizer(cases()["layouts"][3]);
  std::vector<int32_t> want = gpt2.encode(" ");
  for (const char* part : {"\u00BD", "\u00B2", "\u0663"})
    for (int32_t id : gpt2.encode(part)) want.push_back(id);
  BOOST_TEST(compare(smollm.encode(" \u00BD\u00B2\u0663"), want) == "equal");
  BOOST_TEST(gpt2.encode(" \u00BD\u00B2\u0663").front() != want.front());  // GPT-2's pattern keeps " ½²٣" whole
  // GPT-2's count for tinyshakespeare, as nanoGPT's prepare.py reports it (301,966 train + 36,059 val)
  BOOST_TEST(cases()["layouts"][0]["corpus"]["tokens"] == 338025);
}

BOOST_AUTO_TEST_CASE(decode_inverts_encode_and_streams_by_bytes) {
  for (const json& layout : cases()["layouts"]) {
    BOOST_TEST_CONTEXT(layout["name"]) {
      const std::string stress = layout.value("stress_text", cases()["stress"].get<std::string>());
      const Tokenizer tok = layout_tokenizer(layout);
      const std::vector<int32_t> ids = tok.encode(stress);
      if (layout["name"] == "qwen2") {
        // NFC changed the text (e + U+0301 -> U+00E9): the decoded text encodes to the same ids
        BOOST_TEST(tok.decode(ids) != stress);
        BOOST_TEST(compare(tok.encode(tok.decode(ids)), ids) == "equal");
      } else {
        BOOST_TEST(tok.decode(ids) == stress);
      }
      std::string streamed;
      for (size_t i = 0; i < ids.size(); i++) streamed += tok.decode_next(i ? ids[i - 1] : -1, ids[i]);
      BOOST_TEST(streamed == tok.decode(ids));
    }
  }
  // BOS and EOS are dropped from decoded text, as sentencepiece's are; other added tokens stay.
  const Tokenizer gpt2 = layout_tokenizer(cases()["layouts"][0], "<|endoftext|>", "<|endoftext|>");
  BOOST_TEST(gpt2.bos_id() == 50256);
  BOOST_TEST(gpt2.decode({50256, 15496, 50256}) == "Hello");
  BOOST_TEST(gpt2.decode_next(-1, 50256) == "");
  // A token that ends inside a character: decode_next gives its bytes; decode repairs what no
  // later token completes, one U+FFFD per maximal invalid subpart. GPT-2's ids 172 and 253 are
  // bytes 0xF0 and 0x9F: bytes_to_unicode keeps 0xF0 as U+00F0 "ð" and maps 0x9F to U+0141 "Ł".
  BOOST_TEST(gpt2.piece(172) == "\u00F0");
  BOOST_TEST(gpt2.piece(253) == "\u0141");
  BOOST_TEST(gpt2.decode_next(-1, 172) == "\xF0");
  BOOST_TEST(gpt2.decode({172, 253}) == "\xEF\xBF\xBD");
  BOOST_TEST(gpt2.decode({172, 15496}) == "\xEF\xBF\xBDHello");
  BOOST_TEST(utf8_repair("a\xE0\x80z\xED\xA0\x80") == "a\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  BOOST_TEST(utf8_repair("\xF0\x9F\x99") == "\xEF\xBF\xBD");
}

BOOST_AUTO_TEST_CASE(vocab_json_with_merges_txt_is_gpt2_and_serializes) {
  TempDir d;
  fs::copy_file(bx("vocab.json"), d / "vocab.json");
  fs::copy_file(bx("merges.txt"), d / "merges.txt");
  const Tokenizer tok = hf::read_tokenizer_file(d / "vocab.json");
  BOOST_TEST(tok.kind_name() == "byte_bpe");
  BOOST_TEST(tok.vocab_size() == 50257);
  BOOST_TEST(tok.bos_id() == 50256);  // no tokenizer_config.json or config.json: <|endoftext|>
  BOOST_TEST(tok.eos_id() == 50256);
  BOOST_TEST(tok.piece(15496) == "Hello");
  BOOST_TEST(tok.piece(995) == "\xC4\xA0world");  // "Ġworld"
  BOOST_TEST(compare(tok.encode(cases()["stress"]), ids_of(cases()["layouts"][0]["stress"])) == "equal");
  const Tokenizer back = Tokenizer::deserialize(tok.kind_name(), tok.serialized());
  BOOST_TEST((back == tok));
  BOOST_TEST(back.bos_id() == 50256);
  // tokenizer_config.json names BOS/EOS (a string or {"content": ...}); no BOS: EOS starts documents
  write_bytes(d / "tokenizer.json", layout_json(cases()["layouts"][2]["overrides"]));
  write_bytes(d / "tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<|im_end|>"}})");
  const Tokenizer q = hf::read_tokenizer_file(d / "tokenizer.json");
  BOOST_TEST(q.eos_id() == 50258);
  BOOST_TEST(q.bos_id() == 50258);
  // config.json's ids when tokenizer_config.json does not say
  fs::remove(d / "tokenizer_config.json");
  write_bytes(d / "config.json", R"({"bos_token_id": 50257, "eos_token_id": 50256})");
  const Tokenizer c = hf::read_tokenizer_file(d / "tokenizer.json");
  BOOST_TEST(c.bos_id() == 50257);
  BOOST_TEST(c.eos_id() == 50256);
  write_bytes(d / "config.json", R"({"bos_token_id": 99999999, "eos_token_id": 50256})");
  expect_throw([&] { hf::read_tokenizer_file(d / "tokenizer.json"); }, ErrorKind::data, {"config.json", "bos_token_id 99999999", "not a token"});
  write_bytes(d / "config.json", R"({"bos_token_id": "one"})");
  expect_throw([&] { hf::read_tokenizer_file(d / "tokenizer.json"); }, ErrorKind::data, {"config.json", "bos_token_id", "not an integer"});
  write_bytes(d / "tokenizer_config.json", R"({"bos_token": 5, "eos_token": null})");
  expect_throw([&] { hf::read_tokenizer_file(d / "tokenizer.json"); }, ErrorKind::data, {"tokenizer_config.json", "bos_token"});
}

BOOST_AUTO_TEST_CASE(bad_tokenizer_files_give_one_line_naming_the_field) {
  const json base = json::parse(layout_json(json::object()));
  struct Bad {
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Bad> bad{
      {[](json& t) { t["model"]["type"] = "WordPiece"; }, {"model.type", "WordPiece"}},
      {[](json& t) { t["pre_tokenizer"] = {{"type", "Metaspace"}}; }, {"pre_tokenizer.type", "Metaspace"}},
      {[](json& t) { t["pre_tokenizer"] = nullptr; }, {"pre_tokenizer", "missing"}},
      {[](json& t) { t["decoder"] = {{"type", "Metaspace"}}; }, {"decoder", "not ByteLevel"}},
      {[](json& t) { t["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer.type", "NFKC"}},
      {[](json& t) { t["model"]["byte_fallback"] = true; }, {"model.byte_fallback"}},
      {[](json& t) { t["model"]["dropout"] = 0.1; }, {"model.dropout"}},
      {[](json& t) { t["model"]["continuing_subword_prefix"] = "##"; }, {"model.continuing_subword_prefix"}},
      {[](json& t) { t["model"]["vocab"]["Hello"] = -3; }, {"model.vocab[\"Hello\"]", "-3"}},
      {[](json& t) { t["model"]["vocab"]["Hello"] = "x"; }, {"model.vocab[\"Hello\"]"}},
      {[](json& t) { t["model"]["vocab"]["Hello"] = 995; }, {"model.vocab", "two tokens"}},
      {[](json& t) { t["model"]["vocab"]["Hello"] = 2000000000; }, {"far beyond"}},
      {[](json& t) { t["model"]["vocab"].erase("!"); }, {"byte 33", "not a byte-level vocabulary"}},
      {[](json& t) { t["model"]["vocab"]["Hello"] = 50300; }, {"no token with id 15496"}},
      {[](json& t) { t["model"]["merges"][7] = "q nosuchtoken"; }, {"model.merges[7]", "not in model.vocab"}},
      {[](json& t) { t["model"]["merges"][3] = "abc"; }, {"model.merges[3]", "one space"}},
      {[](json& t) { t["model"]["merges"][4] = 5; }, {"model.merges[4]"}},
      {[](json& t) { t["model"]["merges"] = "x"; }, {"model.merges", "not an array"}},
      {[](json& t) { t["model"].erase("vocab"); }, {"model.vocab", "missing"}},
      {[](json& t) { t.erase("model"); }, {"tokenizer.model", "missing"}},
      {[](json& t) { t["added_tokens"][0]["lstrip"] = true; }, {"added_tokens[0].lstrip"}},
      {[](json& t) { t["added_tokens"][0]["content"] = ""; }, {"added_tokens[0].content"}},
      {[](json& t) { t["added_tokens"][0]["id"] = 7; }, {"added_tokens[0]", "model.vocab gives it 50256"}},
      {[](json& t) { t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(?<"}}}, {"behavior", "Isolated"}}; },
       {"pre_tokenizer.pattern", "does not compile"}},
      {[](json& t) { t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}}; },
       {"pre_tokenizer.behavior", "Removed"}},
      {[](json& t) { t["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {t["pre_tokenizer"], {{"type", "Digits"}}}}}; },
       {"after the ByteLevel step"}},
  };
  for (size_t i = 0; i < bad.size(); i++) {
    json t = base;
    bad[i].edit(t);
    std::vector<std::string> parts = bad[i].parts;
    parts.insert(parts.begin(), "tok.json");
    BOOST_TEST_CONTEXT("case " << i) { expect_throw([&] { ByteBpe::from_json(t.dump(), "tok.json", "", ""); }, ErrorKind::data, parts); }
  }
  expect_throw([&] { ByteBpe::from_json("{\"model\": [", "tok.json", "", ""); }, ErrorKind::data, {"tok.json", "JSON"});
  expect_throw([&] { ByteBpe::from_json(base.dump(), "tok.json", "<s>", ""); }, ErrorKind::data, {"<s>", "neither"});
  // invalid UTF-8 text is refused, as sentencepiece's is
  const auto tok = ByteBpe::from_json(base.dump(), "tok.json", "", "");
  expect_throw([&] { tok->encode("caf\xE9"); }, ErrorKind::data, {"invalid UTF-8", "byte offset 3"});
  // a file through the CLI: one line, exit 1, nothing written
  TempDir d;
  json wp = base;
  wp["model"]["type"] = "WordPiece";
  write_bytes(d / "tokenizer.json", wp.dump());
  write_bytes(d / "t.txt", "some text\n");
  expect_error(run_cli("prepare --text " + (d / "t.txt") + " --out " + (d / "c") + " --tokenizer-model " + (d / "tokenizer.json") + " --quiet"),
               "model.type");
  BOOST_TEST(!fs::exists(d / "c"));
  write_bytes(d / "vocab.json", R"({"a": 0})");
  expect_error(run_cli("prepare --text " + (d / "t.txt") + " --out " + (d / "c") + " --tokenizer-model " + (d / "vocab.json") + " --quiet"),
               "merges.txt");
}

BOOST_AUTO_TEST_CASE(prepare_train_sample_export_and_import_with_gpt2s_tokenizer) {
  TempDir d;
  fs::copy_file(bx("vocab.json"), d / "vocab.json");
  fs::copy_file(bx("merges.txt"), d / "merges.txt");
  // Three documents, cut into small chunks and encode calls: each must be BOS + the whole
  // document's ids (prepare cuts only before a space that follows a word, where GPT-2's pattern
  // always starts a pre-token).
  const std::string corpus = read_file_bytes(std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt", "corpus");
  const std::vector<std::string> docs{corpus.substr(0, 3000), corpus.substr(3000, 2500), corpus.substr(5500, 1500)};
  write_bytes(d / "s.txt", docs[0] + "<|doc|>" + docs[1] + "<|doc|>" + docs[2]);
  PrepareOptions o;
  o.texts = {d / "s.txt"};
  o.out_dir = d / "c";
  o.tokenizer = "bpe";
  o.given = hf::read_tokenizer_file(d / "vocab.json");
  o.doc_sep = "<|doc|>";
  o.val_fraction = 0.34;
  o.chunk_bytes = 300;
  o.encode_bytes = 70;
  o.progress = false;
  prepare_corpus(o);
  const Corpus c = load_corpus(d / "c");
  BOOST_TEST(c.tok.kind_name() == "byte_bpe");
  const Tokenizer ref = layout_tokenizer(cases()["layouts"][0], "<|endoftext|>", "<|endoftext|>");
  std::vector<int32_t> want_train, want_val;
  for (size_t i = 0; i < 3; i++) {
    std::vector<int32_t>& w = i < 2 ? want_train : want_val;
    w.push_back(50256);
    const std::vector<int32_t> e = ref.encode(docs[i]);
    w.insert(w.end(), e.begin(), e.end());
  }
  BOOST_TEST(compare(c.train.to_vector(), want_train) == "equal");
  BOOST_TEST(compare(c.val.to_vector(), want_val) == "equal");
  BOOST_TEST(fs::exists(d / "c/tokenizer.byte_bpe.json"));

  // A tiny model on it, sampled, exported to HF with tokenizer.json, imported back.
  write_bytes(d / "cfg.json", R"({"n_layer": 1, "n_head": 2, "n_kv_head": 2, "n_embd": 16, "block_size": 16,
    "norm": "layernorm", "mlp": "gelu_tanh", "pos": "learned", "bias": true, "batch_size": 2, "max_iters": 1,
    "eval_iters": 1, "eval_interval": 1})");
  Run t = run_cli("train --config " + (d / "cfg.json") + " --data " + (d / "c") + " --out " + (d / "run") + " --quiet");
  BOOST_TEST_REQUIRE(t.code == 0, t.err);
  Run s = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt 'ROMEO: 日本' --tokens 4 --greedy");
  BOOST_TEST(s.code == 0, s.err);
  BOOST_TEST(s.out.rfind("ROMEO: 日本", 0) == 0, s.out);
  Run e = run_cli("export --format hf --checkpoint " + (d / "run/checkpoint.h5") + " --out " + (d / "hf"));
  BOOST_TEST_REQUIRE(e.code == 0, e.err);
  BOOST_TEST(fs::exists(d / "hf/tokenizer.json"));
  const json tc = json::parse(read_file_bytes(d / "hf/tokenizer_config.json", "tc"));
  BOOST_TEST(tc["eos_token"] == "<|endoftext|>");
  BOOST_TEST(json::parse(read_file_bytes(d / "hf/tokenizer.json", "tj")) == ByteBpe::gpt2_tokenizer(
                 read_file_bytes(bx("vocab.json"), "v"), read_file_bytes(bx("merges.txt"), "m"), "v", "m"));
  Run i = run_cli("import --format hf --model " + (d / "hf") + " --out " + (d / "back.h5"));
  BOOST_TEST_REQUIRE(i.code == 0, i.err);
  Run s2 = run_cli("sample --checkpoint " + (d / "back.h5") + " --prompt 'ROMEO: 日本' --tokens 4 --greedy");
  BOOST_TEST(s2.out == s.out, s2.err);
}

BOOST_AUTO_TEST_SUITE_END()
