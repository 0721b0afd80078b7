// The tapelm binary end to end: train, sample, inspect and eval, one clear line for bad input, one
// writer per run directory.
#include <boost/test/unit_test.hpp>
#include <sys/stat.h>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/tokens.h"
#include <csignal>
#include <thread>

#include "train/formats/checkpoint.h"
#include "train/run_dir.h"
#include "train/train_config.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_SUITE(cli)

// A streamed evaluation's memory estimate counts the windows there are: one window costs the same at
// --batch 16 as at --batch 1 (it counted sixteen, and refused the README's 7B evaluation, a 3.5 GB
// run, at 25.3 GB), and two windows in one pass cost more than one at a time.
BOOST_AUTO_TEST_CASE(eval_estimates_the_memory_of_the_windows_there_are) {
  auto estimate = [](const std::string& args) {
    const Run r = run_cli("eval --checkpoint " + fixture_path("hf/llama_mha_f32") + " --data " + fixture_path("tiny.txt") +
                          " --split all --stream --json " + args);
    BOOST_TEST_REQUIRE(r.code == 0, r.err);
    return nlohmann::json::parse(r.out).at("memory_estimate_bytes").get<double>();
  };
  const double one = estimate("--tokens 32 --batch 1");  // block_size 32: one window
  BOOST_TEST(estimate("--tokens 32 --batch 16") == one);
  BOOST_TEST(estimate("--tokens 64 --batch 2") > estimate("--tokens 64 --batch 1"));
  BOOST_TEST(estimate("--tokens 64 --batch 1") > one);  // the second window's hidden states
}

// inspect opens a model as every command does: a checkpoint, an HF directory or a GGUF file
// (it took checkpoints alone: "is a directory, not an HDF5 file").
BOOST_AUTO_TEST_CASE(inspect_reads_every_model_format) {
  TempDir d;
  BOOST_TEST_REQUIRE(run_cli("export --checkpoint " + fixture_path("gguf/llama_spm.h5") + " --format gguf --out " + (d / "m.gguf")).code == 0);
  for (const std::string m : {fixture_path("hf/llama_gqa_bf16_spm"), d / "m.gguf"}) {
    const Run r = run_cli("inspect " + m);
    BOOST_TEST(r.code == 0, m << ": " << r.err);
    BOOST_TEST(r.out.find("model " + m + " (") == 0, r.out);
    BOOST_TEST(r.out.find("parameters ") != std::string::npos, r.out);
  }
  const Run ck = run_cli("inspect " + parity_fixture("mha.h5"));
  BOOST_TEST(ck.out.find("checkpoint ") == 0, ck.out);
}

BOOST_AUTO_TEST_CASE(eval_cli_on_a_parity_fixture) {
  TempDir d;
  const std::string f = parity_fixture("mha.h5");
  Run r = run_cli("eval --checkpoint " + f + " --data " + f + " --grad-out " + (d / "g.h5") + " --json");
  BOOST_TEST_REQUIRE(r.code == 0, r.err);
  nlohmann::json j = nlohmann::json::parse(r.out);
  H5File fx = H5File::open_read(f), g = H5File::open_read(d / "g.h5");
  const double want = fx.read_attr_double("/expected", "loss");
  BOOST_TEST(std::fabs(j["loss"].get<double>() - want) / want < 1e-5);
  BOOST_TEST(j["tokens"].get<int64_t>() == 48);
  BOOST_TEST(j["perplexity"].get<double>() == std::exp(want), tt::tolerance(1e-4));
  BOOST_TEST(g.read_attr_double("/", "loss") == want, tt::tolerance(1e-5));
  for (const std::string& n : fx.list_datasets_recursive("/expected/grad")) {
    Tensor a = g.read_tensor("/grad/" + n), b = fx.read_tensor("/expected/grad/" + n);
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.numel(); i++) num += std::pow(a[i] - b[i], 2), den += double(b[i]) * b[i];
    BOOST_TEST(std::sqrt(num / den) < 1e-4, n);
  }
}

