// HDF5 layer: h5py fixtures, round trips, error messages, corrupted files, atomic writes.
#include <hdf5.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "test_util.h"
#include "train/formats/h5file.h"

namespace fs = std::filesystem;
using namespace tapelm;
using test::TempDir;
using test::file_bytes;

namespace {


/// HDF5 identifiers still open anywhere in the process (files, groups, datasets, attributes...).
ssize_t open_hdf5_objects() { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

/// Runs f and checks that it throws a one-line checkpoint Error whose message contains every part.
void expect_h5_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  test::expect_throw(f, ErrorKind::checkpoint, parts);
}

void put_file_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Opens the file and reads every dataset and root attribute: a corrupted file may throw an Error
/// (anything else, or a crash, fails the test). Returns whether it threw.
bool read_everything(const std::string& path) {
  try {
    H5File f = H5File::open_read(path);
    for (const std::string& name : f.list_datasets_recursive("/")) {
      if (name == "tokens")
        f.read_ints(name);
      else
        f.read_tensor(name);
    }
    f.read_attr_string("/", "config");
    f.read_attr_int("/", "format_version");
    f.read_attr_double("/expected", "loss");
    return false;
  } catch (const Error&) {
    return true;
  }
}

const std::vector<std::string> mha_params = {
    "blocks.0.attn.wk.weight", "blocks.0.attn.wo.weight", "blocks.0.attn.wq.weight", "blocks.0.attn.wv.weight",
    "blocks.0.ln1.weight",     "blocks.0.ln2.weight",     "blocks.0.mlp.fc.weight",  "blocks.0.mlp.proj.weight",
    "blocks.1.attn.wk.weight", "blocks.1.attn.wo.weight", "blocks.1.attn.wq.weight", "blocks.1.attn.wv.weight",
    "blocks.1.ln1.weight",     "blocks.1.ln2.weight",     "blocks.1.mlp.fc.weight",  "blocks.1.mlp.proj.weight",
    "ln_f.weight",             "wpe.weight",              "wte.weight"};

}  // namespace

BOOST_AUTO_TEST_SUITE(h5)

BOOST_AUTO_TEST_CASE(h5py_fixture_root_attrs) {
  H5File f = H5File::open_read(test::parity_fixture("mha.h5"));
  BOOST_TEST(f.read_attr_string("/", "format") == "tapelm");
  BOOST_TEST(f.read_attr_int("/", "format_version") == 1);
  BOOST_TEST(f.read_attr_double("/", "format_version") == 1.0);
  const std::string config = f.read_attr_string("/", "config");
  BOOST_TEST(config.find("n_kv_head") != std::string::npos);
  auto j = nlohmann::json::parse(config);
  BOOST_TEST(j.at("n_kv_head").get<int>() == 4);
  BOOST_TEST(j.at("vocab_size").get<int>() == 65);
  BOOST_TEST(f.has_attr("/", "config"));
  BOOST_TEST(!f.has_attr("/", "nope"));
  BOOST_TEST(f.list("/") == (std::vector<std::string>{"expected", "model", "tokens"}));
}

BOOST_AUTO_TEST_CASE(h5py_fixture_model_names_and_shapes) {
  H5File f = H5File::open_read(test::parity_fixture("mha.h5"));
  BOOST_TEST(f.list("/model") == mha_params);
  BOOST_TEST(f.list_datasets_recursive("/model") == mha_params);
  BOOST_TEST(f.list_datasets_recursive("model/") == mha_params);
  BOOST_TEST(f.dataset_shape("/model/wte.weight") == (Shape{65, 32}));
  BOOST_TEST(f.dataset_shape("/model/wpe.weight") == (Shape{16, 32}));
  BOOST_TEST(f.dataset_shape("/model/blocks.0.attn.wq.weight") == (Shape{32, 32}));
  BOOST_TEST(f.dataset_shape("/model/blocks.1.mlp.fc.weight") == (Shape{128, 32}));
  BOOST_TEST(f.dataset_shape("/model/ln_f.weight") == (Shape{32}));
  Tensor wte = f.read_tensor("/model/wte.weight");
  BOOST_TEST(wte.shape() == (Shape{65, 32}));
  // Bit patterns and sum as h5py and numpy read them: tests/fixtures/print_fixture_values.py.
  const uint32_t first_bits[3] = {3183013296u, 1043997464u, 3179263366u};
  for (int i = 0; i < 3; i++) {
    uint32_t bits;
    std::memcpy(&bits, wte.data() + i, 4);
    BOOST_TEST(bits == first_bits[i]);
  }
  double sum = 0;
  for (int64_t i = 0; i < wte.numel(); i++) sum += wte[i];
  BOOST_TEST(sum == -16.729763924173312, boost::test_tools::tolerance(1e-12));
  // The whole tree: the expected gradients mirror the parameter names.
  std::vector<std::string> all = f.list_datasets_recursive("/");
  BOOST_TEST(all.size() == 2 * mha_params.size() + 2);
  BOOST_TEST(std::count(all.begin(), all.end(), "expected/grad/wte.weight") == 1);
  BOOST_TEST(std::count(all.begin(), all.end(), "tokens") == 1);
}

