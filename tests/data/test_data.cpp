// The char tokenizer against nanoGPT's tinyshakespeare numbers, llm.c token files byte for byte,
// the 90/10 split, corpus loading, the batch sampler's reproducibility and every bad-input error.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <iterator>
#include <sstream>
#include <numeric>
#include <set>

#include "data/dataset.h"
#include "nn/rng.h"
#include "data/dirlock.h"
#include "data/io.h"
#include "data/prepare.h"
#include "train/formats/hf_tokenizer.h"
#include "data/shards.h"
#include "data/sampler.h"
#include "data/tokens.h"
#include "test_util.h"
#include "data/tokenizer/char.h"
#include "data/tokenizer/sentencepiece.h"

using namespace tapelm;
using test::TempDir;
using test::write_bytes;
namespace fs = std::filesystem;

namespace {

std::string shakespeare_path() { return std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt"; }

std::string le32(int32_t v) {
  std::string s;
  for (int k = 0; k < 4; k++) s += static_cast<char>((static_cast<uint32_t>(v) >> (8 * k)) & 0xFF);
  return s;
}

// A token-file header with the given fields, zero-padded to 1024 bytes.
std::string header(int32_t magic, int32_t version, int32_t count) {
  std::string h = le32(magic) + le32(version) + le32(count);
  h.resize(1024, '\0');
  return h;
}

// f must throw a one-line data Error whose message contains every part.
void check_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  test::expect_throw(f, ErrorKind::data, parts);
}

size_t files_in(const fs::path& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(data)

BOOST_AUTO_TEST_CASE(tinyshakespeare_matches_nanogpt) {
  const std::string text = read_text_file(shakespeare_path());
  BOOST_TEST(text.size() == 1115394u);
  const CharTokenizer tok = CharTokenizer::from_text(text);
  BOOST_TEST(tok.vocab_size() == 65);
  BOOST_TEST(uint32_t(tok.symbols().front()) == uint32_t('\n'));
  BOOST_TEST(tok.decode({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 38, 39, 64}) == "\n !$&',-.3:;?AZaz");
  // nanoGPT's encode("hii there").
  BOOST_TEST(tok.encode("hii there") == (std::vector<int32_t>{46, 47, 47, 1, 58, 46, 43, 56, 43}),
             boost::test_tools::per_element());
  const std::vector<int32_t> ids = tok.encode(text);
  BOOST_TEST(ids.size() == 1115394u);
  const TokenSplit s = split_90_10(ids);
  BOOST_TEST(s.train.size() == 1003854u);
  BOOST_TEST(s.val.size() == 111540u);
  BOOST_TEST(std::equal(s.train.begin(), s.train.end(), ids.begin()));
  BOOST_TEST(std::equal(s.val.begin(), s.val.end(), ids.begin() + 1003854));
}

BOOST_AUTO_TEST_CASE(split_cuts_like_python_int_of_n_times_0_9) {
  for (size_t n : {0u, 1u, 9u, 10u, 11u, 19u, 20u, 524u, 1000001u}) {
    const TokenSplit s = split_90_10(std::vector<int32_t>(n, 0));
    BOOST_TEST(s.train.size() == n * 9 / 10, "n = " << n);
    BOOST_TEST(s.train.size() + s.val.size() == n);
  }
}

BOOST_AUTO_TEST_CASE(round_trip_ascii_and_utf8) {
  const std::string text = "Grüße, naïve café — 日本語 🙂 and plain ASCII.\n";
  const CharTokenizer tok = CharTokenizer::from_text(text);
  const std::vector<char32_t> cps = utf8_decode(text);
  BOOST_TEST(tok.vocab_size() == static_cast<int32_t>(std::set<char32_t>(cps.begin(), cps.end()).size()));
  BOOST_TEST(std::is_sorted(tok.symbols().begin(), tok.symbols().end()));
  BOOST_TEST(uint32_t(tok.symbols().back()) == 0x1F642u);
  const std::vector<int32_t> ids = tok.encode(text);
  BOOST_TEST(ids.size() == cps.size());
  BOOST_TEST(tok.decode(ids) == text);
  BOOST_TEST(tok.decode(tok.encode("café 🙂")) == "café 🙂");
  BOOST_TEST(tok.encode("").empty());
  BOOST_TEST(tok.decode({}).empty());
}

BOOST_AUTO_TEST_CASE(json_round_trip) {
  const CharTokenizer tok = CharTokenizer::from_text("ab\nc é🙂");
  const std::string json = tok.to_json();
  BOOST_TEST(json.find("\"type\":\"char\"") != std::string::npos);
  BOOST_TEST(json.find("[10,32,97,98,99,233,128578]") != std::string::npos, json);
  BOOST_TEST((CharTokenizer::from_json(json) == tok));
  check_error([] { CharTokenizer::from_json("{not json"); }, {"tokenizer JSON", "parse"});
  check_error([] { CharTokenizer::from_json(R"({"type":"bpe","symbols":[97]})"); }, {"\"bpe\"", "\"char\""});
  check_error([] { CharTokenizer::from_json(R"({"type":"char"})"); }, {"symbols"});
  check_error([] { CharTokenizer::from_json(R"({"type":"char","symbols":[98,97]})"); },
              {"strictly increasing", "index 1"});
  check_error([] { CharTokenizer::from_json(R"({"type":"char","symbols":[97,"b"]})"); }, {"symbol 1", "\"b\""});
  check_error([] { CharTokenizer::from_json(R"({"type":"char","symbols":[55296]})"); },
              {"not a valid code point", "55296"});
  check_error([] { CharTokenizer::from_json(R"({"type":"char","symbols":[]})"); }, {"empty"});
}

BOOST_AUTO_TEST_CASE(unknown_character_names_it_and_its_position) {
  const CharTokenizer tok = CharTokenizer::from_text("abc ");
  check_error([&] { tok.encode("ab cé"); }, {"unknown character", "'é'", "U+00E9", "position 4", "byte offset 4"});
  check_error([&] { tok.encode("a\nb"); }, {"'\\n' (U+000A)", "position 1"});
  check_error([&] { tok.encode("日本"); }, {"'日'", "U+65E5", "position 0"});
  check_error([&] { tok.encode(std::string("a\x01", 2)); }, {"U+0001", "position 1"});
}

BOOST_AUTO_TEST_CASE(invalid_utf8_names_the_byte_offset) {
  check_error([] { CharTokenizer::from_text("ab\xff"); }, {"invalid UTF-8", "byte offset 2", "0xFF"});
  check_error([] { CharTokenizer::from_text("a\x80"); }, {"byte offset 1", "continuation"});
  check_error([] { CharTokenizer::from_text("abc\xc3"); }, {"byte offset 3", "truncated"});
  check_error([] { CharTokenizer::from_text("\xc3(x"); }, {"byte offset 0", "continuation byte at offset 1"});
  check_error([] { CharTokenizer::from_text("\xe0\x80\x80"); }, {"byte offset 0", "overlong"});
  check_error([] { CharTokenizer::from_text("x\xed\xa0\x80"); }, {"byte offset 1", "surrogate"});
  check_error([] { CharTokenizer::from_text("\xf4\x90\x80\x80"); }, {"U+10FFFF"});
  const CharTokenizer tok = CharTokenizer::from_text("abc");
  check_error([&] { tok.encode("ab\xc0\x80"); }, {"invalid UTF-8", "byte offset 2"});
  check_error([] { CharTokenizer::from_text(""); }, {"empty"});
}

BOOST_AUTO_TEST_CASE(decode_rejects_ids_out_of_range) {
  const CharTokenizer tok = CharTokenizer::from_text("abc");
  check_error([&] { tok.decode({0, 1, 3}); }, {"token id 3", "position 2", "[0, 3)"});
  check_error([&] { tok.decode({-1}); }, {"token id -1", "position 0"});
}

BOOST_AUTO_TEST_CASE(token_file_round_trip_and_llmc_header) {
  TempDir dir;
  const std::string path = dir / ("t.bin");
  const std::vector<int32_t> ids{0, 1, 255, 256, 65535, 42, 7};
  write_token_file(path, ids);
  BOOST_TEST(fs::file_size(path) == 1024u + 2 * ids.size());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // 20240520, 1, 7 as little-endian int32.
  const unsigned char expect[12] = {0x88, 0xD8, 0x34, 0x01, 1, 0, 0, 0, 7, 0, 0, 0};
  for (int i = 0; i < 12; i++) BOOST_TEST(static_cast<unsigned char>(bytes[i]) == expect[i], "header byte " << i);
  BOOST_TEST(bytes.substr(12, 1012) == std::string(1012, '\0'));
  // Tokens as little-endian uint16: 256 -> 00 01, 65535 -> ff ff.
  BOOST_TEST(bytes.substr(1024 + 6, 4) == std::string("\x00\x01\xff\xff", 4));
  BOOST_TEST(read_token_file(path) == ids, boost::test_tools::per_element());
  write_token_file(path, {});
  BOOST_TEST(fs::file_size(path) == 1024u);
  BOOST_TEST(read_token_file(path).empty());
  BOOST_TEST(files_in(dir.path) == 1u);
}

BOOST_AUTO_TEST_CASE(token_file_errors_name_the_file_and_the_problem) {
  TempDir dir;
  const std::string missing = dir / ("missing.bin");
  check_error([&] { read_token_file(missing); }, {missing, "no such file"});
  check_error([&] { read_token_file(dir.path.string()); }, {"is a directory"});

  const std::string shrt = dir / ("short.bin");
  write_bytes(shrt, header(20240520, 1, 0).substr(0, 100));
  check_error([&] { read_token_file(shrt); }, {shrt, "100 bytes", "shorter than the 1024-byte header"});

  const std::string magic = dir / ("magic.bin");
  write_bytes(magic, header(12345, 1, 0));
  check_error([&] { read_token_file(magic); }, {magic, "bad magic number 12345", "20240520"});

  const std::string version = dir / ("version.bin");
  write_bytes(version, header(20240520, 2, 0));
  check_error([&] { read_token_file(version); }, {version, "unsupported version 2"});

  const std::string big = dir / ("size_big.bin");
  write_bytes(big, header(20240520, 1, 3) + std::string(7, 'x'));
  check_error([&] { read_token_file(big); }, {big, "size 1031 bytes", "count of 3 tokens", "expected 1030 bytes"});

  const std::string small = dir / ("size_small.bin");
  write_bytes(small, header(20240520, 1, 100) + std::string(20, 'x'));
  check_error([&] { read_token_file(small); }, {small, "size 1044 bytes", "count of 100 tokens"});

  const std::string neg = dir / ("negative.bin");
  write_bytes(neg, header(20240520, 1, -5));
  check_error([&] { read_token_file(neg); }, {neg, "negative token count -5"});

  if (::geteuid() != 0) {  // root reads anything
    const std::string locked = dir / ("locked.bin");
    write_token_file(locked, {1, 2});
    ::chmod(locked.c_str(), 0);
    check_error([&] { read_token_file(locked); }, {locked, "cannot open", "Permission denied"});
  }
}

// A mapped file that changes while it is read is refused, never mixed in: streamed eval and sample
// of a GGUF or safetensors file died of SIGBUS when it was truncated under them, and gave text
// from half of each model (exit 0) when it was rewritten in place. Cut or written in place:
// check_unchanged names it; another file renamed over the path leaves the mapped one intact (no
// error); a read past the new end (SIGBUS) ends a child process with one line and exit 1.
BOOST_AUTO_TEST_CASE(a_mapped_file_that_changes_under_its_reader_is_refused) {
  TempDir dir;
  const std::string path = dir / "m.bin";
  write_bytes(path, std::string(1 << 16, 'x'));
  {
    const MappedFile m(path, "model file");
    m.check_unchanged();
    BOOST_TEST_REQUIRE(::truncate(path.c_str(), 1 << 12) == 0);
    check_error([&] { m.check_unchanged(); }, {"model file " + path, "changed while it was read (65536 bytes, now 4096)"});
  }
  {
    write_bytes(path, std::string(1 << 16, 'x'));
    const MappedFile m(path, "model file");
    {  // the same bytes' count, written in place a second later
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.write("yy", 2);
    }
    struct stat st {};
    BOOST_TEST_REQUIRE(::stat(path.c_str(), &st) == 0);
    const struct timespec times[2] = {st.st_atim, {st.st_mtim.tv_sec + 1, st.st_mtim.tv_nsec}};
    BOOST_TEST_REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
    check_error([&] { m.check_unchanged(); }, {"model file " + path, "changed while it was read (written again)"});
  }
  {
    write_bytes(path, std::string(1 << 16, 'x'));
    const MappedFile m(path, "model file");
    write_bytes(dir / "other.bin", "other");
    fs::rename(dir / "other.bin", path);  // the mapped file lives on, whole
    m.check_unchanged();
    BOOST_TEST(m.data()[1 << 15] == 'x');
  }
  write_bytes(path, std::string(1 << 16, 'x'));
  int err[2];
  BOOST_TEST_REQUIRE(::pipe(err) == 0);
  const pid_t child = ::fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(err[1], 2);
    const MappedFile m(path, "model file");
    if (::truncate(path.c_str(), 0) != 0) ::_exit(3);
    volatile uint8_t b = m.data()[1 << 15];  // past the new end: SIGBUS
    (void)b;
    ::_exit(4);
  }
  ::close(err[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 1, said);
  BOOST_TEST(said == "tapelm: error: model file " + path +
                         ": the file shrank while it was read (truncated or rewritten in place): nothing of it was used; read it again once it is written whole\n");
}

BOOST_AUTO_TEST_CASE(token_file_write_errors_leave_nothing) {
  TempDir dir;
  const std::string path = dir / ("t.bin");
  check_error([&] { write_token_file(path, {1, 65536}); }, {path, "token id 65536", "position 1", "uint16"});
  check_error([&] { write_token_file(path, {-3}); }, {path, "token id -3", "position 0"});
  BOOST_TEST(files_in(dir.path) == 0u);
  // a file where a folder must be: named (missing folders above an output are made)
  write_bytes(dir / "file", "x");
  const std::string nodir = dir / ("file/such/dir/t.bin");
  check_error([&] { write_token_file(nodir, {1}); }, {nodir, "cannot write", "cannot create the folder"});
  fs::remove(dir / "file");
  // A failed rewrite leaves the previous file intact.
  write_token_file(path, {5, 6});
  check_error([&] { write_token_file(path, {70000}); }, {"70000"});
  BOOST_TEST(read_token_file(path) == (std::vector<int32_t>{5, 6}), boost::test_tools::per_element());
  BOOST_TEST(files_in(dir.path) == 1u);
}

BOOST_AUTO_TEST_CASE(text_file_errors) {
  TempDir dir;
  const std::string missing = dir / ("nope.txt");
  check_error([&] { read_text_file(missing); }, {"data file", missing, "no such file"});
  check_error([&] { load_corpus(missing); }, {missing, "no such file"});
  const std::string empty = dir / ("empty.txt");
  write_bytes(empty, "");
  check_error([&] { read_text_file(empty); }, {empty, "empty"});
  check_error([&] { load_corpus(empty); }, {empty, "empty"});
  check_error([&] { read_text_file(dir.path.string()); }, {"is a directory"});
  const std::string bad = dir / ("bad.txt");
  write_bytes(bad, "hello\xfe world");
  check_error([&] { load_corpus(bad); }, {bad, "invalid UTF-8", "byte offset 5"});
}

BOOST_AUTO_TEST_CASE(devices_are_not_read) {
  // /dev/zero never ends: reading it filled memory until std::bad_alloc
  test::expect_throw([] { read_text_file("/dev/zero"); }, ErrorKind::data, {"/dev/zero", "not a regular file"});
  test::expect_throw([] { load_corpus("/dev/zero"); }, ErrorKind::data, {"/dev/zero", "not a regular file"});
  test::expect_throw([] { read_token_file("/dev/zero"); }, ErrorKind::data, {"/dev/zero", "not a regular file"});
}

BOOST_AUTO_TEST_CASE(ids_beyond_the_vocabulary_are_named) {
  check_error(
      [] {
        check_ids({0, 3, 64, 65, 2}, 65, "val.bin");
      },
      {"val.bin", "token id 65", "position 3", "vocab_size 65"});
  check_error([] { check_ids({0, -2}, 65, "x"); }, {"token id -2", "position 1", "negative"});
  check_ids({0, 64}, 65, "ok");

  TempDir dir;
  prepare(test::fixture_path("tiny.txt"), dir.path.string());
  // the layout earlier versions of prepare wrote: train.bin, val.bin, tokenizer.json
  fs::rename(dir / "train_000000.bin", dir / "train.bin");
  fs::remove(dir / "meta.json");
  write_token_file(dir / ("val.bin"), {1, 2, 31, 0});
  check_error([&] { load_corpus(dir.path.string()); }, {"val.bin", "token id 31", "position 2", "vocab_size 31"});
}

BOOST_AUTO_TEST_CASE(prepare_writes_shards_and_loads_like_the_text) {
  TempDir dir;
  const std::string out = dir / ("prepared/shakespeare");
  const Corpus prepared = prepare(shakespeare_path(), out);
  BOOST_TEST((dir.listing().size() == 1u));
  BOOST_TEST(files_in(out) == 6u);  // train_000000.bin, val_000000.bin, tokenizer.json, meta.json, .lock, .tapelm-manifest.json
  BOOST_TEST(fs::file_size(out + "/train_000000.bin") == 1024u + 2 * 1003854u);
  BOOST_TEST(fs::file_size(out + "/val_000000.bin") == 1024u + 2 * 111540u);
  const Corpus from_dir = load_corpus(out);
  const Corpus from_text = load_corpus(shakespeare_path());
  BOOST_TEST((from_dir.tok == from_text.tok));
  BOOST_TEST((prepared.tok == from_text.tok));
  BOOST_TEST(from_dir.tok.vocab_size() == 65);
  BOOST_TEST((from_dir.train == from_text.train.to_vector()));
  BOOST_TEST((from_dir.val == from_text.val.to_vector()));
  BOOST_TEST(from_text.train.size() == 1003854u);

  // Preparing again over the same directory replaces the files and leaves no temp files.
  prepare(test::fixture_path("tiny.txt"), out);
  BOOST_TEST(files_in(out) == 6u);
  const Corpus tiny = load_corpus(out);
  BOOST_TEST(tiny.tok.vocab_size() == 31);
  BOOST_TEST(tiny.train.size() == 471u);
  BOOST_TEST(tiny.val.size() == 53u);
  BOOST_TEST(tiny.tok.decode(tiny.train.to_vector()).substr(0, 16) == "The lighthouse k");
}

BOOST_AUTO_TEST_CASE(prepare_and_load_errors) {
  TempDir dir;
  const std::string blocker = dir / ("a_file");
  write_bytes(blocker, "x");
  check_error([&] { prepare(test::fixture_path("tiny.txt"), blocker); }, {"corpus directory", blocker, "exists and is not a directory"});
  const std::string missing = dir / ("missing.txt");
  check_error([&] { prepare(missing, dir / ("out")); }, {missing, "no such file"});
  BOOST_TEST(!fs::exists(dir / ("out")));

  const std::string out = dir / ("out2");
  prepare(test::fixture_path("tiny.txt"), out);
  fs::remove(out + "/train_000000.bin");
  check_error([&] { load_corpus(out); }, {"meta.json", "train_000000.bin", "missing"});
  fs::remove(out + "/tokenizer.json");
  check_error([&] { load_corpus(out); }, {"tokenizer file", "tokenizer.json", "no such file"});
  write_bytes(out + "/tokenizer.json", "[1,2]");
  check_error([&] { load_corpus(out); }, {"tokenizer file", "tokenizer.json", "not an object"});
}

BOOST_AUTO_TEST_CASE(sampler_windows_are_in_range_and_shifted) {
  std::vector<int32_t> data(1000);
  std::iota(data.begin(), data.end(), 0);
  const int64_t B = 8, T = 16;
  BatchSampler s(data, B, T, 1337);
  Index x, y;
  for (int it = 0; it < 50; it++) {
    s.next(x, y);
    BOOST_TEST(x.shape == (Shape{B, T}));
    BOOST_TEST(y.shape == (Shape{B, T}));
    for (int64_t b = 0; b < B; b++) {
      const int32_t start = x.data[b * T];
      BOOST_TEST((start >= 0 && start <= 1000 - T - 1), "start " << start);
      for (int64_t t = 0; t < T; t++) {
        BOOST_TEST(x.data[b * T + t] == start + t);
        BOOST_TEST(y.data[b * T + t] == start + t + 1);
      }
    }
  }
  // Every start in [0, n - T - 1] occurs, including both ends.
  std::vector<int32_t> few(T + 3);
  std::iota(few.begin(), few.end(), 0);
  BatchSampler s2(few, 4, T, 7);
  std::set<int32_t> starts;
  for (int it = 0; it < 50; it++) {
    s2.next(x, y);
    for (int64_t b = 0; b < 4; b++) starts.insert(x.data[b * T]);
  }
  BOOST_TEST((starts == std::set<int32_t>{0, 1, 2}));
  // A corpus of exactly T + 1 tokens has one window.
  std::vector<int32_t> one(T + 1, 3);
  BatchSampler s3(one, 2, T, 1);
  s3.next(x, y);
  BOOST_TEST(x.numel() == 2 * T);
}

BOOST_AUTO_TEST_CASE(sampler_is_reproducible_and_resumes_from_its_state) {
  std::vector<int32_t> data(5000);
  std::iota(data.begin(), data.end(), 0);
  auto run = [&](BatchSampler& s, int n) {
    std::vector<int32_t> out;
    Index x, y;
    for (int i = 0; i < n; i++) {
      s.next(x, y);
      out.insert(out.end(), x.data.begin(), x.data.end());
    }
    return out;
  };
  BatchSampler a(data, 4, 8, 42), b(data, 4, 8, 42), c(data, 4, 8, 43);
  const std::vector<int32_t> ra = run(a, 20);
  BOOST_TEST((ra == run(b, 20)));
  BOOST_TEST((ra != run(c, 20)));

  BatchSampler first(data, 4, 8, 42);
  run(first, 7);
  const std::string saved = first.state();
  const std::vector<int32_t> continued = run(first, 13);
  BatchSampler resumed(data, 4, 8, 999);
  resumed.set_state(saved);
  BOOST_TEST((run(resumed, 13) == continued));
  BOOST_TEST((std::vector<int32_t>(ra.begin() + 7 * 32, ra.end()) == continued));

  check_error([&] { resumed.set_state("garbage"); }, {"sampler state"});
  check_error([&] { resumed.set_state(saved.substr(0, saved.size() / 2)); }, {"sampler state"});
  check_error([&] { resumed.set_state(saved + " 17"); }, {"sampler state"});
}

BOOST_AUTO_TEST_CASE(sampler_sequence_is_pinned) {
  // Checkpoints store the sampler state: a change to the drawing code would silently change
  // resumed runs, so the first starts for one seed are fixed here. The numbers come from
  // tests/fixtures/make_sampler_starts.py: a plain-Python mt19937_64 with the same rejection rule.
  std::vector<int32_t> data(1000003);
  std::iota(data.begin(), data.end(), 0);
  BatchSampler s(data, 6, 3, 1337);
  Index x, y;
  s.next(x, y);
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < 6; b++) starts.push_back(x.data[b * 3]);
  BOOST_TEST(starts == (std::vector<int32_t>{896830, 406860, 241722, 487555, 629027, 116573}),
             boost::test_tools::per_element());
  // The standard fixes mt19937_64's 10000th output for the default seed.
  std::mt19937_64 g;
  g.discard(9999);
  BOOST_TEST(g() == 9981545732273789042ull);
}

BOOST_AUTO_TEST_CASE(short_corpus_errors) {
  std::vector<int32_t> data(64, 1);
  check_error([&] { BatchSampler(data, 4, 64, 1); }, {"corpus of 64 tokens", "shorter than block_size + 1 = 65"});
  check_error([&] { BatchSampler(data, 4, 64, 1, "val split"); }, {"val split of 64 tokens"});
  check_error([&] { eval_windows(data, 64); }, {"corpus of 64 tokens", "block_size + 1 = 65"});
  check_error([&] { BatchSampler(data, 0, 8, 1); }, {"batch_size"});
  check_error([&] { BatchSampler(data, 1, 0, 1); }, {"block_size"});
  const Corpus tiny = load_corpus(test::fixture_path("tiny.txt"));
  check_error([&] { BatchSampler(tiny.val, 4, 64, 1, "val split"); },
              {"val split of 53 tokens", "shorter than block_size + 1 = 65"});
}

BOOST_AUTO_TEST_CASE(eval_windows_cover_the_split_once) {
  std::vector<int32_t> data(10);
  std::iota(data.begin(), data.end(), 0);
  BOOST_TEST((eval_windows(data, 3) == std::vector<int64_t>{0, 3, 6}));
  data.pop_back();
  BOOST_TEST((eval_windows(data, 3) == std::vector<int64_t>{0, 3}));
  BOOST_TEST((eval_windows(data, 8) == std::vector<int64_t>{0}));
  data.push_back(9);
  Index x, y;
  fill_windows(data, eval_windows(data, 3), 3, x, y);
  BOOST_TEST(x.shape == (Shape{3, 3}));
  BOOST_TEST(x.data == (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}), boost::test_tools::per_element());
  BOOST_TEST(y.data == (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}), boost::test_tools::per_element());
  check_error([&] { fill_windows(data, {7}, 3, x, y); }, {"window start 7"});
}