BOOST_AUTO_TEST_CASE(bad_input_gives_one_clear_line) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "max_iters": 2, "batch_size": 2})";
  const std::string cfg = " --config " + (d / "cfg.json");
  auto train_with = [&](const std::string& data, const std::string& extra = "") {
    return run_cli("train" + cfg + " --data " + data + " --out " + (d / "out") + extra + " --quiet");
  };
  expect_error(train_with(d / "missing.txt"), "missing.txt");
  std::ofstream(d / "empty.txt").close();
  expect_error(train_with(d / "empty.txt"), "empty.txt");
  std::ofstream(d / "short.txt") << "to be or not";
  expect_error(train_with(d / "short.txt"), "shorter than block_size + 1");
  expect_error(train_with(text, " --set n_layerz=3"), "unknown config key 'n_layerz'");
  expect_error(train_with(text, " --set batch_size='\"big\"'"), "'batch_size' must be an integer");
  expect_error(train_with(text, " --set n_kv_head=3 --set n_head=2"), "n_head 2 is not divisible by n_kv_head 3");
  expect_error(run_cli("train --out " + (d / "nothing") + " --resume --data " + text), "checkpoint.h5");
  expect_error(train_with(text, " --set vocab_size=10"), "vocab_size");
  std::ofstream(d / "afile") << "x";
  expect_error(run_cli("train" + cfg + " --data " + text + " --out " + (d / "afile") + "/run --quiet"), "afile");
  BOOST_TEST(!fs::exists(d / "out/checkpoint.h5"));

  // token files: bad header, size disagreeing with the count, ids beyond the vocabulary
  const std::string ck = parity_fixture("mha.h5");
  write_token_file(d / "ok.bin", std::vector<int32_t>(40, 3));
  {
    std::fstream f(d / "ok.bin", std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::ofstream(d / "badmagic.bin", std::ios::binary).write("XXXX", 4).write(bytes.data() + 4, bytes.size() - 4);
    std::ofstream(d / "badsize.bin", std::ios::binary).write(bytes.data(), bytes.size() - 2);
  }
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "badmagic.bin")), "badmagic.bin");
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "badsize.bin")), "badsize.bin");
  write_token_file(d / "bigid.bin", std::vector<int32_t>(40, 70));
  expect_error(run_cli("eval --checkpoint " + ck + " --data " + (d / "bigid.bin")), "70");

  // nothing half-written anywhere
  for (const auto& e : fs::recursive_directory_iterator(d.path))
    BOOST_TEST(e.path().string().find(".tmp") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_CASE(train_sample_and_inspect_cli) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "block_size": 16,
    "max_iters": 3, "batch_size": 2, "eval_iters": 1, "eval_interval": 2, "log_interval": 1})";
  Run t = run_cli("train --config " + (d / "cfg.json") + " --data " + text + " --out " + (d / "run"));
  BOOST_TEST_REQUIRE(t.code == 0, t.err);
  BOOST_TEST(t.out.find("step 3/3") != std::string::npos, t.out);
  BOOST_TEST(t.out.find("tok/s") != std::string::npos);
  BOOST_TEST(t.out.find("ETA") != std::string::npos);
  auto m = read_metrics(d / "run/metrics.jsonl");
  BOOST_TEST(m.back()["step"] == 3);
  for (const char* k : {"train_loss", "val_loss", "lr", "tokens_per_s", "val_loss_full"}) BOOST_TEST(m.back().contains(k), k);
  Run s = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt ROMEO: --tokens 20 --seed 3");
  BOOST_TEST(s.code == 0, s.err);
  BOOST_TEST(s.out.rfind("ROMEO:", 0) == 0u, s.out);
  Run s2 = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt ROMEO: --tokens 20 --seed 3");
  BOOST_TEST(s.out == s2.out);
  expect_error(run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt 'é'"), "U+00E9");
  Run i = run_cli("inspect " + (d / "run/checkpoint.h5"));
  BOOST_TEST(i.code == 0, i.err);
  BOOST_TEST(i.out.find("KV-cache bytes per token 64") != std::string::npos, i.out);  // (K, V) · 1 layer · 1 head · hd 8 · 4 bytes
  BOOST_TEST(i.out.find("MQA") != std::string::npos, i.out);
  Run e = run_cli("eval --checkpoint " + (d / "run/checkpoint.h5") + " --data " + text + " --json");
  BOOST_TEST(e.code == 0, e.err);
  // the val split (111,540 tokens) in non-overlapping windows of 16 positions
  BOOST_TEST(nlohmann::json::parse(e.out)["tokens"].get<int64_t>() == (111540 - 1) / 16 * 16);
  // train's closing figure is what `eval` says of the checkpoint (other batching: float order only)
  BOOST_TEST(m.back()["val_loss_full"].get<double>() == nlohmann::json::parse(e.out)["loss"].get<double>(),
             tt::tolerance(1e-5));
  BOOST_TEST(t.out.find("val loss on the whole val split") != std::string::npos, t.out);
}