BOOST_AUTO_TEST_CASE(h5py_fixture_tokens_and_loss) {
  H5File f = H5File::open_read(test::parity_fixture("mha.h5"));
  Shape shape;
  std::vector<int32_t> tokens = f.read_ints("/tokens", &shape);
  BOOST_TEST(shape == (Shape{3, 17}));
  BOOST_REQUIRE(tokens.size() == 51u);
  const std::vector<int32_t> row0 = {8, 8, 51, 32, 38, 39, 46, 1, 31, 9, 26, 60, 35, 4, 35, 8, 49};
  BOOST_TEST(std::vector<int32_t>(tokens.begin(), tokens.begin() + 17) == row0);
  BOOST_TEST(tokens.back() == 60);
  BOOST_TEST(f.read_attr_double("/expected", "loss") == 4.3668212890625);
  BOOST_TEST(f.dataset_shape("/expected/logits") == (Shape{3, 16, 65}));
}

BOOST_AUTO_TEST_CASE(all_h5py_fixtures_open) {
  for (const char* name : {"mha.h5", "gqa.h5", "mqa.h5", "llama_gqa.h5", "bias_gqa.h5", "convert_mha.h5"}) {
    BOOST_TEST_CONTEXT(name) {
      H5File f = H5File::open_read(test::parity_fixture(name));
      BOOST_TEST(f.read_attr_string("/", "format") == "tapelm");
      auto cfg = nlohmann::json::parse(f.read_attr_string("/", "config"));
      BOOST_TEST(f.dataset_shape("/model/wte.weight") == (Shape{cfg.at("vocab_size").get<int64_t>(), 32}));
      BOOST_TEST(f.list("/model") == f.list("/expected/grad"));
      BOOST_TEST(f.list_datasets_recursive("/model").size() == f.list("/model").size());
    }
  }
  H5File c = H5File::open_read(test::parity_fixture("convert_mha.h5"));
  BOOST_TEST(c.exists("/expected/convert/mean_kv2/model/blocks.0.attn.wk.weight"));
  BOOST_TEST(c.dataset_shape("/expected/convert/mean_kv1/model/blocks.0.attn.wk.weight") == (Shape{8, 32}));
  BOOST_TEST(c.has_attr("/expected/convert/first_kv2", "loss"));
  BOOST_TEST(open_hdf5_objects() == 1);
}

