#pragma once
// Plots drawn with gnuplot (Debian's gnuplot-nox): loss curves and the sweep's figures. gnuplot
// works in a folder of its own under the system's temporary directory; each image then goes into
// the output folder whole (written beside, renamed into place).
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tapelm {

/// A new folder under the system's temporary directory, removed with what is in it when the object
/// goes: the data and images of one drawing.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Puts each image drawn (first: its path in a ScratchDir) at its place (second) in one rename;
/// images gnuplot did not draw are skipped.
void place_images(const std::vector<std::pair<std::filesystem::path, std::filesystem::path>>& images);

/// True when a gnuplot binary can be run.
bool have_gnuplot();
/// Runs gnuplot on a script; throws std::runtime_error with gnuplot's message on failure.
void run_gnuplot(const std::string& script);
/// Draws RUN_DIR/loss.png from RUN_DIR/metrics.jsonl (train loss per step, val loss per eval),
/// under the run directory's lock (a running train holds it) and only where loss.png is absent or
/// tapelm's. Returns the image path.
std::string plot_run(const std::string& run_dir);
/// Quotes a path for a gnuplot string.
std::string gp_quote(const std::string& s);

}  // namespace tapelm