BOOST_AUTO_TEST_CASE(hostile_configs_and_flags_give_one_line) {
  TempDir d;
  const std::string text = std::string(TAPELM_SOURCE_DIR) + "/corpora/tinyshakespeare.txt";
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "max_iters": 2, "batch_size": 2})";
  auto train_with = [&](const std::string& cfg, const std::string& extra = "", const std::string& data = "") {
    return run_cli("train --config " + cfg + " --data " + (data.empty() ? text : data) + " --out " + (d / "out") +
                   extra + " --quiet");
  };
  const std::string cfg = d / "cfg.json";
  // sizes that cannot fit: one line before anything is allocated (was an abort after 9.9 GB)
  expect_error(train_with(cfg, " --set n_layer=1000000000"), "parameters");
  expect_error(train_with(cfg, " --set batch_size=1000000000"), "batch_size 1000000000");
  expect_error(train_with(cfg, " --set eval_iters=1000000000"), "eval_iters 1000000000");
  expect_error(train_with(cfg, "", "/dev/zero"), "not a regular file");
  // a config that is no regular file is refused before it is opened: /dev/zero read without limit
  // (8 GB in 38 s), a FIFO blocked forever
  expect_error(train_with("/dev/zero"), "/dev/zero: the config is not a regular file");
  expect_error(run_cli("bench --config /dev/zero"), "/dev/zero: the config is not a regular file");
  BOOST_TEST_REQUIRE(::mkfifo((d / "fifo.json").c_str(), 0600) == 0);
  expect_error(run_shell("timeout 20 " + std::string(TAPELM_BINARY) + " train --config " + (d / "fifo.json") + " --data " +
                         text + " --out " + (d / "out") + " --quiet"),
               "fifo.json: the config is not a regular file");
  fs::remove(d / "fifo.json");
  expect_error(run_cli("bench --set n_layer=1000000000"), "parameters");
  // sizes outside their range are refused, not replaced by the defaults (they once ran, exit 0)
  expect_error(run_cli("bench --mode decode --batch -3"), "--batch");
  expect_error(run_cli("bench --mode decode --batch 0"), "--batch");
  expect_error(run_cli("bench --mode decode --context 0"), "--decode-len: Value 0 not in range");
  // every integer key is range-checked, naming it
  expect_error(train_with(cfg, " --set n_embd=4611686018427387904"), "n_embd");
  // seeds and threads: the same rule for flags and keys
  expect_error(train_with(cfg, " --set seed=18446744073709551615"), "seed");
  expect_error(run_cli("--threads -1 inspect --system"), "threads");
  expect_error(train_with(cfg, " --set threads=-1"), "threads");
  expect_error(run_cli("sample --checkpoint x.h5 --seed 18446744073709551615"), "seed");
  expect_error(run_cli("sample --checkpoint x.h5 --seed -1"), "seed");
  // numbers on the command line: one grammar for count lists, NaN and out-of-range values refused
  // with their bounds as people write them, before any model is read (x.h5 does not exist). Each
  // once: accepted (" 2", "+2", "2,2,2,2,"; λ nan ran as 0.5; T 1e-30 dropped the KL term), or
  // refused echoing CLI11's 309-digit bound (--kv-budget 0, --tokens -1), or refused only after
  // the model was loaded and the prompt printed (--temperature, --top-k)
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"convert --from x.h5 --out y.h5 --kv-heads \" 2\"", "--kv-heads: \" 2\" is not a positive count of key/value heads (1 to 1048576)"},
           {"convert --from x.h5 --out y.h5 --kv-heads \"2 \"", "--kv-heads: \"2 \" is not a positive count"},
           {"convert --from x.h5 --out y.h5 --kv-heads +2", "--kv-heads: \"+2\" is not a positive count"},
           {"convert --from x.h5 --out y.h5 --kv-heads 2,2,2,2,", "--kv-heads: empty item in \"2,2,2,2,\""},
           {"convert --from x.h5 --out y.h5 --kv-budget 0", "--kv-budget: \"0\" is not a whole number from 1 to 1048576"},
           // past 2^63: named, not stoll's raw out_of_range (which ended the process with `what(): stoll`)
           {"convert --from x.h5 --out y.h5 --kv-heads 9999999999999999999", "--kv-heads: \"9999999999999999999\" is not a positive count"},
           {"eval --checkpoint x.h5 --data x.txt --tokens 9999999999999999999", "--tokens: \"9999999999999999999\" is not a whole number"},
           {"eval --checkpoint x.h5 --data x.txt --tokens -1", "--tokens: \"-1\" is not a whole number from 0 to 1099511627776"},
           {"eval --checkpoint x.h5 --data x.txt --batch 0", "--batch: \"0\" is not a whole number from 1"},
           {"uptrain --from x.h5 --kv-heads 1 --data x.txt --out y.h5 --distill --distill-lambda nan", "--distill-lambda: \"nan\" is not a finite number from 0 to 1"},
           {"uptrain --from x.h5 --kv-heads 1 --data x.txt --out y.h5 --distill --distill-temperature 1e-30",
            "--distill-temperature: \"1e-30\" is not a finite number from 0.1 to 100"},
           {"uptrain --from x.h5 --kv-heads 1 --data x.txt --out y.h5 --distill --distill-attention -1", "--distill-attention: \"-1\" is not a finite number at least 0"},
           {"uptrain --from x.h5 --kv-heads 1 --data x.txt --out y.h5 --eval-tokens -3", "--eval-tokens: \"-3\" is not a whole number from 0 to 1099511627776"},
           {"uptrain --from x.h5 --kv-heads 1 --data x.txt --out y.h5 --eval-tokens 1.5", "--eval-tokens: \"1.5\" is not a whole number"},
           {"sample --checkpoint x.h5 --temperature 0", "--temperature: \"0\" is not a finite number greater than 0"},
           {"sample --checkpoint x.h5 --temperature inf", "--temperature: \"inf\" is not a finite number"},
           {"sample --checkpoint x.h5 --top-k -1", "--top-k: \"-1\" is not a whole number from 0"},
           {"sample --checkpoint x.h5 --tokens -1", "--tokens: \"-1\" is not a whole number from 0"}}) {
    const Run r = run_cli(args);
    expect_error(r, says);
    BOOST_TEST(r.err.find("1797693") == std::string::npos, args);
  }
  // text that is not UTF-8 is named by its file wherever a text is read (convert --calib and eval
  // --data named none)
  write_bytes(d / "bad.txt", "hello \xff world\n");
  const std::string spm = fixture_path("hf/llama_gqa_bf16_spm");
  expect_error(run_cli("convert --from " + spm + " --kv-heads 1 --method fit --calib " + (d / "bad.txt") + " --out " + (d / "never.h5")),
               "data file " + (d / "bad.txt") + ": invalid UTF-8 at byte offset 6");
  expect_error(run_cli("eval --checkpoint " + spm + " --data " + (d / "bad.txt")), "data file " + (d / "bad.txt") + ": invalid UTF-8");
  BOOST_TEST(!fs::exists(d / "never.h5"));
  // the config key follows the flag's rule
  expect_error(train_with(cfg, " --set distill_temperature=1e-30"), "config distill_temperature must be from 0.1 to 100, got 1e-30");
  // a number beyond a double's range in a config: named with its file (was nlohmann's raw
  // out_of_range.406)
  std::ofstream(d / "huge.json") << R"({"n_layer": 4, "n_head": 4, "n_embd": 16, "n_kv_head": [4, 2, 2, 1e400]})";
  expect_error(train_with(d / "huge.json"), (d / "huge.json") + ": a number beyond a double's range: '1e400'");
  // uptrain from a per-layer checkpoint (4,2 kv heads) to one count that divides each: it runs (was
  // refused as "config n_kv_head is not the largest of its per-layer counts", naming no file); a
  // count that does not divide a layer's is named with the layer
  const std::string hf = fixture_path("hf/llama_mha_f32");
  BOOST_TEST_REQUIRE(run_cli("convert --from " + hf + " --kv-heads 4,2 --out " + (d / "pl.h5")).code == 0);
  std::ofstream(d / "up.json") << R"({"batch_size": 2, "max_iters": 4, "eval_interval": 2, "eval_iters": 1})";
  const std::string up = "uptrain --from " + (d / "pl.h5") + " --data " + fixture_path("tiny.txt") + " --config " + (d / "up.json") +
                         " --fraction 0.5 --quiet --out ";
  const Run one = run_cli(up + (d / "up1") + " --kv-heads 1");
  BOOST_TEST(one.code == 0, one.err);
  BOOST_TEST(one.out.find("to 1 kv heads") != std::string::npos, one.out);
  BOOST_TEST(one.out.find(") on the whole val split;") != std::string::npos, one.out);
  // --eval-tokens: the loss before and after on the val split's first windows, said so (the text 20
  // times: a val split of 1048 characters, 32 windows of the model's 32 positions; 40 tokens are two)
  std::string twenty;
  for (int i = 0; i < 20; i++) twenty += slurp(fixture_path("tiny.txt"));
  write_bytes(d / "long.txt", twenty);
  const std::string up_long = "uptrain --from " + (d / "pl.h5") + " --data " + (d / "long.txt") + " --config " + (d / "up.json") +
                              " --fraction 0.5 --quiet --kv-heads 1 --out ";
  const Run whole = run_cli(up_long + (d / "up1w"));
  const Run bounded = run_cli(up_long + (d / "up1b") + " --eval-tokens 40");
  BOOST_TEST(whole.out.find(") on the whole val split;") != std::string::npos, whole.out + whole.err);
  BOOST_TEST(bounded.out.find(") on the first 64 tokens of the val split;") != std::string::npos, bounded.out + bounded.err);
  // the same uptraining (its train losses equal), evaluated on less: another loss before and after
  const auto loss_after = [](const std::string& out) { return std::stod(out.substr(out.find(": val loss ") + 11)); };
  const auto loss_before = [](const std::string& out) { return std::stod(out.substr(out.find("before uptraining: ") + 19)); };
  BOOST_TEST_REQUIRE(whole.code == 0, whole.err);
  BOOST_TEST_REQUIRE(bounded.code == 0, bounded.err);
  BOOST_TEST(loss_after(whole.out) != loss_after(bounded.out));
  BOOST_TEST(loss_before(whole.out) != loss_before(bounded.out));
  const std::vector<nlohmann::json> mw = read_metrics(d / "up1w/metrics.jsonl"), mb = read_metrics(d / "up1b/metrics.jsonl");
  BOOST_TEST_REQUIRE(mw.size() == mb.size());
  for (size_t i = 0; i < mw.size(); i++) BOOST_TEST(mw[i].value("train_loss", -1.0) == mb[i].value("train_loss", -1.0));
  expect_error(run_cli(up + (d / "up4") + " --kv-heads 4"), "cannot convert 2 kv heads to 4 in layer 1");
  // --set: a training key of the source's config changed before uptraining derives from it (the
  // config above has batch_size 2); the model's keys are the source's, but for dropout
  const Run set = run_cli(up + (d / "up5") + " --kv-heads 1 --set batch_size=1 --set dropout=0.25");
  BOOST_TEST_REQUIRE(set.code == 0, set.err);
  const TrainConfig set_cfg = read_train_config(H5File::open_read(d / "up5/checkpoint.h5"));
  BOOST_TEST(set_cfg.batch_size == 1);
  BOOST_TEST(set_cfg.model.dropout == 0.25);
  expect_error(run_cli(up + (d / "up6") + " --kv-heads 1 --set n_layer=3"),
               "uptrain --set: 'n_layer' is a key of the model, which is the source's");
  BOOST_TEST(!fs::exists(d / "up6"));
  // a key uptraining derives from its own flags would be lost: refused, naming the flag
  expect_error(run_cli(up + (d / "up7") + " --kv-heads 1 --set seed=3"), "uptrain --set: 'seed' is set by --seed");
  expect_error(run_cli(up + (d / "up7") + " --kv-heads 1 --set warmup_iters=3"), "uptrain --set: 'warmup_iters' is set by --schedule");
  BOOST_TEST(!fs::exists(d / "up7"));
  // uptrain --from an HF directory as convert --from takes it (was: "not an HDF5 file"): the same
  // run as from the checkpoint imported from it, every loss of metrics.jsonl equal
  BOOST_TEST_REQUIRE(run_cli("import --format hf --model " + hf + " --out " + (d / "mha.h5")).code == 0);
  const std::string rest = " --data " + fixture_path("tiny.txt") + " --config " + (d / "up.json") + " --fraction 0.5 --quiet --kv-heads 2 --out ";
  const Run from_dir = run_cli("uptrain --from " + hf + rest + (d / "upd"));
  const Run from_ck = run_cli("uptrain --from " + (d / "mha.h5") + rest + (d / "upc"));
  BOOST_TEST_REQUIRE(from_dir.code == 0, from_dir.err);
  BOOST_TEST_REQUIRE(from_ck.code == 0, from_ck.err);
  const std::vector<nlohmann::json> md = read_metrics(d / "upd/metrics.jsonl"), mc = read_metrics(d / "upc/metrics.jsonl");
  BOOST_TEST_REQUIRE(md.size() == mc.size());
  BOOST_TEST(md.size() >= 3u);
  for (size_t i = 0; i < md.size(); i++)
    for (const char* k : {"train_loss", "train_loss_eval", "val_loss"})
      BOOST_TEST((md[i].value(k, -1.0) == mc[i].value(k, -1.0)), k << " at line " << i);
  // without --config: the directory holds weights only, said in one line
  expect_error(run_cli("uptrain --from " + hf + " --data " + fixture_path("tiny.txt") + " --kv-heads 2 --out " + (d / "upx")),
               "holds weights only, without a training config: give one with --config");
  // CLI11's parse errors: one line, exit 1; help still exits 0
  expect_error(run_cli("eval --checkpoint x.h5 --data y --split bogus"), "split");
  expect_error(run_cli("eval --data y"), "--checkpoint");
  expect_error(run_cli("train --data x --out y --no-such-flag"), "--no-such-flag");
  expect_error(run_cli(""), "subcommand");
  Run help = run_cli("eval --help");
  BOOST_TEST(help.code == 0, help.err);
  BOOST_TEST(help.out.find("--split") != std::string::npos);
  // config files: deep nesting (was a segfault), duplicate keys, huge values
  const size_t deep = 100000;
  std::ofstream(d / "deep.json") << "{\"n_layer\": " << std::string(deep, '[') << std::string(deep, ']') << "}";
  expect_error(train_with(d / "deep.json"), "nested deeper");
  std::ofstream(d / "dup.json") << R"({"n_layer": 1, "n_embd": 8, "n_layer": 2})";
  expect_error(train_with(d / "dup.json"), "duplicate key 'n_layer'");
  std::ofstream(d / "huge.json") << R"({"optimizer": ")" << std::string(10 << 20, 'x') << "\"}";
  Run huge = train_with(d / "huge.json");  // refused unread: a config is kilobytes
  expect_error(huge, "huge.json: the config file is 10485777 bytes, over the 1048576 a config may have");
  BOOST_TEST(huge.err.size() < 300u);
  expect_error(train_with(cfg, " --set optimizer=" + std::string(100000, 'y')), "optimizer");
  BOOST_TEST(train_with(cfg, " --set optimizer=" + std::string(100000, 'y')).err.size() < 300u);
}