BOOST_AUTO_TEST_CASE(h5py_dtypes_convert) {
  H5File f = H5File::open_read(test::fixture_path("h5py_types.h5"));
  Shape shape;
  BOOST_TEST(f.read_ints("/i64", &shape) == (std::vector<int32_t>{0, -1, 2, 3, 2147483647, -2147483647 - 1}));
  BOOST_TEST(shape == (Shape{2, 3}));
  BOOST_TEST(f.read_ints("/i16") == (std::vector<int32_t>{-32768, 0, 7, 32767}));
  BOOST_TEST(f.read_ints("/u16") == (std::vector<int32_t>{0, 1, 65535}));
  BOOST_TEST(f.read_ints("/u8") == (std::vector<int32_t>{0, 51, 102, 153, 204, 255}));
  BOOST_TEST(f.read_bytes("/u8") == (std::vector<uint8_t>{0, 51, 102, 153, 204, 255}));
  expect_h5_error([&] { f.read_ints("/i64_big"); }, {"/i64_big has value 1099511627776 at index 1", "int32"});
  expect_h5_error([&] { f.read_ints("/u64_big"); }, {"/u64_big has value 9223372036854775813 at index 0"});
  Tensor f64 = f.read_tensor("/f64");
  BOOST_TEST(f64.shape() == (Shape{2, 2}));
  BOOST_TEST(f64[0] == 0.5f);
  BOOST_TEST(f64[1] == -2.0f);
  BOOST_TEST(f64[2] == 0.1f);  // rounded to nearest, as numpy's astype(float32)
  BOOST_TEST(std::isinf(f64[3]));
  Tensor scalar = f.read_tensor("/f32_scalar");
  BOOST_TEST(scalar.shape() == Shape{});
  BOOST_TEST(scalar.item() == 3.25f);
  BOOST_TEST(f.read_tensor("/i16")[0] == -32768.0f);
  Tensor chunked = f.read_tensor("/chunked");  // gzip-compressed, chunked
  BOOST_TEST(chunked.shape() == (Shape{3, 4}));
  BOOST_TEST(chunked[11] == 11.0f);
  expect_h5_error([&] { f.read_tensor("/strings"); }, {"/strings is string, expected a numeric dataset"});
  expect_h5_error([&] { f.read_ints("/flags"); }, {"/flags is enum"});
  expect_h5_error([&] { f.read_bytes("/i16"); }, {"/i16 is int16, expected a uint8 dataset"});

  BOOST_TEST(f.read_attr_string("/", "vlen_str") == "h\xc3\xa9llo {\"k\": 1}");
  BOOST_TEST(f.read_attr_string("/", "empty_str") == "");
  BOOST_TEST(f.read_attr_string("/", "fixed_str") == "fixed");
  BOOST_TEST(f.read_attr_int("/", "i8") == -5);
  BOOST_TEST(f.read_attr_int("/", "i64") == -(int64_t{1} << 40));
  BOOST_TEST(f.read_attr_double("/", "f32") == 0.25);
  BOOST_TEST(f.read_attr_double("/", "f64") == 1.0 / 3.0);
  BOOST_TEST(f.read_attr_double("/", "i8") == -5.0);
  BOOST_TEST(f.read_attr_string("/g", "note") == "on a group");
  BOOST_TEST(f.read_attr_string("/i64", "note") == "on a dataset");
  expect_h5_error([&] { f.read_attr_int("/", "u64"); }, {"attribute u64 on /", "does not fit in int64"});
  expect_h5_error([&] { f.read_attr_int("/", "f64"); }, {"attribute f64 on / is float64, expected an integer"});
  expect_h5_error([&] { f.read_attr_string("/", "i8"); }, {"attribute i8 on / is int8, expected a string"});
  expect_h5_error([&] { f.read_attr_int("/", "array"); }, {"attribute array on / has 3 elements, expected one"});
  expect_h5_error([&] { f.read_attr_double("/", "vlen_str"); }, {"is string, expected a number"});

  // The soft link is a child of / but not a dataset of its own in the recursive listing.
  BOOST_TEST(f.list("/") == (std::vector<std::string>{"chunked", "f32_scalar", "f64", "flags", "g", "i16", "i64",
                                                      "i64_big", "link", "strings", "u16", "u64_big", "u8"}));
  BOOST_TEST(f.list_datasets_recursive("/g") == (std::vector<std::string>{"sub/x", "y.z"}));
  BOOST_TEST(f.exists("/link"));
  BOOST_TEST(f.dataset_shape("/link") == (Shape{2}));
}

