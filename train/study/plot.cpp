#include "autograd/error.h"
#include "train/study/plot.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/io.h"
#include "data/outdir.h"

namespace tapelm {

namespace fs = std::filesystem;

bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

namespace {
// A path as one word of a shell command line.
std::string gp_quote_shell(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}
}  // namespace

std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}

ScratchDir::ScratchDir() {
  std::string t = (fs::temp_directory_path() / "tapelm_plot_XXXXXX").string();
  if (!::mkdtemp(t.data())) throw Error(ErrorKind::io, "cannot make a folder under " + fs::temp_directory_path().string() + " for gnuplot");
  path_ = t;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);  // a folder this object made, with what gnuplot and tapelm wrote in it
}

void place_images(const std::vector<std::pair<fs::path, fs::path>>& images) {
  for (const auto& [drawn, place] : images)
    if (fs::exists(drawn)) write_file_atomic(place.string(), read_file_bytes(drawn.string(), "image"));
}

void run_gnuplot(const std::string& script) {
  if (!have_gnuplot()) throw Error(ErrorKind::io, "gnuplot is not installed (apt-get install -y gnuplot-nox)");
  const ScratchDir d;
  const fs::path gp = d / "plot.gp", err = d / "plot.err";
  std::ofstream(gp) << script;
  const std::string cmd = "gnuplot " + gp_quote_shell(gp.string()) + " 2>" + gp_quote_shell(err.string());
  const int st = std::system(cmd.c_str());
  std::ifstream e(err);
  std::string msg((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  if (st != 0) throw Error(ErrorKind::io, "gnuplot failed: " + msg.substr(0, 300));
}

std::string plot_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  require_regular_file((dir / "metrics.jsonl").string(), "metrics", ErrorKind::io);  // a FIFO would block the read
  OutputFolder folder(run_dir, "run directory", ErrorKind::io);
  folder.claim({"loss.png"}, "plot");
  folder.keep();
  std::ifstream in(dir / "metrics.jsonl");
  if (!in) throw Error(ErrorKind::io, (dir / "metrics.jsonl").string() + ": cannot read the metrics");
  const ScratchDir d;
  const fs::path train_dat = d / "loss_train.dat", val_dat = d / "loss_val.dat", drawn = d / "loss.png";
  std::ofstream tr(train_dat), va(val_dat);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("train_loss")) tr << j["step"] << " " << j["train_loss"] << "\n";
    if (j.contains("val_loss")) va << j["step"] << " " << j["val_loss"] << "\n";
  }
  tr.close();
  va.close();
  run_gnuplot("set terminal pngcairo size 900,560 font 'sans,11'\nset output " + gp_quote(drawn.string()) +
              "\nset title 'training loss'\nset xlabel 'step'\nset ylabel 'cross-entropy (nats/token)'\n"
              "set grid\nset key top right\n"
              "plot " + gp_quote(train_dat.string()) + " using 1:2 with lines lw 1.5 title 'train (per step)', " +
              gp_quote(val_dat.string()) + " using 1:2 with linespoints lw 2 pt 7 title 'val'\n");
  const fs::path png = dir / "loss.png";
  place_images({{drawn, png}});
  folder.record({"loss.png"});
  return png.string();
}

}  // namespace tapelm
