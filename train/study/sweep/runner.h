#pragma once
// Running the trade-off study: every cell of the plan (train/study/sweep/plan.h) in turn, each finished
// one written to OUT/cells/<id>.json, so that re-running resumes by skipping them; then the report.
#include <string>

#include "train/stop.h"
#include "train/study/sweep/plan.h"

namespace tapelm {

/// Runs (or resumes) the study, writing out_dir/results.csv, report.md and the plots.
/// Returns false when stopped by a signal (re-run to resume).
bool run_sweep(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet = false,
               const StopToken& stop = StopToken());

/// Times every model shape's decoding again with this build, as the study does (so a study's
/// decode columns follow a faster kernel without training again), writes OUT/decode/ and prints
/// the times; when every cell has run, writes results.csv, report.md and the plots again with them.
void retime_sweep_decoding(const SweepPreset& p, const std::string& data_path, const std::string& out_dir, bool quiet = false);

}  // namespace tapelm