BOOST_AUTO_TEST_CASE(exists_handles_missing_intermediates) {
  H5File f = H5File::open_read(test::parity_fixture("mha.h5"));
  BOOST_TEST(f.exists("/"));
  BOOST_TEST(f.exists(""));
  BOOST_TEST(f.exists("/model"));
  BOOST_TEST(f.exists("model/wte.weight"));
  BOOST_TEST(f.exists("/model/wte.weight/"));
  BOOST_TEST(!f.exists("/model/wte"));
  BOOST_TEST(!f.exists("/optim"));
  BOOST_TEST(!f.exists("/optim/exp_avg/wte.weight"));
  BOOST_TEST(!f.exists("/a/b/c/d"));
  BOOST_TEST(!f.exists("/tokens/x"));  // an intermediate that is a dataset
  BOOST_TEST(!f.has_attr("/optim", "step"));
  BOOST_TEST(open_hdf5_objects() == 1);
}

BOOST_AUTO_TEST_CASE(tensor_round_trip_is_bit_exact) {
  TempDir tmp;
  const std::string path = tmp / ("t.h5");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Tensor big = Tensor::empty({3, 5, 7});
  for (int64_t i = 0; i < big.numel(); i++) big[i] = normal(rng);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::lowest()};
  Tensor special = Tensor::empty({8});
  std::memcpy(special.data(), specials, sizeof specials);
  const std::vector<std::pair<std::string, Tensor>> cases = {{"/model/blocks.0.attn.wq.weight", big},
                                                             {"/optim/exp_avg/sub/special", special},
                                                             {"scalar", Tensor::scalar(-1.5f)},
                                                             {"/empty", Tensor::empty({0})},
                                                             {"/empty2", Tensor::empty({3, 0})}};
  {
    H5File f = H5File::create(path);
    for (const auto& [name, t] : cases) f.write_tensor(name, t);
    f.close();
    f.close();  // idempotent
  }
  H5File f = H5File::open_read(path);
  for (const auto& [name, t] : cases) {
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(f.dataset_shape(name) == t.shape());
      Tensor back = f.read_tensor(name);
      BOOST_TEST(back.shape() == t.shape());
      BOOST_TEST(std::memcmp(back.data(), t.data(), static_cast<size_t>(t.numel()) * 4) == 0);
    }
  }
  BOOST_TEST(f.list("/optim/exp_avg") == std::vector<std::string>{"sub"});
  BOOST_TEST(f.list_datasets_recursive("/optim") == std::vector<std::string>{"exp_avg/sub/special"});
}

BOOST_AUTO_TEST_CASE(ints_bytes_round_trip_and_replace) {
  TempDir tmp;
  const std::string path = tmp / ("i.h5");
  std::vector<int32_t> ids = {0, -1, 7, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 3};
  std::vector<uint8_t> blob(1000);
  for (size_t i = 0; i < blob.size(); i++) blob[i] = static_cast<uint8_t>(i * 37);
  {
    H5File f = H5File::create(path);
    f.write_ints("/data/tokens", ids, {2, 3});
    f.write_bytes("/train/rng", blob);
    f.write_bytes("/train/empty", {});
    f.write_tensor("/w", Tensor::full({4}, 1.0f));
    f.write_tensor("/w", Tensor::full({2, 2}, 2.0f));  // replaced, new shape
    expect_h5_error([&] { f.write_ints("/bad", {1, 2, 3}, {2, 2}); },
                    {path + ": cannot write /bad: 3 values for shape [2, 2]"});
    expect_h5_error([&] { f.write_tensor("/data", Tensor::zeros({1})); }, {"a group has that name"});
    expect_h5_error([&] { f.create_group("/w/sub"); }, {"/w"});
  }
  H5File f = H5File::open_read(path);
  Shape shape;
  BOOST_TEST(f.read_ints("data/tokens", &shape) == ids);
  BOOST_TEST(shape == (Shape{2, 3}));
  BOOST_TEST(f.read_bytes("/train/rng") == blob);
  BOOST_TEST(f.read_bytes("/train/empty").empty());
  BOOST_TEST(f.read_tensor("/w").shape() == (Shape{2, 2}));
  BOOST_TEST(f.read_tensor("/w")[3] == 2.0f);
  BOOST_TEST(f.read_tensor("/data/tokens")[1] == -1.0f);  // integers convert to float
  BOOST_TEST(!f.exists("/bad"));
}