// ---- sentencepiece tokenizers ------------------------------------------------------------------

namespace {

std::vector<std::string> shakespeare_lines(size_t first, size_t last) {  // 1-based, inclusive
  std::ifstream in(shakespeare_path());
  std::vector<std::string> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line) && n <= last; n++)
    if (n >= first) out.push_back(line);
  return out;
}

// spm_encode's ids for lines 2001-2100, one line of ids per text line (make_spm_fixture.sh).
std::vector<std::vector<int32_t>> spm_fixture_ids() {
  std::ifstream in(test::fixture_path("spm_bpe512.ids"));
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    out.emplace_back(std::istream_iterator<int32_t>(is), std::istream_iterator<int32_t>());
  }
  return out;
}

Tokenizer fixture_bpe() {
  return SentencePiece::load(read_file_bytes(test::fixture_path("spm_bpe512.model"), "model"));
}

}  // namespace

BOOST_AUTO_TEST_CASE(sentencepiece_encodes_as_spm_encode) {
  const Tokenizer tok = fixture_bpe();
  BOOST_TEST((tok.kind() == TokenizerKind::sentencepiece));
  BOOST_TEST(tok.vocab_size() == 512);
  BOOST_TEST(tok.bos_id() == 1);
  BOOST_TEST(tok.eos_id() == 2);
  BOOST_TEST(tok.piece(0) == "<unk>");
  BOOST_TEST(tok.is_byte(3 + 'A'));  // byte pieces follow the three specials
  const std::vector<std::string> lines = shakespeare_lines(2001, 2100);
  const std::vector<std::vector<int32_t>> want = spm_fixture_ids();
  BOOST_TEST_REQUIRE(lines.size() == want.size());
  for (size_t i = 0; i < lines.size(); i++) {
    BOOST_TEST(tok.encode(lines[i]) == want[i], "line " << 2001 + i);
    BOOST_TEST(tok.decode(want[i]) == lines[i]);
  }
}

