#pragma once
// Folders tapelm writes its outputs into (a run, a sweep, an HF model directory, a corpus), beside
// whatever else they hold. tapelm replaces or removes only what it wrote there: the entries the
// folder's manifest (.tapelm-manifest.json) lists, and its own temporary files. Everything else in
// the folder (a user's files and sub-folders, mounts, another program's files) is never moved,
// renamed or deleted, whatever ends the write: success, an error, a refusal or a kill.
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "data/dirlock.h"
#include "data/tempfile.h"

namespace tapelm {

/// The manifest's name in every folder tapelm writes.
inline constexpr const char* kManifestName = ".tapelm-manifest.json";

/// What a folder's manifest says.
struct Manifest {
  /// An entry tapelm wrote: which writer ("HF model", "corpus", "run", ...), and the identity of
  /// the file it left (device, inode, size, modification time) where it wrote the file whole;
  /// "" where its writer rewrites it in place (a run's metrics) or has listed it and not yet
  /// written it (a kill in between leaves such names).
  struct Entry {
    std::string by, id;
  };
  std::map<std::string, Entry> files;
  bool created = false;   // tapelm made the folder itself (so it may replace the folder whole)
  long temps_of = 0;      // a process whose temporary files may be in the folder (0: none)
  bool replacing = false; // files were being replaced one at a time: they may be of two writes
};

/// The identity of an entry as the manifest records it (lstat: device, inode, size, modification
/// time); "" when there is none.
std::string file_identity(const std::filesystem::path& p);

/// The manifest of `dir`; an empty one when it has none. A damaged manifest, or one that is not a
/// regular file, is a data Error naming it. Written by rename, it is read whole without the lock.
Manifest read_manifest(const std::filesystem::path& dir);

/// A data Error naming `dir` (as `what` names it) when a write that replaced its files one at a
/// time did not finish: its files may be a mix of two writes, so tapelm's readers refuse it.
void require_complete_output(const std::string& dir, const std::string& what);

/// A path a command reads or writes, with the flag that named it (for messages).
struct FlagPath {
  std::string flag, path;
};
/// A usage Error, before any work, when an output is one of the inputs or lies inside one of them
/// (an input directory): compared by device and inode, so through symbolic and hard links
/// (`convert --from D --out D/model.safetensors` replaced D's weights). An output folder that
/// contains an input is left to the folder's manifest: the input is not one of its files to
/// replace. Inputs or outputs given as "" are skipped.
void refuse_outputs_over_inputs(const std::vector<FlagPath>& outputs, const std::vector<FlagPath>& inputs);

/// A folder locked for writing tapelm's outputs into it, created when absent. `what` names it in
/// messages ("run directory", "HF model directory"). The root folder (`/`), a path that exists and
/// is not a directory, and a `.lock` that is not tapelm's lock are refused before anything is
/// written. Destroyed without keep(), a folder this object created is removed again when it holds
/// nothing but the lock and the manifest.
class OutputFolder {
 public:
  OutputFolder(const std::string& dir, std::string what, ErrorKind kind);
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  /// The folder with its symbolic links resolved: where everything is written.
  const std::filesystem::path& path() const { return path_; }
  /// The folder as the user named it (for messages).
  const std::string& given() const { return given_; }
  const std::string& what() const { return what_; }
  ErrorKind kind() const { return kind_; }
  /// This object made the folder.
  bool created() const { return created_; }
  const Manifest& manifest() const { return manifest_; }
  /// The entry `name` is `by`'s: listed as written by it, and the same file it left there.
  bool owns(const std::string& name, const std::string& by) const;
  /// Claims entries before they are written by `by`: each must be absent or `by`'s, else an Error
  /// naming it (nothing is written then); the manifest lists them all, on disk, when this returns.
  void claim(const std::vector<std::string>& names, const std::string& by);
  /// Refuses (an Error naming it) the first of `names` that is there and is not `by`'s.
  void refuse_foreign(const std::vector<std::string>& names, const std::string& by) const;
  /// Records the identity of entries `by` has just written whole (a file changed after this is no
  /// longer tapelm's).
  void record(const std::vector<std::string>& names);
  /// Writes the manifest (atomically, synced) and keeps it as the folder's.
  void save(const Manifest& m);
  /// The manifest as another step left it on disk (the folder was swapped whole).
  void adopt(const Manifest& m) { manifest_ = m; }
  /// The folder stays, even if this object created it.
  void keep() { kept_ = true; }
  /// The Error for an entry tapelm did not write and would have to replace.
  Error foreign(const std::string& name) const;

 private:
  std::string given_, what_;
  ErrorKind kind_;
  std::filesystem::path path_;
  bool created_ = false, kept_ = false;
  Manifest manifest_;
  std::optional<DirLock> lock_;
};

/// A directory output (a corpus, an HF model directory) written into its folder as a set: the old
/// set of tapelm's files or the new one, never a new config.json beside old weights.
///
/// - A folder tapelm created and that holds nothing but tapelm's outputs is built whole in a
///   sibling folder and exchanged with it in one rename (renameat2 RENAME_EXCHANGE): at every
///   instant the folder holds the old set or the new.
/// - Otherwise (the folder holds a user's files, is a mount point, or its file system cannot
///   exchange two folders), each file is built beside its target and renamed into place: every file
///   is old or new at every instant; the set is replaced within a few renames, and a kill among them
///   leaves the manifest saying so, which tapelm's readers then refuse (require_complete_output).
///
/// Entries that `is_output` names and tapelm did not write (another model's config.json) are
/// refused in one line before anything is built. tapelm's earlier outputs that the new set does
/// not replace are removed; nothing else is ever touched.
class DirectoryCommit {
 public:
  /// Locks `out` (creating it when absent: an existing non-directory is an Error of `kind`) and
  /// prepares where the new files are built. noun ("corpus", "HF model") names the contents in
  /// messages; is_output(name) says which file names the contents may have.
  DirectoryCommit(const std::string& out, const std::string& noun, std::function<bool(const std::string&)> is_output,
                  ErrorKind kind);
  ~DirectoryCommit();
  DirectoryCommit(const DirectoryCommit&) = delete;
  DirectoryCommit& operator=(const DirectoryCommit&) = delete;

  /// Where the output file `name` (a plain file name that is_output accepts) is to be written,
  /// whole, before commit() puts it in place. The same name gives the same path.
  std::string path(const std::string& name);
  /// Syncs the files written, then puts them in place (see the class) and removes tapelm's
  /// earlier outputs that they do not replace.
  void commit();
  /// After commit(): whether the folder was exchanged whole (else file by file).
  bool exchanged() const { return exchanged_; }

 private:
  bool exchange();
  void file_by_file();
  void clean_stage() noexcept;

  OutputFolder folder_;
  std::string noun_;
  std::function<bool(const std::string&)> is_output_;
  ErrorKind kind_;
  std::filesystem::path stage_;  // the sibling folder the set is built in; empty: beside the targets
  std::vector<std::string> names_;
  std::map<std::string, std::string> where_;
  bool committed_ = false, exchanged_ = false;
  // a signal that ends the process removes the staging folder and this process's temporary files
  std::optional<FolderGuard> stage_guard_, temps_guard_;
};

}  // namespace tapelm