BOOST_AUTO_TEST_CASE(attrs_round_trip) {
  TempDir tmp;
  const std::string path = tmp / ("a.h5");
  const std::string json = "{\"n_kv_head\": 2, \"name\": \"caf\xc3\xa9\"}";
  {
    H5File f = H5File::create(path);
    f.create_group("/optim/exp_avg");
    f.create_group("/optim");  // already there: no-op
    f.write_tensor("/model/w", Tensor::zeros({2}));
    f.write_attr("/", "format", "tapelm");
    f.write_attr("/", "format_version", 1);  // an int literal resolves to int64
    f.write_attr("/", "config", json);
    f.write_attr("/", "empty", std::string());
    f.write_attr("/optim", "step", std::numeric_limits<int64_t>::min());
    f.write_attr("/optim", "big", std::numeric_limits<int64_t>::max());
    f.write_attr("/optim", "lr", 3e-4);
    f.write_attr("/optim", "tiny", std::numeric_limits<double>::denorm_min());
    f.write_attr("/optim", "count", size_t{42});
    f.write_attr("/model/w", "note", "on a dataset");
    f.write_attr("/", "replaced", 1.5);
    f.write_attr("/", "replaced", "now a string");
    expect_h5_error([&] { f.write_attr("/nope", "x", 1); }, {path + ": missing object /nope"});
    expect_h5_error([&] { f.write_attr("/", "x", uint64_t{1} << 63); }, {"does not fit in int64"});
    f.flush();
  }
  H5File f = H5File::open_read(path);
  BOOST_TEST(f.read_attr_string("/", "format") == "tapelm");
  BOOST_TEST(f.read_attr_int("/", "format_version") == 1);
  BOOST_TEST(f.read_attr_string("/", "config") == json);
  BOOST_TEST(f.read_attr_string("/", "empty") == "");
  BOOST_TEST(f.read_attr_int("/optim", "step") == std::numeric_limits<int64_t>::min());
  BOOST_TEST(f.read_attr_int("/optim", "big") == std::numeric_limits<int64_t>::max());
  BOOST_TEST(f.read_attr_double("/optim", "lr") == 3e-4);
  BOOST_TEST(f.read_attr_double("/optim", "tiny") == std::numeric_limits<double>::denorm_min());
  BOOST_TEST(f.read_attr_int("/optim", "count") == 42);
  BOOST_TEST(f.read_attr_string("/model/w", "note") == "on a dataset");
  BOOST_TEST(f.read_attr_string("/", "replaced") == "now a string");
  BOOST_TEST(f.list("/") == (std::vector<std::string>{"model", "optim"}));
  BOOST_TEST(f.list("/optim") == std::vector<std::string>{"exp_avg"});
  BOOST_TEST(f.list("/optim/exp_avg").empty());
}

BOOST_AUTO_TEST_CASE(errors_name_file_and_object) {
  const std::string path = test::parity_fixture("mha.h5");
  H5File f = H5File::open_read(path);
  expect_h5_error([&] { f.read_tensor("/model/nope.weight"); }, {path + ": missing dataset /model/nope.weight"});
  expect_h5_error([&] { f.read_tensor("/optim/exp_avg/wte.weight"); },
                  {path + ": missing dataset /optim/exp_avg/wte.weight"});
  expect_h5_error([&] { f.dataset_shape("/nope"); }, {path + ": missing dataset /nope"});
  expect_h5_error([&] { f.read_tensor("/model"); }, {path + ": /model is a group, expected a dataset"});
  expect_h5_error([&] { f.read_ints("/model/wte.weight"); },
                  {path + ": /model/wte.weight is float32, expected an integer dataset"});
  expect_h5_error([&] { f.read_bytes("/tokens"); }, {path + ": /tokens is int32, expected a uint8 dataset"});
  expect_h5_error([&] { f.list("/optim"); }, {path + ": missing group /optim"});
  expect_h5_error([&] { f.list("/tokens"); }, {path + ": /tokens is a dataset, expected a group"});
  expect_h5_error([&] { f.list_datasets_recursive("/nope"); }, {path + ": missing group /nope"});
  expect_h5_error([&] { f.read_attr_string("/", "nope"); }, {path + ": missing attribute nope on /"});
  expect_h5_error([&] { f.read_attr_int("/optim", "step"); }, {path + ": missing object /optim"});
  expect_h5_error([&] { f.read_attr_int("/", "config"); },
                  {path + ": attribute config on / is string, expected an integer"});
  expect_h5_error([&] { f.write_tensor("/x", Tensor::zeros({1})); }, {path + ": cannot create dataset /x"});
  expect_h5_error([&] { f.write_tensor("/x", Tensor()); }, {path + ": cannot write /x: undefined tensor"});
  BOOST_TEST(open_hdf5_objects() == 1);  // failures leak no handles
  f.close();
  expect_h5_error([&] { f.exists("/model"); }, {path + ": file is closed"});
  BOOST_TEST(open_hdf5_objects() == 0);
}