BOOST_AUTO_TEST_CASE(trained_bpe_matches_spm_train_and_round_trips_the_corpus) {
  SentencePieceOptions o;
  o.vocab_size = 512;
  const Tokenizer tok = SentencePiece::train(shakespeare_lines(1, 2000), o);
  BOOST_TEST(tok.vocab_size() == 512);
  BOOST_TEST(tok.adds_dummy_prefix());
  const Tokenizer ref = fixture_bpe();
  for (int32_t id = 0; id < 512; id++) BOOST_TEST(tok.piece(id) == ref.piece(id), "id " << id);
  // decode(encode(s)) == s on the whole corpus, including text the model never saw and bytes
  // (characters outside the training lines fall back to byte pieces)
  const std::string text = read_text_file(shakespeare_path()) + "caf\xC3\xA9 \xE2\x82\xAC 12345\t\n";
  const std::vector<int32_t> ids = tok.encode(text);
  BOOST_TEST(ids.size() < text.size() * 3 / 4);  // the merges shorten the text
  BOOST_TEST((tok.decode(ids) == text));
  // streamed decoding (sample's) concatenates to the same text after BOS
  std::string streamed;
  int32_t prev = tok.bos_id();
  for (size_t i = 0; i < 400; i++) {
    streamed += tok.decode_next(prev, ids[i]);
    prev = ids[i];
  }
  BOOST_TEST(streamed == tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + 400)));
  BOOST_TEST((Tokenizer::deserialize(tok.kind_name(), tok.serialized()) == tok));
  BOOST_TEST(!(tok == ref));  // the fixture's proto names spm_train's input and prefix
}