// Under an address-space limit of 1.5 GB (a container's or `ulimit -v`'s): a prefill of 16,000
// tokens (one layer, d 32, two KV heads) held a 16,000² float scratch per thread, 2 GB on two
// threads, and died of std::bad_alloc inside the parallel region (terminate, signal 6); one query
// block of scratch (32 × 16,000 floats) fits. A model too large for the limit is refused by the
// memory check, which counted only the machine's free memory (bad_alloc after 25 s).
BOOST_AUTO_TEST_CASE(memory_limits_bound_the_prefill_and_are_counted,
                     *boost::unit_test::precondition(test::runs_under_an_address_space_limit)) {
  TempDir d;
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16001})";
  const std::string limit = "prlimit --as=" + std::to_string(1500ll << 20) + " ";
  const Run r = run_cli("bench --mode decode --config " + (d / "cfg.json") + " --prompt 16000 --context 16001 --iters 1 --warmup 0", limit);
  BOOST_TEST(r.code == 0, r.err);
  BOOST_TEST(r.out.find("prefill") != std::string::npos, r.out);
  const Run big = run_cli("bench --config " + (d / "cfg.json") + " --set block_size=64 --batch 1000000", limit);
  expect_error(big, "of memory available");
}

BOOST_AUTO_TEST_CASE(sample_masks_ids_the_tokenizer_lacks_and_streams) {
  TempDir d;
  // 31 distinct characters, a model of 65 ids: train warns, sample never draws ids 31..64
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "max_iters": 1,
    "batch_size": 2, "eval_iters": 1, "vocab_size": 65})";
  Run t = run_cli("train --config " + (d / "cfg.json") + " --data " + fixture_path("tiny.txt") + " --out " + (d / "run") + " --quiet");
  BOOST_TEST_REQUIRE(t.code == 0, t.err);
  BOOST_TEST(t.err.find("warning: vocab_size 65 exceeds the 31 symbols") != std::string::npos, t.err);
  const std::string ck = d / "run/checkpoint.h5";
  for (int seed = 0; seed < 5; seed++) {
    Run s = run_cli("sample --checkpoint " + ck + " --tokens 200 --temperature 2 --seed " + std::to_string(seed));
    BOOST_TEST(s.code == 0, s.err);
  }
  // 10^12 tokens: the first ones arrive at once (nothing was printed before the end)
  Run s = run_shell("(timeout 60 " + std::string(TAPELM_BINARY) + " sample --checkpoint " + ck +
                    " --tokens 1000000000000 2>/dev/null | head -c 40)");
  BOOST_TEST(s.out.size() == 40u, s.out);
}