BOOST_AUTO_TEST_CASE(open_read_rejects_missing_and_non_hdf5) {
  TempDir tmp;
  const std::string missing = tmp / ("missing.h5");
  expect_h5_error([&] { H5File::open_read(missing); }, {missing + ": no such file"});
  expect_h5_error([&] { H5File::open_read(tmp.path.string()); }, {tmp.path.string() + ": is a directory"});
  const std::string text = tmp / ("x.h5");
  put_file_bytes(text, {'n', 'o', 't', ' ', 'h', 'd', 'f', '\n'});
  expect_h5_error([&] { H5File::open_read(text); }, {text + ": not an HDF5 file (or truncated/corrupted)"});
  const std::string empty = tmp / ("empty.h5");
  put_file_bytes(empty, {});
  expect_h5_error([&] { H5File::open_read(empty); }, {empty + ": not an HDF5 file"});
  expect_h5_error([&] { H5File::create(tmp / ("no/such/dir/x.h5")); }, {"no/such/dir/x.h5: cannot create HDF5 file"});
  BOOST_TEST(open_hdf5_objects() == 0);
}

BOOST_AUTO_TEST_CASE(truncated_and_corrupted_files_throw) {
  TempDir tmp;
  const std::vector<char> good = file_bytes(test::parity_fixture("mha.h5"));
  BOOST_REQUIRE(good.size() > 100000u);
  const std::string path = tmp / ("bad.h5");
  put_file_bytes(path, good);
  BOOST_TEST(!read_everything(path));

  for (size_t size : {good.size() / 2, good.size() - 1, size_t{100}, size_t{8}}) {
    BOOST_TEST_CONTEXT("truncated to " << size) {
      put_file_bytes(path, std::vector<char>(good.begin(), good.begin() + static_cast<ptrdiff_t>(size)));
      expect_h5_error([&] { H5File::open_read(path); }, {path + ": not an HDF5 file (or truncated/corrupted)"});
    }
  }
  // Garbage over metadata or data: reading must throw an Error or succeed with garbled values, never crash.
  std::mt19937 rng(1);
  for (size_t at : {size_t{0}, size_t{16}, size_t{96}, size_t{800}, size_t{2000}, size_t{4096}, good.size() / 3,
                    good.size() / 2, good.size() - 4096, good.size() - 300}) {
    BOOST_TEST_CONTEXT("garbage at " << at) {
      std::vector<char> bad = good;
      for (size_t i = at; i < std::min(at + 256, bad.size()); i++) bad[i] = static_cast<char>(rng());
      put_file_bytes(path, bad);
      read_everything(path);
    }
  }
  BOOST_TEST(open_hdf5_objects() == 0);
}

/// The layout and filters of a dataset, as HDF5 reports them.
struct Layout {
  H5D_layout_t layout = H5D_LAYOUT_ERROR;
  std::vector<H5Z_filter_t> filters;
  std::vector<hsize_t> chunk;
};

Layout layout_of(const std::string& path, const std::string& obj) {
  Layout out;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(file, obj.c_str(), H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(ds);
  out.layout = H5Pget_layout(dcpl);
  for (int i = 0; i < H5Pget_nfilters(dcpl); i++) {
    unsigned flags = 0;
    size_t n = 0;
    out.filters.push_back(H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &n, nullptr, 0, nullptr, nullptr));
  }
  if (out.layout == H5D_CHUNKED) {
    out.chunk.resize(8);
    out.chunk.resize(static_cast<size_t>(H5Pget_chunk(dcpl, 8, out.chunk.data())));
  }
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(file);
  return out;
}