BOOST_AUTO_TEST_CASE(unigram_round_trips) {
  SentencePieceOptions o;
  o.model_type = "unigram";
  o.vocab_size = 400;
  const Tokenizer tok = SentencePiece::train(shakespeare_lines(1, 2000), o);
  BOOST_TEST(tok.vocab_size() == 400);
  const std::string text = read_text_file(test::fixture_path("tiny.txt"));
  BOOST_TEST(tok.decode(tok.encode(text)) == text);
}

BOOST_AUTO_TEST_CASE(tokenizer_errors) {
  SentencePieceOptions o;
  o.vocab_size = 258;
  check_error([&] { SentencePiece::train({"a b c"}, o); }, {"258", "below 259", "byte fallback"});
  o.vocab_size = 50000;
  check_error([&] { SentencePiece::train(shakespeare_lines(1, 50), o); }, {"sentencepiece training failed", "ocabulary size"});
  check_error([] { SentencePiece::load("not a model"); }, {"not a sentencepiece model"});
  check_error([] { fixture_bpe().encode("ab\xFF"); }, {"invalid UTF-8", "byte offset 2"});
  check_error([] { fixture_bpe().decode({5, 512}); }, {"token id 512", "position 1"});
  check_error([] { Tokenizer::deserialize("wordpiece", ""); }, {"unknown tokenizer kind", "wordpiece"});
  const Tokenizer ch = Tokenizer::of(CharTokenizer::from_text("ab"));
  BOOST_TEST(ch.bos_id() == -1);
  BOOST_TEST(ch.kind_name() == "char");
  BOOST_TEST((Tokenizer::deserialize("char", ch.serialized()) == ch));
}

