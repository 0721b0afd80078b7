#pragma once
// Plots drawn with gnuplot (Debian's gnuplot-nox): loss curves and the sweep's figures.
#include <string>

namespace tapelm {

/// True when a gnuplot binary can be run.
bool have_gnuplot();
/// Runs gnuplot on a script; throws std::runtime_error with gnuplot's message on failure.
void run_gnuplot(const std::string& script);
/// Draws RUN_DIR/loss.png from RUN_DIR/metrics.jsonl (train loss per step, val loss per eval).
/// Returns the image path.
std::string plot_run(const std::string& run_dir);
/// Quotes a path for a gnuplot string.
std::string gp_quote(const std::string& s);

}  // namespace tapelm
