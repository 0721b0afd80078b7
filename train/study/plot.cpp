#include "autograd/error.h"
#include "train/study/plot.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/io.h"

namespace tapelm {

namespace fs = std::filesystem;

bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

std::string gp_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}

void run_gnuplot(const std::string& script) {
  if (!have_gnuplot()) throw Error(ErrorKind::io, "gnuplot is not installed (apt-get install -y gnuplot-nox)");
  const fs::path tmp = fs::temp_directory_path() / ("tapelm_plot_" + std::to_string(::getpid()) + ".gp");
  const fs::path err = tmp.string() + ".err";
  {
    std::ofstream out(tmp);
    out << script;
  }
  const std::string cmd = "gnuplot " + tmp.string() + " 2>" + err.string();
  const int st = std::system(cmd.c_str());
  std::ifstream e(err);
  std::string msg((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  fs::remove(tmp);
  fs::remove(err);
  if (st != 0) throw Error(ErrorKind::io, "gnuplot failed: " + msg.substr(0, 300));
}

std::string plot_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  require_regular_file((dir / "metrics.jsonl").string(), "metrics", ErrorKind::io);  // a FIFO would block the read
  std::ifstream in(dir / "metrics.jsonl");
  if (!in) throw Error(ErrorKind::io, (dir / "metrics.jsonl").string() + ": cannot read the metrics");
  const fs::path train_dat = dir / "loss_train.dat", val_dat = dir / "loss_val.dat";
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
  const fs::path png = dir / "loss.png";
  run_gnuplot("set terminal pngcairo size 900,560 font 'sans,11'\nset output " + gp_quote(png.string()) +
              "\nset title 'training loss'\nset xlabel 'step'\nset ylabel 'cross-entropy (nats/token)'\n"
              "set grid\nset key top right\n"
              "plot " + gp_quote(train_dat.string()) + " using 1:2 with lines lw 1.5 title 'train (per step)', " +
              gp_quote(val_dat.string()) + " using 1:2 with linespoints lw 2 pt 7 title 'val'\n");
  fs::remove(train_dat);
  fs::remove(val_dat);
  return png.string();
}

}  // namespace tapelm