// ---- streamed preparation and mapped shards -------------------------------------------------------

namespace {

// Three stories separated by <|endoftext|>, with a non-ASCII character and long enough that
// small chunks cut them many times.
std::string stories() {
  std::string t;
  const std::vector<std::string> lines = shakespeare_lines(3001, 3090);
  for (size_t i = 0; i < lines.size(); i++) {
    t += lines[i] + "\n";
    if (i % 30 == 29 && i + 1 < lines.size()) t += "<|endoftext|>";
  }
  return t + "caf\xC3\xA9.\n";
}

std::vector<std::string> split_on(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t p; (p = s.find(sep, from)) != std::string::npos; from = p + sep.size()) out.push_back(s.substr(from, p - from));
  out.push_back(s.substr(from));
  return out;
}

PrepareOptions small_bpe(const TempDir& d, const std::vector<std::string>& texts) {
  PrepareOptions o;
  o.texts = texts;
  o.out_dir = d / "out";
  o.tokenizer = "bpe";
  o.given = hf::read_tokenizer_file(test::fixture_path("spm_bpe512.model"));
  o.shard_tokens = 700;  // several shards
  o.chunk_bytes = 200;   // documents cut into many pieces
  o.encode_bytes = 50;   // and each piece encoded in several calls
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(prepare_bpe_documents_start_with_bos_and_decode_to_the_text) {
  TempDir d;
  const std::string text = stories();
  write_bytes(d / "s.txt", text);
  PrepareOptions o = small_bpe(d, {d / "s.txt"});
  o.doc_sep = "<|endoftext|>";
  o.val_fraction = 0.34;  // int(3 * 0.34) = 1 document
  const PrepareResult r = prepare_corpus(o);
  BOOST_TEST(r.train_docs == 2);
  BOOST_TEST(r.val_docs == 1);
  const Tokenizer ref = fixture_bpe();
  const Corpus c = load_corpus(d / "out");
  BOOST_TEST((c.tok == ref));
  const std::vector<std::string> docs = split_on(text, "<|endoftext|>");
  BOOST_TEST_REQUIRE(docs.size() == 3u);
  // every document: BOS, then exactly what sentencepiece gives for the whole document at once,
  // however the chunks fell
  std::vector<int32_t> want_train, want_val;
  for (size_t i = 0; i < 3; i++) {
    std::vector<int32_t>& w = i < 2 ? want_train : want_val;
    w.push_back(1);
    const std::vector<int32_t> e = ref.encode(docs[i]);
    w.insert(w.end(), e.begin(), e.end());
  }
  BOOST_TEST((c.train == want_train));
  BOOST_TEST((c.val == want_val));
  BOOST_TEST(ref.decode(c.val.to_vector()) == docs[2]);
  // the shards: llm.c headers whose counts match the sizes and meta.json
  const nlohmann::json meta = nlohmann::json::parse(read_file_bytes(d / "out/meta.json", "meta"));
  BOOST_TEST(meta["tokenizer"]["kind"] == "sentencepiece");
  BOOST_TEST(meta["tokenizer"]["vocab_size"] == 512);
  BOOST_TEST(meta["train"]["documents"] == 2);
  int64_t total = 0;
  BOOST_TEST(meta["train"]["shards"].size() == (want_train.size() + 699) / 700);
  for (const auto& sh : meta["train"]["shards"]) {
    const std::string bytes = read_file_bytes(d / ("out/" + sh["file"].get<std::string>()), "shard");
    BOOST_TEST(bytes.substr(0, 12) == le32(20240520) + le32(1) + le32(sh["tokens"].get<int32_t>()));
    BOOST_TEST(bytes.size() == 1024u + 2 * sh["tokens"].get<size_t>());
    total += sh["tokens"].get<int64_t>();
  }
  BOOST_TEST(total == static_cast<int64_t>(want_train.size()));
  BOOST_TEST(!fs::exists(d / "out/.prepare.tmp"));
}

BOOST_AUTO_TEST_CASE(prepare_one_document_per_file_and_unigram_training) {
  TempDir d;
  const std::vector<std::string> docs = split_on(stories(), "<|endoftext|>");
  for (size_t i = 0; i < docs.size(); i++) write_bytes(d / ("f" + std::to_string(i) + ".txt"), docs[i]);
  PrepareOptions o;
  o.texts = {d / "f0.txt", d / "f1.txt", d / "f2.txt"};
  o.out_dir = d / "out";
  o.tokenizer = "unigram";
  o.vocab_size = 400;
  const PrepareResult r = prepare_corpus(o);
  BOOST_TEST(r.train_docs == 2);  // int(3 * 0.1) = 0, raised to 1 val document
  BOOST_TEST(r.val_docs == 1);
  const Corpus c = load_corpus(d / "out");
  BOOST_TEST(c.tok.vocab_size() == 400);
  std::vector<int32_t> all = c.train.to_vector();
  const std::vector<int32_t> v = c.val.to_vector();
  all.insert(all.end(), v.begin(), v.end());
  BOOST_TEST(std::count(all.begin(), all.end(), c.tok.bos_id()) == 3);
  BOOST_TEST(all[0] == c.tok.bos_id());
  BOOST_TEST(c.tok.decode(v) == docs[2]);
  BOOST_TEST(fs::exists(d / "out/tokenizer.model"));
}

BOOST_AUTO_TEST_CASE(char_prepare_keeps_the_split_and_ids_of_the_text_path) {
  TempDir d;
  PrepareOptions o;
  o.texts = {test::fixture_path("tiny.txt")};
  o.out_dir = d / "out";
  o.chunk_bytes = 37;  // many chunks
  o.shard_tokens = 100;
  prepare_corpus(o);
  const Corpus mapped = load_corpus(d / "out"), text = load_corpus(test::fixture_path("tiny.txt"));
  BOOST_TEST((mapped.tok == text.tok));
  BOOST_TEST((mapped.train == text.train.to_vector()));
  BOOST_TEST((mapped.val == text.val.to_vector()));
  BOOST_TEST(fs::exists(d / "out/train_000004.bin"));  // 471 tokens in shards of 100
}

BOOST_AUTO_TEST_CASE(mapped_sampling_equals_the_in_memory_sampler) {
  TempDir d;
  PrepareOptions o;
  o.texts = {test::fixture_path("tiny.txt")};
  o.out_dir = d / "out";
  o.shard_tokens = 64;  // windows cross shard boundaries
  prepare_corpus(o);
  const Corpus mapped = load_corpus(d / "out");
  const TokenSeq mem(mapped.train.to_vector());
  BatchSampler a(mapped.train, 5, 16, 77), b(mem, 5, 16, 77);
  Index xa, ya, xb, yb;
  for (int i = 0; i < 200; i++) {
    a.next(xa, ya);
    b.next(xb, yb);
    BOOST_TEST_REQUIRE((xa.data == xb.data && ya.data == yb.data));
  }
  BOOST_TEST(a.state() == b.state());
  // evaluation windows read the same ids too
  const std::vector<int64_t> starts = eval_windows(mapped.val, 8);
  Index xe, ye, xf, yf;
  fill_windows(mapped.val, starts, 8, xe, ye);
  fill_windows(TokenSeq(mapped.val.to_vector()), starts, 8, xf, yf);
  BOOST_TEST((xe.data == xf.data && ye.data == yf.data));
}

BOOST_AUTO_TEST_CASE(wide_and_headerless_shards) {
  TempDir d;
  {
    ShardWriter w(d.path.string(), "train", true, 3);
    w.write({70000, 1, 2, 65536, 5});
    w.finish();
    BOOST_TEST(w.shards().size() == 2u);
  }
  const std::string bytes = read_file_bytes(d / "train_000000.bin", "shard");
  BOOST_TEST(bytes.substr(0, 12) == le32(20240801) + le32(7) + le32(3));
  BOOST_TEST(bytes.size() == 1024u + 4 * 3);
  const TokenSeq wide = TokenSeq::map_files({d / "train_000000.bin", d / "train_000001.bin"});
  BOOST_TEST((wide == std::vector<int32_t>{70000, 1, 2, 65536, 5}));
  check_error([&] { wide.check_below(70000, "x"); }, {"train_000000.bin", "token id 70000", "position 0"});
  // llama2.c's and nanoGPT's files: uint16 without a header, named by a hand-written meta.json
  write_bytes(d / "data00.bin", std::string("\x05\x00\x01\x00\xFF\x01", 6));
  write_bytes(d / "tok.model", read_file_bytes(test::fixture_path("spm_bpe512.model"), "m"));
  write_bytes(d / "meta.json", R"({"tokenizer": {"kind": "sentencepiece", "file": "tok.model"}, "header": false,
      "train": {"shards": [{"file": "data00.bin"}]}, "val": {"shards": [{"file": "data00.bin", "tokens": 3}]}})");
  const Corpus c = load_corpus(d.path.string());
  BOOST_TEST((c.train == std::vector<int32_t>{5, 1, 511}));
  BOOST_TEST(c.tok.vocab_size() == 512);
}

