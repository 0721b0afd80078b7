#pragma once
// A training run's directory: checkpoint.h5, metrics.jsonl, and nothing half-written left behind;
// one writer at a time, and nothing in it replaced that tapelm did not write (OutputFolder,
// data/outdir.h).
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/outdir.h"

namespace tapelm {

class RunDir {
 public:
  /// Names the directory; touches nothing on disk.
  explicit RunDir(std::string dir);
  /// Creates the directory and locks it for the life of this object (a second writer fails here,
  /// before touching anything in it), claims run_files() in it (refused, naming the file, when the
  /// folder holds a file of one of those names that tapelm did not write), checks that it is
  /// writable (failing now, not after the first interval) and removes the temp files of a
  /// checkpoint write a killed job left behind.
  /// lock = false: the caller already holds the directory's lock (a DirLock is not re-entrant
  /// within a process), so only the rest is done.
  void prepare(bool lock = true);
  /// The directory as given.
  const std::string& path() const { return dir_; }
  /// The files a run writes in its directory (and rewrites in place: the manifest lists them by
  /// name, not by identity).
  static std::vector<std::string> run_files();
  /// dir/checkpoint.h5.
  std::string checkpoint() const;
  /// dir/metrics.jsonl.
  std::string metrics() const;
  /// Opens the metrics log for appending: emptied for a fresh run, and for a resumed one trimmed
  /// to the records of steps up to `resumed_step` (the steps after it are logged again).
  void open_metrics(bool resume, int64_t resumed_step);
  /// Appends one record to the metrics log and flushes it.
  void log(const nlohmann::json& record);

 private:
  std::string dir_;
  std::optional<OutputFolder> folder_;
  std::ofstream metrics_;
};

}  // namespace tapelm
