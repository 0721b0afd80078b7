#pragma once
// The study's report from its cells' results: results.csv, report.md (the paper's tables and its
// findings checked on these numbers) and the gnuplot figures.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "train/study/sweep/plan.h"
#include "train/study/sweep/results.h"

namespace tapelm {

/// Summary of repeated measurements (seeds).
struct Stat {
  double mean = 0, sd = 0, lo = 0, hi = 0;
  int n = 0;
};

/// Mean, sample standard deviation, min and max.
Stat stat(const std::vector<double>& v);
/// "m" for one value, "m ± sd (n=N)" for more, "–" for none.
std::string fmt_stat(const Stat& s);

/// What the report says about the data beyond the results.
struct ReportContext {
  std::string data_name;  // the corpus file's name
  size_t train_tokens = 0, val_tokens = 0;
  std::string date;  // YYYY-MM-DD
};

/// Writes results.csv: one row per cell in the order of `results`, the decode columns of the preset's batches.
void write_results_csv(std::ostream& out, const SweepPlan& plan, const std::vector<CellResult>& results);
/// Writes report.md. `results` must hold every cell of the plan.
void write_report_md(std::ostream& out, const SweepPlan& plan, const std::vector<CellResult>& results,
                     const ReportContext& ctx);
/// Draws out_dir/fig_tradeoff.png, fig_alpha.png and fig_methods.png; throws an io Error
/// when gnuplot is missing or fails.
void write_plots(const std::string& out_dir, const SweepPlan& plan, const std::vector<CellResult>& results);

}  // namespace tapelm