BOOST_AUTO_TEST_CASE(prepare_bad_inputs_give_one_line_and_leave_nothing) {
  TempDir d;
  write_bytes(d / "good.txt", stories());
  write_bytes(d / "empty.txt", "");
  write_bytes(d / "latin1.txt", "caf\xE9 au lait\n");
  auto run = [&](PrepareOptions o) { prepare_corpus(o); };
  PrepareOptions o = small_bpe(d, {d / "good.txt", d / "latin1.txt"});
  check_error([&] { run(o); }, {"latin1.txt", "invalid UTF-8", "byte offset 3"});
  o.texts = {d / "good.txt", d / "empty.txt"};
  check_error([&] { run(o); }, {"empty.txt", "is empty"});
  o = PrepareOptions{};
  o.texts = {d / "good.txt"};
  o.out_dir = d / "out";
  o.tokenizer = "bpe";
  o.vocab_size = 20000;  // more than a few KB of text has pieces for
  check_error([&] { run(o); }, {"good.txt", "vocab size 20000", "ocabulary size"});
  check_error([&] { hf::read_tokenizer_file(d / "missing.model"); }, {"missing.model", "no such file"});
  check_error([&] { hf::read_tokenizer_file(d / "latin1.txt"); }, {"latin1.txt", "not a sentencepiece model"});
  test::expect_throw([&] { o.vocab_size = 200; run(o); }, ErrorKind::usage, {"vocab size 200", "259"});
  BOOST_TEST(!fs::exists(d / "out/meta.json"));
  BOOST_TEST((!fs::exists(d / "out") || fs::is_empty(d / "out")));

  // a failure after a good run keeps the good corpus
  o = small_bpe(d, {d / "good.txt"});
  prepare_corpus(o);
  const std::string meta = read_file_bytes(d / "out/meta.json", "meta");
  o.texts = {d / "good.txt", d / "latin1.txt"};
  check_error([&] { run(o); }, {"latin1.txt"});
  BOOST_TEST(read_file_bytes(d / "out/meta.json", "meta") == meta);
  // what a killed run left beside the folder is cleared by the next one (its staging marker says
  // it is tapelm's); a folder of a similar name without the marker is a user's, and stays
  const fs::path stale = d / (".out.corpus." + std::to_string(test::dead_pid()));
  fs::create_directories(stale);
  write_bytes((stale / ".tapelm-staging").string(), (d / "out") + "\n");
  write_bytes((stale / "train_000000.bin").string(), "junk");
  const fs::path users = d / ".out.corpus.1";  // pid 1 always runs: not a killed run's
  fs::create_directories(users);
  write_bytes((users / "train_000000.bin").string(), "mine");
  o.texts = {d / "good.txt"};
  prepare_corpus(o);
  BOOST_TEST(!fs::exists(stale));
  BOOST_TEST(read_file_bytes((users / "train_000000.bin").string(), "file") == "mine");

  // --doc-sep never found: one document, and a warning
  o.doc_sep = "<|never|>";
  o.val_fraction = 0.1;
  const PrepareResult r = prepare_corpus(o);
  BOOST_TEST(r.train_docs == 1);
}