/// Where the bytes of `t` first occur in the file (a dataset's stored data), or npos.
size_t find_data(const std::vector<char>& file, const Tensor& t) {
  const char* p = reinterpret_cast<const char*>(t.data());
  auto it = std::search(file.begin(), file.end(), p, p + t.numel() * 4);
  return it == file.end() ? std::string::npos : static_cast<size_t>(it - file.begin());
}

BOOST_AUTO_TEST_CASE(written_datasets_carry_the_fletcher32_filter) {
  TempDir tmp;
  const std::string path = tmp / "f.h5";
  {
    H5File f = H5File::create(path);
    f.write_tensor("/model/wte.weight", Tensor::full({65, 32}, 0.25f));
    f.write_tensor("/big", Tensor::full({1000, 600}, 1.0f));  // 2.4 MB: more than one chunk
    f.write_tensor("/wide", Tensor::full({300000}, 1.0f));    // 1.2 MB in one row
    f.write_ints("/tokens", {1, 2, 3, 4, 5, 6}, {2, 3});
    f.write_bytes("/train/sampler_state", {1, 2, 3});
    f.write_tensor("/scalar", Tensor::scalar(2.0f));
    f.write_tensor("/empty", Tensor::empty({0, 4}));
  }
  for (const char* obj : {"/model/wte.weight", "/big", "/wide", "/tokens", "/train/sampler_state"}) {
    BOOST_TEST_CONTEXT(obj) {
      const Layout l = layout_of(path, obj);
      BOOST_TEST(l.layout == H5D_CHUNKED);
      BOOST_TEST(l.filters == std::vector<H5Z_filter_t>{H5Z_FILTER_FLETCHER32});
    }
  }
  // One chunk for a parameter of up to 1 MiB, blocks of whole rows for a larger one.
  BOOST_TEST(layout_of(path, "/model/wte.weight").chunk == (std::vector<hsize_t>{65, 32}));
  BOOST_TEST(layout_of(path, "/big").chunk == (std::vector<hsize_t>{250, 600}));
  BOOST_TEST(layout_of(path, "/wide").chunk == (std::vector<hsize_t>{150000}));
  // Scalars and empty arrays cannot be chunked: they stay contiguous, and everything reads back.
  BOOST_TEST(layout_of(path, "/scalar").layout == H5D_CONTIGUOUS);
  BOOST_TEST(layout_of(path, "/empty").layout == H5D_CONTIGUOUS);
  H5File f = H5File::open_read(path);
  BOOST_TEST(f.read_tensor("/big")[599999] == 1.0f);
  BOOST_TEST(f.read_tensor("/scalar")[0] == 2.0f);
  BOOST_TEST(f.read_ints("/tokens") == (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  BOOST_TEST(f.read_bytes("/train/sampler_state") == (std::vector<uint8_t>{1, 2, 3}));
  // The h5py fixtures have no filter (contiguous datasets) and still load.
  const std::string fixture = test::parity_fixture("mha.h5");
  BOOST_TEST(layout_of(fixture, "/model/wte.weight").filters.empty());
  BOOST_TEST(H5File::open_read(fixture).read_tensor("/model/wte.weight").numel() > 0);
  BOOST_TEST(open_hdf5_objects() == 1);
}

BOOST_AUTO_TEST_CASE(a_byte_flipped_dataset_fails_its_checksum) {
  TempDir tmp;
  const std::string path = tmp / "flip.h5";
  Tensor w = Tensor::empty({64, 16});
  for (int64_t i = 0; i < w.numel(); i++) w[i] = 0.001f * static_cast<float>(i) - 0.5f;
  {
    H5File f = H5File::create(path);
    f.write_tensor("/model/wte.weight", w);
    f.write_tensor("/model/ln_f.weight", Tensor::full({16}, 1.0f));
  }
  std::vector<char> bytes = file_bytes(path);
  const size_t at = find_data(bytes, w);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  bytes[at + 1001] ^= 0x10;  // one bit of one float: a plausible value, which only the checksum notices
  put_file_bytes(path, bytes);
  H5File f = H5File::open_read(path);
  expect_h5_error([&] { f.read_tensor("/model/wte.weight"); }, {path + ": cannot read dataset /model/wte.weight", "Fletcher32"});
  BOOST_TEST(f.read_tensor("/model/ln_f.weight")[15] == 1.0f);  // the other dataset is intact
}

BOOST_AUTO_TEST_CASE(atomic_write_success_leaves_only_target) {
  TempDir tmp;
  const std::string path = tmp / ("ck.h5");
  write_h5_atomic(path, [](H5File& f) {
    f.write_attr("/", "format", "tapelm");
    f.write_tensor("/model/wte.weight", Tensor::full({3, 2}, 0.5f));
  });
  BOOST_TEST(tmp.listing() == std::set<std::string>{"ck.h5"});
  // Overwriting an existing file.
  write_h5_atomic(path, [](H5File& f) { f.write_attr("/", "format", "tapelm2"); });
  BOOST_TEST(tmp.listing() == std::set<std::string>{"ck.h5"});
  H5File f = H5File::open_read(path);
  BOOST_TEST(f.read_attr_string("/", "format") == "tapelm2");
  BOOST_TEST(!f.exists("/model"));
}

BOOST_AUTO_TEST_CASE(atomic_write_failure_leaves_nothing) {
  TempDir tmp;
  const std::string path = tmp / ("ck.h5");
  auto failing = [](H5File& f) {
    f.write_tensor("/model/wte.weight", Tensor::full({64, 64}, 1.0f));
    f.flush();
    throw std::runtime_error("fill failed");
  };
  BOOST_CHECK_THROW(write_h5_atomic(path, failing), std::runtime_error);
  BOOST_TEST(tmp.listing().empty());

  // An Error from inside fill() propagates unchanged, naming the target (not the temporary file it
  // is written as), also with nothing left behind.
  expect_h5_error([&] { write_h5_atomic(path, [](H5File& f) { f.read_tensor("/missing"); }); },
                  {path + ": missing dataset /missing"});
  BOOST_TEST(tmp.listing().empty());

  write_h5_atomic(path, [](H5File& f) { f.write_attr("/", "format", "tapelm"); });
  const std::vector<char> before = file_bytes(path);
  BOOST_CHECK_THROW(write_h5_atomic(path, failing), std::runtime_error);
  BOOST_TEST(tmp.listing() == std::set<std::string>{"ck.h5"});
  BOOST_TEST((file_bytes(path) == before));

  // the folders above an output are made, as for output folders (one rule); a file where a folder
  // must be is named
  write_h5_atomic(tmp / ("no/dir/ck.h5"), [](H5File& f) { f.write_attr("/", "format", "tapelm"); });
  BOOST_TEST(fs::is_regular_file(tmp / "no/dir/ck.h5"));
  fs::remove_all(tmp / "no");
  test::expect_throw([&] { write_h5_atomic(tmp / ("ck.h5/dir/ck.h5"), [](H5File&) {}); }, ErrorKind::data,
                     {"cannot write " + tmp / ("ck.h5/dir/ck.h5"), "cannot create the folder " + tmp / "ck.h5/dir"});
  BOOST_TEST(tmp.listing() == std::set<std::string>{"ck.h5"});
  BOOST_TEST(open_hdf5_objects() == 0);
}

BOOST_AUTO_TEST_CASE(move_only_handle) {
  TempDir tmp;
  H5File a = H5File::create(tmp / ("m.h5"));
  a.write_attr("/", "k", 3);
  H5File b = std::move(a);
  BOOST_TEST(!a.is_open());
  BOOST_TEST(b.is_open());
  BOOST_TEST(b.read_attr_int("/", "k") == 3);
  H5File c;
  c = std::move(b);
  BOOST_TEST(c.path() == tmp / ("m.h5"));
  c.close();
  BOOST_TEST(open_hdf5_objects() == 0);
  BOOST_TEST(H5File::open_read(tmp / ("m.h5")).read_attr_int("/", "k") == 3);
}

BOOST_AUTO_TEST_SUITE_END()