BOOST_AUTO_TEST_CASE(a_second_writer_gets_one_line_and_a_killed_writer_leaves_no_lock) {
  TempDir d;
  std::ofstream(d / "cfg.json") << tiny_train(1000000).to_json().dump();
  const std::string train = "train --config " + (d / "cfg.json") + " --data " + std::string(TAPELM_SOURCE_DIR) +
                            "/corpora/tinyshakespeare.txt --out " + (d / "run") + " --quiet";
  Run bg = run_shell(std::string(TAPELM_BINARY) + " " + train + " >/dev/null 2>&1 & echo $!");
  const std::string pid = bg.out.substr(0, bg.out.find('\n'));
  BOOST_TEST_REQUIRE(std::stoi(pid) > 0, bg.out);
  struct KillAtEnd {  // whatever fails below, the holder of 10^6 steps does not outlive the test
    int pid;
    ~KillAtEnd() { ::kill(pid, SIGKILL); }
  } holder{std::stoi(pid)};
  for (int i = 0; i < 400 && slurp(d / "run/.lock") != "tapelm " + pid + "\n"; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  BOOST_TEST_REQUIRE(slurp(d / "run/.lock") == "tapelm " + pid + "\n");
  Run second = run_cli(train + " --set max_iters=2");
  expect_error(second, d / "run");
  BOOST_TEST(second.err.find("pid " + pid) != std::string::npos, second.err);
  // kill -9: the kernel drops the lock with the process, and a new run takes the directory
  ::kill(holder.pid, SIGKILL);
  bool free = false;
  for (int i = 0; i < 400 && !free; i++) {
    try {
      DirLock probe(d / "run");
      free = true;
    } catch (const Error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  BOOST_TEST_REQUIRE(free);
  Run third = run_cli(train + " --set max_iters=2");
  BOOST_TEST(third.code == 0, third.err);
  BOOST_TEST(H5File::open_read(d / "run/checkpoint.h5").read_attr_int("/train", "step") == 2);
}

BOOST_AUTO_TEST_CASE(prepare_bpe_train_sample_and_bad_corpora) {
  TempDir d;
  const std::string tiny = fixture_path("tiny.txt");
  const std::string model = fixture_path("spm_bpe512.model");
  Run p = run_cli("prepare --text " + tiny + " " + tiny + " --out " + (d / "c") + " --tokenizer-model " + model + " --quiet");
  BOOST_TEST(p.code == 0, p.err);
  BOOST_TEST(p.out.find("sentencepiece tokenizer of 512 ids") != std::string::npos, p.out);
  BOOST_TEST(p.out.find("(1 documents)") != std::string::npos, p.out);  // two files: one train, one val document
  std::ofstream(d / "cfg.json") << R"({"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "block_size": 8,
    "norm": "rmsnorm", "mlp": "swiglu", "pos": "rope", "batch_size": 2, "max_iters": 2, "eval_iters": 1, "eval_interval": 1})";
  Run t = run_cli("train --config " + (d / "cfg.json") + " --data " + (d / "c") + " --out " + (d / "run") + " --quiet");
  BOOST_TEST(t.code == 0, t.err);
  // the checkpoint carries the sentencepiece model: sample and eval need nothing else
  Run s = run_cli("sample --checkpoint " + (d / "run/checkpoint.h5") + " --prompt 'The light' --tokens 5");
  BOOST_TEST(s.code == 0, s.err);
  BOOST_TEST(s.out.rfind("The light", 0) == 0, s.out);
  Run e = run_cli("eval --checkpoint " + (d / "run/checkpoint.h5") + " --data " + tiny + " --json");
  BOOST_TEST(e.code == 0, e.err);

  // bad corpora: one line naming the file, exit 1, nothing written
  std::ofstream(d / "latin1.txt", std::ios::binary) << "caf\xE9\n";
  expect_error(run_cli("prepare --text " + tiny + " " + (d / "latin1.txt") + " --out " + (d / "bad") + " --quiet"), "latin1.txt");
  std::ofstream(d / "empty.txt").close();
  expect_error(run_cli("prepare --text " + tiny + " " + (d / "empty.txt") + " --out " + (d / "bad") + " --quiet"), "empty.txt");
  expect_error(run_cli("prepare --text " + tiny + " --out " + (d / "bad") + " --tokenizer bpe --vocab-size 100 --quiet"), "259");
  expect_error(run_cli("prepare --text " + tiny + " --out " + (d / "bad") + " --tokenizer bpe --vocab-size 30000 --quiet"),
               "vocab size 30000");
  expect_error(run_cli("prepare --text " + tiny + " --out " + (d / "bad") + " --tokenizer-model " + tiny + " --quiet"),
               "not a sentencepiece model");
  BOOST_TEST((!fs::exists(d / "bad") || fs::is_empty(d / "bad")));
  // --doc-sep that never occurs: one document, a warning, exit 0
  Run w = run_cli("prepare --text " + tiny + " --out " + (d / "w") + " --doc-sep '<|endoftext|>' --quiet");
  BOOST_TEST(w.code == 0);
  BOOST_TEST(w.err.find("never occurs") != std::string::npos, w.err);
  // a corpus smaller than one window names the corpus
  expect_error(run_cli("train --config " + (d / "cfg.json") + " --set block_size=1000 --data " + (d / "c") + " --out " +
                       (d / "run2") + " --quiet"),
               d / "c");
}

// Every input path is checked to be a regular file (or a directory where one is expected) before it
// is opened: a FIFO blocked each of these commands forever.
BOOST_AUTO_TEST_CASE(a_fifo_for_any_input_is_refused_at_once) {
  TempDir d;
  const std::string text = fixture_path("tiny.txt"), ck = parity_fixture("mha.h5");
  for (const char* f : {"f", "f.h5", "f.bin", "run/checkpoint.h5", "plot/metrics.jsonl", "sw/sweep.json", "tok/tokenizer_config.json"}) {
    fs::create_directories(fs::path(d / f).parent_path());
    BOOST_TEST_REQUIRE(::mkfifo((d / f).c_str(), 0600) == 0, f);
  }
  // the sweep's state file as a sweep leaves it listed in the folder's manifest (its own, then)
  write_bytes(d / "sw/.tapelm-manifest.json", R"({"format": "tapelm-manifest", "version": 1, "files": {"sweep.json": {"by": "sweep"}}})");
  // a tokenizer.json whose tokenizer_config.json beside it is a FIFO
  fs::copy_file(fixture_path("gguf/qwen2mini/tokenizer.json"), d / "tok/tokenizer.json");
  const std::string bin = std::string(TAPELM_BINARY) + " ";
  const std::vector<std::string> cmds = {
      bin + "inspect " + (d / "f"),
      bin + "eval --checkpoint " + (d / "f") + " --data " + text,
      bin + "eval --checkpoint " + ck + " --data " + (d / "f"),
      bin + "eval --checkpoint " + ck + " --data " + (d / "f.h5"),
      bin + "eval --checkpoint " + ck + " --data " + (d / "f.bin"),
      bin + "sample --checkpoint " + (d / "f"),
      bin + "convert --from " + (d / "f") + " --kv-heads 1 --out " + (d / "c.h5"),
      bin + "convert --from " + ck + " --kv-heads 1 --method fit --calib " + (d / "f") + " --out " + (d / "c.h5"),
      bin + "export --checkpoint " + (d / "f") + " --format llama2c --out " + (d / "m.bin"),
      bin + "uptrain --from " + (d / "f") + " --kv-heads 1 --data " + text + " --out " + (d / "up"),
      bin + "train --config " + (d / "f") + " --data " + text + " --out " + (d / "t"),
      bin + "bench --config " + (d / "f"),
      bin + "train --resume --data " + text + " --out " + (d / "run"),
      bin + "plot " + (d / "plot"),
      bin + "sweep --preset micro --methods mean --data " + text + " --out " + (d / "sw"),
      bin + "import --format gguf --model " + (d / "f") + " --out " + (d / "g.h5"),
      bin + "prepare --text " + text + " --tokenizer-model " + (d / "f") + " --out " + (d / "p1"),
      bin + "prepare --text " + text + " --tokenizer-model " + (d / "tok/tokenizer.json") + " --out " + (d / "p2")};
  const std::vector<Run> runs = run_shell_batch(cmds, 2, 20);
  for (size_t i = 0; i < cmds.size(); i++) {
    BOOST_TEST(runs[i].code == 1, cmds[i] << ": exit " << runs[i].code << " (124: it hung)");
    BOOST_TEST(is_one_error_line(runs[i]), cmds[i] << ": " << runs[i].err);
    BOOST_TEST(runs[i].err.find("not a regular file") != std::string::npos, cmds[i] << ": " << runs[i].err);
  }
  BOOST_TEST(!fs::exists(d / "c.h5"));
  BOOST_TEST(!fs::exists(d / "m.bin"));
  BOOST_TEST(!fs::exists(d / "g.h5"));
  BOOST_TEST((!fs::exists(d / "p1") || fs::is_empty(d / "p1")));
  BOOST_TEST((!fs::exists(d / "p2") || fs::is_empty(d / "p2")));
}

// An --out that exists and is not a regular file (a FIFO here, a device such as /dev/null as root)
// is refused and left as it is: the rename into place once replaced it with a regular file.
BOOST_AUTO_TEST_CASE(an_output_that_is_a_fifo_is_refused_and_left_alone) {
  TempDir d;
  const std::string ck = parity_fixture("mha.h5"), bin = std::string(TAPELM_BINARY) + " ";
  for (const char* f : {"e.gguf", "i.h5", "c.h5"}) BOOST_TEST_REQUIRE(::mkfifo((d / f).c_str(), 0600) == 0, f);
  const std::vector<std::string> cmds = {
      bin + "export --checkpoint " + fixture_path("gguf/llama_gpt2mini.h5") + " --format gguf --out " + (d / "e.gguf"),
      bin + "import --format llama2c --model " + fixture_path("llama2c/gqa_tied.v1.bin") + " --out " + (d / "i.h5"),
      bin + "convert --from " + ck + " --kv-heads 1 --out " + (d / "c.h5")};
  const std::vector<Run> runs = run_shell_batch(cmds, 2, 60);
  for (size_t i = 0; i < cmds.size(); i++) {
    BOOST_TEST(runs[i].code == 1, cmds[i] << ": exit " << runs[i].code);
    BOOST_TEST(is_one_error_line(runs[i]), cmds[i] << ": " << runs[i].err);
    BOOST_TEST(runs[i].err.find("not a regular file") != std::string::npos, cmds[i] << ": " << runs[i].err);
  }
  for (const char* f : {"e.gguf", "i.h5", "c.h5"}) BOOST_TEST(fs::is_fifo(d / f), f);
}

// An output that is its own input is refused before anything is read: convert --out equal to
// --from and import --out equal to --model silently overwrote their input.
// A decode bench whose runs cost more than a TFLOP says so before it starts (an 80,000-token
// prefill ran 15 minutes with no line): 2 runs of 0.8 TFLOP (80,000 tokens, 1 layer, d 64: causal
// attention's scores and weighted values, 2·T·d per token on average, 2·T²·d = 0.82 TFLOP; the
// projections' 24·d² per token add 0.008), stopped by `timeout 5` after the line is out.
BOOST_AUTO_TEST_CASE(a_long_decode_bench_says_its_cost_up_front) {
  const Run r = run_shell("timeout 5 " + std::string(TAPELM_BINARY) +
                          " bench --mode decode --set n_layer=1 --set n_embd=64 --set n_head=2 --set block_size=80001 --prompt 80000 --iters 2 --warmup 0");
  BOOST_TEST(r.code == 124, r.err);
  BOOST_TEST(r.err.find("tapelm: decode bench: 2 runs (0 warm-up) of a 80000-token prefill and 1 step, 0.8 TFLOP each: at least") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(an_output_that_is_the_input_is_refused) {
  TempDir d;
  fs::copy_file(parity_fixture("gqa.h5"), d / "ck.h5");
  const std::string before = slurp(d / "ck.h5");
  expect_error(run_cli("convert --from " + (d / "ck.h5") + " --kv-heads 1 --out " + (d / "ck.h5")),
               "--out " + (d / "ck.h5") + " is the --from file");
  expect_error(run_cli("convert --from " + (d / "ck.h5") + " --kv-heads 1 --out " + (d / "./ck.h5")), "is the --from file");
  std::ofstream(d / "m.bin") << "not a model";
  expect_error(run_cli("import --format llama2c --model " + (d / "m.bin") + " --out " + (d / "m.bin")), "is the --model file");
  expect_error(run_cli("export --checkpoint " + (d / "ck.h5") + " --format llama2c --out " + (d / "ck.h5")),
               "is the --checkpoint file");
  BOOST_TEST(slurp(d / "ck.h5") == before);
  BOOST_TEST(slurp(d / "m.bin") == "not a model");
}

BOOST_AUTO_TEST_SUITE_END()