BOOST_AUTO_TEST_CASE(shard_bad_inputs_name_the_file) {
  TempDir d;
  prepare_corpus(small_bpe(d, {test::fixture_path("tiny.txt")}));
  const std::string out = d / "out";
  const std::string shard = out + "/train_000000.bin";
  std::string bytes = read_file_bytes(shard, "shard");
  // header count disagrees with the size
  write_bytes(shard, bytes.substr(0, bytes.size() - 2));
  check_error([&] { load_corpus(out); }, {shard, "disagrees with the header's count"});
  // an id >= the vocabulary
  bytes[1024 + 2 * 5] = '\x00';
  bytes[1024 + 2 * 5 + 1] = '\x02';  // id 512
  write_bytes(shard, bytes);
  check_error([&] { load_corpus(out); }, {shard, "token id 512", "position 5", "vocab_size 512"});
  // a corrupt tokenizer model
  const std::string model = read_file_bytes(out + "/tokenizer.model", "m");
  write_bytes(out + "/tokenizer.model", model.substr(0, 100));
  check_error([&] { load_corpus(out); }, {"tokenizer.model", "not a sentencepiece model"});
  write_bytes(out + "/tokenizer.model", model);
  // meta.json naming a missing shard
  fs::remove(shard);
  check_error([&] { load_corpus(out); }, {"meta.json", shard, "missing"});
}

// The swap of a corpus is one rename: kill -9 at any moment of `prepare` leaves the directory
// holding the old corpus or the new one, whole (before, a kill after the old meta.json was removed
// lost the previous corpus 6 times out of 6, leaving thousands of mixed shards).
BOOST_AUTO_TEST_CASE(a_killed_prepare_leaves_the_old_corpus_or_the_new_one) {
  TempDir d;
  const std::string all = read_file_bytes(test::fixture_path("../../corpora/tinyshakespeare.txt"), "text");
  write_bytes(d / "a.txt", all.substr(0, 300000));
  write_bytes(d / "b.txt", all.substr(0, 150000));
  // many small shards: replacing a corpus is then long enough for a kill to land in it
  const std::string bin = std::string(TAPELM_BINARY) + " prepare --quiet --shard-tokens 250 --out " + (d / "out") + " --text ";
  BOOST_TEST_REQUIRE(test::run_shell(bin + (d / "b.txt")).code == 0);
  const int64_t b_tokens = load_corpus(d / "out").train.size();
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_TEST_REQUIRE(test::run_shell(bin + (d / "a.txt")).code == 0);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t a_tokens = load_corpus(d / "out").train.size();
  BOOST_TEST_REQUIRE(a_tokens != b_tokens);
  Rng rng(11);
  std::set<int64_t> seen;
  for (int k = 0; k < 16; k++) {
    const double delay = (0.5 + 0.6 * rng.uniform()) * run_s;  // the second half of a run: encoding ends, the swap
    const std::string text = d / (k % 2 ? "a.txt" : "b.txt");
    test::run_shell("( " + bin + text + " & p=$!; sleep " + std::to_string(delay) + "; kill -9 $p; wait $p ) 2>/dev/null");
    Corpus c;
    BOOST_CHECK_NO_THROW(c = load_corpus(d / "out"));
    const int64_t n = c.train.size();
    BOOST_TEST((n == a_tokens || n == b_tokens), "kill " << k << " after " << delay << " s: " << n << " train tokens");
    seen.insert(n);
  }
  // the next run removes what killed runs left beside the directory
  BOOST_TEST_REQUIRE(test::run_shell(bin + (d / "b.txt")).code == 0);
  for (const auto& e : fs::directory_iterator(d.path))
    BOOST_TEST(e.path().filename().string().find(".corpus.") == std::string::npos, e.path());
  BOOST_TEST_MESSAGE("corpora seen after the kills: " << seen.size());
}

// An immutable file in the old corpus no longer stops the swap halfway: the new corpus is in place
// whole, and what could not be removed of the old one is named in a warning (before, prepare exited
// 1 with the old meta.json beside the new shards, or with meta.json and every shard deleted).
BOOST_AUTO_TEST_CASE(an_immutable_old_corpus_file_cannot_mix_two_corpora, *boost::unit_test::precondition(test::chattr_works)) {
  TempDir d;
  const std::string all = read_file_bytes(test::fixture_path("../../corpora/tinyshakespeare.txt"), "text");
  write_bytes(d / "small.txt", all.substr(0, 40000));
  write_bytes(d / "h.txt", all.substr(0, 20000));
  const std::string bin = std::string(TAPELM_BINARY) + " prepare --quiet --out " + (d / "c") + " --text ";
  BOOST_TEST_REQUIRE(test::run_shell(bin + (d / "small.txt")).code == 0);
  for (const char* f : {"meta.json", "tokenizer.json"}) {
    BOOST_TEST_REQUIRE(std::system(("chattr +i " + (d / (std::string("c/") + f))).c_str()) == 0);
    const test::Run r = test::run_shell(bin + (d / "h.txt"));
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(r.err.find("the previous corpus could not be removed whole") != std::string::npos, r.err);
    const Corpus c = load_corpus(d / "c");
    BOOST_TEST(c.train.size() + c.val.size() == 20000);  // the new corpus, whole (char tokens of h.txt)
    for (const auto& e : fs::directory_iterator(d.path))  // unlock what is left, so the next case starts clean
      if (e.path().filename().string().find(".corpus.") != std::string::npos) {
        std::system(("chattr -R -i " + e.path().string()).c_str());
        fs::remove_all(e.path());
      }
    BOOST_TEST_REQUIRE(test::run_shell(bin + (d / "small.txt")).code == 0);
  }
}

// prepare takes the directory lock as train does: two on one --out put the loser's shards nowhere
// (they landed, unlisted, in the winner's directory).
BOOST_AUTO_TEST_CASE(prepare_locks_its_directory) {
  TempDir d;
  write_bytes(d / "t.txt", stories());
  PrepareOptions o = small_bpe(d, {d / "t.txt"});
  {
    const DirLock held(d / "out");
    test::expect_throw([&] { prepare_corpus(o); }, ErrorKind::data, {d / "out", "in use by another tapelm process"});
    BOOST_TEST(files_in(d / "out") == 1u);  // .lock alone
  }
  prepare_corpus(o);
  BOOST_TEST(fs::exists(d / "out/meta.json"));
}

// Inputs that are valid but were refused or reported badly: a separator or a file name that is no
// UTF-8, invalid UTF-8 met only while encoding (it left an empty directory), and a text without
// newlines smaller than its sample (no sentence to train sentencepiece on).
BOOST_AUTO_TEST_CASE(prepare_odd_but_valid_inputs) {
  TempDir d;
  write_bytes(d / "t.txt", stories());
  PrepareOptions o = small_bpe(d, {d / "t.txt"});
  o.doc_sep = "\xff";
  test::expect_throw([&] { prepare_corpus(o); }, ErrorKind::usage, {"separator is not valid UTF-8"});
  BOOST_TEST(!fs::exists(d / "out"));
  o.doc_sep.clear();
  write_bytes(d / "n\xff.txt", stories());
  o.texts = {d / "n\xff.txt"};
  prepare_corpus(o);  // the name is only where the text came from
  BOOST_TEST(read_file_bytes(d / "out/meta.json", "meta").find("n\xef\xbf\xbd.txt") != std::string::npos);
  write_bytes(d / "late.txt", stories() + std::string(3000, 'x') + " \xff tail\n");
  o.texts = {d / "late.txt"};
  o.out_dir = d / "fresh";
  check_error([&] { prepare_corpus(o); }, {"late.txt", "invalid UTF-8"});
  BOOST_TEST(!fs::exists(d / "fresh"));
  std::string words;  // 200 KB of words, no newline, sampled 50 KB at a time
  const std::vector<std::string> lines = shakespeare_lines(1, 6000);
  for (const std::string& l : lines) {
    if (words.size() > 200000) break;
    words += l + " ";
  }
  write_bytes(d / "line.txt", words);
  PrepareOptions l;
  l.texts = {d / "line.txt"};
  l.out_dir = d / "line";
  l.tokenizer = "bpe";
  l.vocab_size = 400;
  l.sample_bytes = 50000;
  const PrepareResult r = prepare_corpus(l);
  BOOST_TEST(r.tok.vocab_size() == 400);
  BOOST_TEST(r.train_tokens > 0);
}

// meta.json's "header" and a shard's "tokens" are checked: a wrong type gave a raw JSON error naming
// neither file nor key, and a count that is no count was ignored.
BOOST_AUTO_TEST_CASE(meta_json_header_and_counts_are_checked) {
  TempDir d;
  write_bytes(d / "t.txt", stories());
  prepare_corpus(small_bpe(d, {d / "t.txt"}));
  const nlohmann::json good = nlohmann::json::parse(read_file_bytes(d / "out/meta.json", "meta"));
  for (const char* header : {R"("yes")", "null", "1"}) {
    nlohmann::json m = good;
    m["header"] = nlohmann::json::parse(header);
    write_bytes(d / "out/meta.json", m.dump());
    check_error([&] { load_corpus(d / "out"); }, {"meta.json", "\"header\" must be true or false"});
  }
  for (const char* tokens : {"-5", "18446744073709551615", "1e30", R"("8000")", "null", "1.5"}) {
    nlohmann::json m = good;
    m["train"]["shards"][0]["tokens"] = nlohmann::json::parse(tokens);
    write_bytes(d / "out/meta.json", m.dump());
    check_error([&] { load_corpus(d / "out"); }, {"meta.json", "\"tokens\"", "must be a count"});
  }
  write_bytes(d / "out/meta.json", good.dump());
  BOOST_CHECK_NO_THROW(load_corpus(d / "out"));
}

BOOST_AUTO_TEST_SUITE_END()
