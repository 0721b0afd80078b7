#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "autograd/runtime.h"
#include "data/sampler.h"
#include "train/dist.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_duration(double s) {
  char b[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%lds", t);
  return b;
}
}  // namespace

// One flat buffer for the gradient all-reduce: every gradient, then the step's loss and the
// number of ranks asked to stop, so one MPI_Allreduce per step carries every decision. Sharded
// gradients (reduced to their keepers during backward) leave it the loss and the stop alone.
class GradReducer {
 public:
  GradReducer(const NamedParams& params, bool with_grads) : params_(params), with_grads_(with_grads) {
    if (with_grads_)
      for (const auto& [name, p] : params_) n_ += static_cast<size_t>(p.numel());
    buf_.resize(n_ + 2);
  }
  /// Averages the gradients over ranks in place; returns the mean loss and whether any rank stops.
  std::pair<double, bool> reduce(double loss, bool stop) {
    size_t off = 0;
    if (with_grads_)
      for (const auto& [name, p] : params_) {  // p.grad() allocates a zero gradient if p got none
        std::copy_n(p.grad().data(), p.numel(), buf_.data() + off);
        off += static_cast<size_t>(p.numel());
      }
    buf_[n_] = static_cast<float>(loss);
    buf_[n_ + 1] = stop ? 1.f : 0.f;
    dist::allreduce_sum(buf_.data(), buf_.size());
    const float inv = 1.0f / static_cast<float>(dist::size());
    off = 0;
    if (with_grads_)
      for (const auto& [name, p] : params_) {
        p.grad().assign_scaled(buf_.data() + off, inv);
        off += static_cast<size_t>(p.numel());
      }
    return {static_cast<double>(buf_[n_]) * inv, buf_[n_ + 1] > 0};
  }
 private:
  const NamedParams& params_;
  const bool with_grads_;
  size_t n_ = 0;
  std::vector<float> buf_;
};

// shard parameters (ZeRO stage 3): each block parameter is kept between uses by one rank (for a
// trained one, the rank that updates it); the other ranks hold it only while its block runs,
// gathered from the keeper (MPI_Ibcast, all of the block's at once) and freed after. GPT calls
// gather and release in the same order on every rank: around each block's forward, and through
// on_backward around each block's backward.
class ShardedBlocks : public BlockResidency {
 public:
  struct Held {
    Var p;
    Shape shape;
    int keeper;
  };
  ShardedBlocks(std::vector<std::vector<Held>> layers, int rank, double& comm_seconds)
      : layers_(std::move(layers)), whole_(layers_.size(), 1), rank_(rank), comm_seconds_(comm_seconds) {}
  void gather(size_t l) override {
    if (whole_.at(l)) return;
    const auto t0 = Clock::now();
    std::vector<dist::Pending> sends;
    for (Held& h : layers_[l]) {
      if (h.keeper != rank_) h.p.val() = Tensor::empty(h.shape);
      sends.push_back(dist::broadcast_start(h.p.val().data(), static_cast<size_t>(shape_numel(h.shape)), h.keeper));
    }
    for (dist::Pending& p : sends) p.wait();
    whole_[l] = 1;
    comm_seconds_ += seconds_since(t0);
  }
  void release(size_t l) override {
    if (!whole_.at(l)) return;
    for (Held& h : layers_[l])
      if (h.keeper != rank_) h.p.release_value();
    whole_[l] = 0;
  }
  bool collective() const override { return true; }
  /// Every block to its keepers, the freed blocks returned to the system.
  void release_all() {
    for (size_t l = 0; l < layers_.size(); l++) release(l);
    release_cached_storage();
  }

 private:
  std::vector<std::vector<Held>> layers_;
  std::vector<char> whole_;  // the same on every rank
  const int rank_;
  double& comm_seconds_;
};

GPT::Keep start_keep(const TrainConfig& cfg) {
  if (dist::size() < 2 || cfg.shard != Shard::parameters) return nullptr;
  return [keepers = deal_out(cfg, dist::size()), rank = dist::rank()](const std::string& name) {
    const auto it = keepers.find(name);  // a name no parameter has: not this rank's to drop
    return !is_block_parameter(name) || it == keepers.end() || it->second == rank;
  };
}

namespace {
// Rank 0's weights to every rank, and a check that every rank runs the same config on the same data.
// Every rank must also hold the same resumed state and options, or their collectives would differ.
void agree_on_start(const NamedParams& params, Optimizer& optim, const TrainState& st, const TrainConfig& cfg,
                    const Corpus& corpus, const TrainOptions& opt, bool sharded) {
  const std::string data = std::to_string(dist::checksum(corpus.tok.serialized().data(), corpus.tok.serialized().size())) +
                           "|" + corpus.train.fingerprint() + "|" + corpus.val.fingerprint();
  uint64_t moments = 0;  // sharded: each rank holds its own share, read from the same file
  if (!sharded)
    for (const std::string& key : optim.state_keys())
      for (const auto& [name, t] : optim.state(key))
        moments = moments * 31 + dist::checksum(t.bytes(), t.byte_size());
  const std::string state = std::to_string(st.step) + "|" + std::to_string(st.tokens_seen) + "|" +
                            std::to_string(optim.steps()) + "|" + std::to_string(moments) + "|" +
                            std::to_string(opt.resume) + std::to_string(opt.check_sync);
  const std::string mine = cfg.to_json().dump() + "#" + data + "#" + state;
  std::string lead = mine;
  dist::broadcast(lead);
  std::string err;
  if (mine != lead) {
    const size_t a = lead.find('#'), b = lead.find('#', a + 1);
    if (cfg.to_json().dump() != lead.substr(0, a))
      err = "its training config differs from rank 0's (config: " + cfg.to_json().dump() + ")";
    else if (data != lead.substr(a + 1, b - a - 1))
      err = "its data differ from rank 0's (another corpus or tokenizer)";
    else
      err = "its resumed state or options differ from rank 0's (step " + std::to_string(st.step) +
            "; is RUN_DIR the same file on every rank? are --resume and --check-sync given to all?)";
  }
  dist::agree(err);
  if (opt.init_shared && opt.init_from && !opt.resume) return;  // the caller sent rank 0's weights
  for (const auto& [name, p] : params)
    if (!(cfg.shard == Shard::parameters && is_block_parameter(name) && (!opt.init_from || opt.resume)))  // its keeper drew or read it as rank 0 did
      dist::broadcast(p.val().data(), static_cast<size_t>(p.numel()));
}
}  // namespace

void check_ranks_in_sync(const NamedParams& params, int64_t step) {
  std::vector<uint64_t> lo, hi;
  for (const auto& [name, p] : params) lo.push_back(dist::checksum(p.val().data(), p.numel() * sizeof(float)));
  hi = lo;
  dist::allreduce_min(lo.data(), lo.size());
  dist::allreduce_max(hi.data(), hi.size());
  for (size_t i = 0; i < lo.size(); i++)
    if (lo[i] != hi[i])
      throw dist::AgreedError("step " + std::to_string(step) + ": parameter " + params[i].first +
                                  " differs between ranks (--check-sync)",
                              dist::rank() == 0);
}

namespace {
double teacher_params(const TrainOptions& opt) {
  return opt.teacher ? static_cast<double>(model_cost(opt.teacher->config()).params) : 0.0;
}

// init_from's frozen block weights when they are held in 16 bits already (uptrain's conversion
// narrows each block as it makes it): the run takes them over as they are (a resume reads the
// checkpoint's into them, a block at a time).
std::shared_ptr<NarrowedBlocks> narrowed_init(const TrainOptions& opt) {
  return opt.init_from ? std::dynamic_pointer_cast<NarrowedBlocks>(opt.init_from->residency) : nullptr;
}

HeldNarrowed held_narrowed(const NarrowedBlocks& n, bool since_start) {
  return {static_cast<double>(n.values()), static_cast<double>(n.largest_block()), since_start};
}

// The model's config, once the checks and settings that precede building the model are done.
const GPTConfig& model_config(const TrainConfig& cfg, const TrainOptions& opt) {
  // Before the model is allocated. A distillation teacher is in memory already, and so are
  // init_from's weights, which the run takes over: the memory they hold is the run's.
  double reused = opt.init_from ? 4.0 * static_cast<double>(model_cost(opt.init_from->config()).params) : 0.0;
  const std::shared_ptr<NarrowedBlocks> narrowed = narrowed_init(opt);
  if (narrowed) reused -= 2.0 * static_cast<double>(narrowed->values());
  const HeldNarrowed held = narrowed ? held_narrowed(*narrowed, true) : HeldNarrowed{};
  check_training_memory(cfg, available_memory_bytes() + reused, dist::size(), narrowed ? &held : nullptr);
  set_num_threads(static_cast<int>(cfg.threads));
  return cfg.model;
}
}  // namespace

Trainer::Trainer(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt)
    : t_start_(Clock::now()),
      cfg_(cfg),
      precision_(cfg.precision),
      frozen_held_as_(frozen_weights_held_as(cfg, dist::size())),
      corpus_(corpus),
      opt_(opt),
      dir_(out_dir),
      rank_(dist::rank()),
      world_(dist::size()),
      lead_(rank_ == 0),
      multi_(world_ > 1),
      quiet_(opt.quiet || !lead_),
      // init_from's weights replace the init: nothing is drawn, so the model's own weights are never
      // touched (a second float32 copy of the model in memory while init_from's are taken over)
      model_(model_config(cfg, opt), cfg.seed, opt.init_from ? GPT::Keep([](const std::string&) { return false; }) : start_keep(cfg)),
      params_(trained_parameters(model_, cfg.trainable)),
      train_flops_(cfg.train_flops_per_token()) {
  st_.extra_json = opt.extra_json;
  // Anything that fails in set_up fails before the first collective, so in a multi-rank job
  // every rank learns of it at dist::agree and the job ends with the failing rank's message.
  std::string setup_error;
  try {
    set_up();
  } catch (const std::exception& e) {
    if (!multi_) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  dist::agree(setup_error);
  if (multi_) agree_on_start(model_.named_parameters(), *optim_, st_, cfg_, corpus_, opt_, !owner_.empty());
  // The start's weights are final: the frozen block weights go to 16 bits where frozen_weights says
  // so (those init_from held in 16 bits are so already).
  const bool narrowed_since_start = narrowed_ != nullptr;
  if (!narrowed_) narrowed_ = std::make_shared<NarrowedBlocks>(model_.blocks.size());
  std::string narrow_error;  // every rank holds the same weights: a value the type cannot hold is refused once, by rank 0
  try {
    for (size_t l = 0; l < model_.blocks.size(); l++) narrowed_->narrow(model_, l, frozen_held_as_);
  } catch (const std::exception& e) {
    if (!multi_) throw;
    narrow_error = *e.what() ? e.what() : "unknown error";
  }
  dist::agree(narrow_error);
  if (narrowed_->values() > 0)
    model_.residency = narrowed_;
  else
    narrowed_.reset();

  // Fixed evaluation batches: the same windows at every evaluation.
  const int64_t T = cfg_.model.block_size;
  const int64_t n_eval = cfg_.eval_iters * cfg_.batch_size;
  auto pick_windows = [&](const TokenSeq& data, uint64_t seed) {
    std::vector<int64_t> starts;
    Rng r(seed);
    for (int64_t i = 0; i < n_eval; i++) starts.push_back(static_cast<int64_t>(r.below(data.size() - T)));
    return starts;
  };
  val_windows_ = pick_windows(corpus_.val, cfg_.seed + 7);
  train_windows_ = pick_windows(corpus_.train, cfg_.seed + 11);

  // The job's peak: every rank measures its own share at once (so they compete as in training).
  // Two peaks: the measured sgemm rate (what the BLAS reaches here) and the CPU's theoretical
  // rate (what the silicon could reach; a fallback BLAS kernel shows as a low MFU against it).
  double peaks[2] = {cfg_.peak_flops > 0 ? cfg_.peak_flops : sgemm_peak_flops(), cpu_peak_flops()};
  dist::allreduce_sum(peaks, 2);
  peak_flops_ = peaks[0];
  cpu_peak_flops_ = peaks[1];
  if (!quiet_) {
    std::printf("%s%s%s\n", opt_.label.c_str(), compute_summary(compute_info()).c_str(),
                precision_ == Precision::f32 ? "" : (" | precision " + to_string(precision_)).c_str());
    if (precision_ == Precision::bf16)  // "" where bf16 cannot run: set_up refuses it in one line
      if (const std::string note = bf16_rate_note(); !note.empty()) std::printf("%s%s\n", opt_.label.c_str(), note.c_str());
    // what check_training_memory checked, so that a run's peak RSS can be held against it
    std::string shard;
    if (multi_ && cfg_.shard != Shard::none) {
      TrainConfig whole = cfg_;
      whole.shard = Shard::none;
      const char* what = cfg_.shard == Shard::parameters  ? "blocks' weights, the state and gradients"
                         : cfg_.shard == Shard::gradients ? "state and gradients"
                                                          : "state";
      shard = " (shard " + to_string(cfg_.shard) + ": the " + what + " of this rank's share of the parameters; " +
              byte_size_str(training_memory(whole, world_).total()) + " unsharded)";
    }
    // what is held in 16 bits, counted (under `auto` known only now)
    const HeldNarrowed held = narrowed_ ? held_narrowed(*narrowed_, narrowed_since_start) : HeldNarrowed{};
    const TrainingMemory memory = training_memory(cfg_, world_, teacher_params(opt_), narrowed_ ? &held : nullptr);
    std::printf("%smemory estimate%s %s%s\n", opt_.label.c_str(), multi_ ? " a rank" : "",
                memory.str().c_str(),
                shard.c_str());
    if (cfg_.trainable != Trainable::all) {
      const double trained = static_cast<double>(cfg_.trained_params()), all = static_cast<double>(model_cost(cfg_.model).params);
      std::printf("%strainable %s: training %.2f M of the %.2f M parameters (%.1f%%); the others are frozen\n", opt_.label.c_str(),
                  to_string(cfg_.trainable).c_str(), trained / 1e6, all / 1e6, 100.0 * trained / all);
    }
    if (narrowed_) {
      const double n = static_cast<double>(narrowed_->values());
      std::printf("%sfrozen weights in %s: %.2f M block parameters, %s instead of %s in float32, each block widened as it runs%s\n",
                  opt_.label.c_str(), narrowed_->types().c_str(), n / 1e6, byte_size_str(2 * n).c_str(), byte_size_str(4 * n).c_str(),
                  narrowed_->inexact() == 0 ? " (exactly their values)"
                                            : (" (" + std::to_string(narrowed_->inexact()) + " values rounded to the nearest)").c_str());
    }
  }
  tokens_per_step_ = static_cast<double>(cfg_.batch_size * T * cfg_.grad_accum * world_);
  if (multi_) reducer_ = std::make_unique<GradReducer>(params_, !shards_gradients(cfg_.shard));
  if (resident_) {  // the start's agreement and a resume's read are done: only what this rank keeps stays
    resident_->release_all();
    model_.residency = resident_;
    if (!quiet_) {  // what is held, counted from the values themselves
      double held = 0;
      for (const auto& [name, p] : model_.named_parameters())
        if (is_block_parameter(name)) held += 4.0 * static_cast<double>(p.val().numel());
      const double all = 4.0 * block_params(cfg_.model).all;
      std::printf("%sshard parameters: rank %d holds %s of the blocks' %s of weights between uses\n", opt_.label.c_str(), rank_,
                  byte_size_str(held).c_str(), byte_size_str(all).c_str());
    }
  }
  std::fflush(stdout);  // what the run holds, before a first step that may take minutes (a pipe gets it at once)
}

Trainer::~Trainer() = default;

void Trainer::zero_grads() {
  for (const auto& [name, p] : params_)
    if (p.has_grad()) p.zero_grad();
}

void Trainer::assign_owners() {
  const std::map<std::string, int> keepers = deal_out(cfg_, world_);
  owner_.clear();
  for (const auto& [name, p] : params_) owner_.push_back(keepers.at(name));
}

void Trainer::keep_blocks_sharded() {
  const std::map<std::string, int> keepers = deal_out(cfg_, world_);
  std::vector<std::vector<ShardedBlocks::Held>> layers(model_.blocks.size());
  const std::vector<std::pair<std::string, Shape>> shapes = parameter_shapes(cfg_.model);
  size_t i = 0;
  for (const auto& [name, p] : model_.named_parameters()) {
    const Shape& shape = shapes.at(i++).second;
    const int64_t l = block_index(name);
    if (l < 0) continue;
    layers.at(static_cast<size_t>(l)).push_back({p, shape, keepers.at(name)});
    held_by_[p.id()] = keepers.at(name);
  }
  resident_ = std::make_shared<ShardedBlocks>(std::move(layers), rank_, res_.comm_seconds);
}

int Trainer::held_by(const Var& p) const {
  const auto it = held_by_.find(p.id());
  return it == held_by_.end() ? -1 : it->second;
}

Tensor Trainer::exchange_weight(const Var& p, const Shape& shape) {
  const int keeper = held_by(p);
  Tensor t = rank_ == keeper ? p.val() : Tensor::empty(shape);
  dist::broadcast(t.data(), static_cast<size_t>(t.numel()), keeper);
  return t;
}

StateBuf Trainer::exchange_state(const std::string& key, size_t i) {
  const int owner = owner_[i];
  const auto& states = optim_->state(key);
  const auto it = states.find(params_[i].first);
  if (owner == 0) return lead_ && it != states.end() ? it->second : StateBuf();  // rank 0's own: nothing to send
  // 0: none, 1: float32, 2: bf16 (sent as kept: no float32 copy on either side)
  float has = rank_ == owner && it != states.end() ? (it->second.is_bf16() ? 2.f : 1.f) : 0.f;
  dist::broadcast(&has, 1, owner);
  if (has == 0) return {};
  const Shape& shape = param_shapes_[i];  // not the Var's: shard parameters frees a block's weights where they are not kept
  StateBuf s = rank_ == owner ? it->second : has == 2 ? StateBuf::bf16_empty(shape) : StateBuf(Tensor::empty(shape));
  if (s.is_bf16())
    dist::broadcast(s.bf16_data(), static_cast<size_t>(s.numel()), owner);
  else
    dist::broadcast(s.tensor().data(), static_cast<size_t>(s.numel()), owner);
  return s;
}

void Trainer::set_up() {
  const int64_t B = cfg_.batch_size, T = cfg_.model.block_size;
  check_frozen_weights(cfg_, world_);
  if (multi_ && cfg_.shard != Shard::none) assign_owners();
  for (const auto& [name, p] : params_) param_shapes_.push_back(p.shape());
  if (multi_ && cfg_.shard == Shard::parameters) keep_blocks_sharded();
  NamedParams updated;  // what this rank's optimizer updates and keeps state for: sharded, its share
  for (size_t i = 0; i < params_.size(); i++)
    if (owner_.empty() || owner_[i] == rank_) updated.push_back(params_[i]);
  optim_ = cfg_.make_optimizer(updated);
  if (corpus_.tok.vocab_size() > cfg_.model.vocab_size)
    throw Error(ErrorKind::config, "the corpus has " + std::to_string(corpus_.tok.vocab_size()) + " symbols but vocab_size is " +
                      std::to_string(cfg_.model.vocab_size));
  check_window_fits(static_cast<int64_t>(corpus_.train.size()), T, "train split");
  check_window_fits(static_cast<int64_t>(corpus_.val.size()), T, "val split");
  // before the run directory is made or locked: a failed resume leaves nothing behind
  if (const std::string why = precision_unavailable(precision_); !why.empty()) throw Error(ErrorKind::config, why);
  if (cfg_.distill_lambda > 0 && !opt_.teacher)
    throw Error(ErrorKind::config, "config distill_lambda " + std::to_string(cfg_.distill_lambda) +
                                       " needs a teacher model: distillation runs in `uptrain --distill`");
  if (opt_.teacher && (opt_.teacher->config().vocab_size != cfg_.model.vocab_size ||
                       opt_.teacher->config().block_size < cfg_.model.block_size))
    throw Error(ErrorKind::config, "the distillation teacher (vocab " + std::to_string(opt_.teacher->config().vocab_size) +
                                       ", block " + std::to_string(opt_.teacher->config().block_size) + ") does not fit the model (vocab " +
                                       std::to_string(cfg_.model.vocab_size) + ", block " + std::to_string(cfg_.model.block_size) + ")");
  if (opt_.resume && !fs::exists(dir_.checkpoint()))
    throw Error(ErrorKind::train, dir_.path() + ": resuming, but there is no checkpoint.h5 to resume from");
  if (lead_) dir_.prepare(!opt_.dir_locked);

  if (opt_.init_from) {
    auto src = opt_.init_from->named_parameters();
    auto dst = model_.named_parameters();
    // by the configs' shapes: a weight init_from holds in 16 bits has no float32 value to measure
    const auto have = parameter_shapes(opt_.init_from->config()), want = parameter_shapes(model_.config());
    if (src.size() != dst.size() || have.size() != src.size()) throw Error(ErrorKind::train, "init_from: parameter sets differ");
    for (size_t i = 0; i < src.size(); i++) {
      if (src[i].first != dst[i].first || have[i].second != want[i].second)
        throw Error(ErrorKind::train, "init_from: parameter " + src[i].first + " does not fit " + dst[i].first);
      dst[i].second.val() = src[i].second.val();  // shared: the init's own storage is freed here
      src[i].second.release_value();  // taken over: what this rank frees later (shard parameters) is freed
    }
    if ((narrowed_ = narrowed_init(opt_))) {  // its 16-bit weights too, held now for model_
      narrowed_->rebind(model_);
      opt_.init_from->residency.reset();
    }
  }
  model_.train();
  model_.recompute_blocks = cfg_.recompute == Recompute::blocks;
  // Each rank draws its own batches and dropout masks; rank 0's streams are a one-process run's.
  sampler_.emplace(corpus_.train, B, T, dist::rank_seed(cfg_.seed, rank_), "train split");
  model_.dropout_rng().set_state(dist::rank_seed(model_.dropout_rng().state(), rank_));

  if (opt_.resume) {
    const std::string ck_path = dir_.checkpoint();
    H5File f = H5File::open_read(ck_path);
    TrainConfig saved = read_train_config(f);
    if (!(saved.model == cfg_.model))
      throw Error(ErrorKind::checkpoint, ck_path + ": its model config differs from this run's: " + saved.model.to_json().dump());
    if (saved.trainable != cfg_.trainable)  // the optimizer state is of the parameters it trained
      throw Error(ErrorKind::checkpoint, ck_path + ": trained with trainable \"" + to_string(saved.trainable) + "\", this run has \"" +
                                             to_string(cfg_.trainable) + "\": resume with the same, or start a new run from its weights");
    std::set<std::string> updated;  // the state this rank's optimizer keeps (sharded: its share) is all it reads
    for (const auto& [name, p] : optim_->params()) updated.insert(name);
    GPT::Keep read_whole = start_keep(cfg_);  // shard parameters: the weights this rank keeps
    std::set<std::string> held;                // the weights held in 16 bits: read a block at a time below
    if (narrowed_) {
      for (const auto& [name, p] : model_.named_parameters())
        if (narrowed_->holds(p)) held.insert(name);
      read_whole = [&held](const std::string& n) { return held.count(n) == 0; };  // (never with shard parameters)
    }
    load_training_checkpoint(f, model_, *optim_, st_, [&updated](const std::string& n) { return updated.count(n) > 0; }, read_whole);
    for (size_t l = 0; narrowed_ && l < model_.blocks.size(); l++) {
      if (!narrowed_->holds_any(l)) continue;
      read_model_weights(f, model_, "/model", [&](const std::string& n) { return block_index(n) == static_cast<int64_t>(l) && held.count(n) > 0; });
      narrowed_->renarrow(l);
    }
    if (lead_ && !quiet_ && !st_.optim_hparams_changed.empty())
      std::printf("%sresuming with this run's optimizer hyper-parameters, not the checkpoint's: %s\n",
                  opt_.label.c_str(), st_.optim_hparams_changed.c_str());
    if (lead_ && !quiet_ && saved.precision != cfg_.precision)  // a switch was silent
      std::printf("%sresuming in precision %s, where the checkpoint trained in %s\n", opt_.label.c_str(), to_string(cfg_.precision).c_str(),
                  to_string(saved.precision).c_str());
    if (rank_ == 0) {
      sampler_->set_state(st_.sampler_state);
    } else if (rank_ < st_.world_size) {  // this rank's own streams, where it left them
      sampler_->set_state(st_.rank_sampler_states.at(rank_ - 1));
      model_.dropout_rng().set_state(st_.rank_dropout_rngs.at(rank_ - 1));
    } else {  // a rank the saved run did not have: fresh streams, distinct from any used before
      const uint64_t epoch = static_cast<uint64_t>(st_.step) + 1;
      sampler_.emplace(corpus_.train, B, T, dist::rank_seed(cfg_.seed, rank_, epoch), "train split");
      model_.dropout_rng().set_state(dist::rank_seed(cfg_.seed ^ 0xD50D0u, rank_, epoch));
    }
    if (lead_ && st_.world_size != world_ && !quiet_)
      std::printf("%sresuming a %d-rank run with %d rank%s: ranks below %d continue their data streams%s\n",
                  opt_.label.c_str(), st_.world_size, world_, world_ > 1 ? "s" : "", std::min(st_.world_size, world_),
                  world_ > st_.world_size ? ", the others start new ones" : "");
  }
  if (lead_) dir_.open_metrics(opt_.resume, st_.step);
}

Trainer::Step Trainer::step() {
  Step s;
  s.lr = lr_at(st_.step, cfg_.schedule());
  const float inv_accum = 1.0f / static_cast<float>(cfg_.grad_accum);
  double loss_sum = 0, distill_sum = 0, attention_sum = 0;
  const bool distill = opt_.teacher && cfg_.distill_lambda > 0;
  const bool attention = opt_.teacher && cfg_.distill_attention > 0;
  // A step of many micro-batches can take arbitrarily long: a stop between them abandons it, and
  // the data and dropout streams go back to where it began, so that the checkpoint of the last
  // completed step resumes as if this step had never started.
  std::optional<BatchSampler> sampler_at_start;
  const uint64_t dropout_at_start = model_.dropout_rng().state();
  if (cfg_.grad_accum > 1) sampler_at_start = *sampler_;
  // bf16: the linear layers' products for the forward and backward of every micro-batch
  std::optional<Autocast> autocast;
  if (precision_ != Precision::f32) autocast.emplace(precision_);
  // shard gradients (ZeRO stage 2): each gradient is summed into the rank that keeps it as soon as
  // backward is done with it, and dropped by the others, so a rank holds its share of the
  // gradients and the one being filled. Every micro-batch's gradients go so (DeepSpeed's order:
  // with grad_accum > 1 the sum is regrouped, equal to the unsharded one to float32 rounding).
  // Each reduction is finished before backward goes on (MPI_Reduce): with the reductions left in
  // flight (MPI_Ireduce) a rank's peak rose by 0.5 GB on 2 ranks on GPT-2-medium's shape (bench/SHARD_MEMORY.md),
  // more than the flat buffer stage 2 removes is worth giving back for a speed-up not resolved.
  const bool shard_grads = multi_ && shards_gradients(cfg_.shard);
  std::vector<char> reduced;
  const auto reduce_to_keeper = [&](size_t i) {
    const auto t_comm = Clock::now();
    const Var& p = params_[i].second;
    Tensor& g = p.grad();  // shard parameters: the value may be with its keeper, the gradient's shape is not
    dist::reduce_sum(g.data(), static_cast<size_t>(g.numel()), owner_[i]);
    if (owner_[i] != rank_) p.drop_grad();
    reduced[i] = 1;
    res_.comm_seconds += seconds_since(t_comm);
  };
  std::optional<GradReadyHook> hook;
  if (shard_grads) {
    reduced.assign(params_.size(), 0);
    std::vector<Var> watched;
    for (const auto& [name, p] : params_) watched.push_back(p);
    hook.emplace(watched, reduce_to_keeper);
  }
  for (int64_t m = 0; m < cfg_.grad_accum; m++) {
    if (m > 0 && stop_between_micro_steps()) {
      zero_grads();
      sampler_ = std::move(sampler_at_start);
      model_.dropout_rng().set_state(dropout_at_start);
      s.stop = s.abandoned = true;
      return s;
    }
    sampler_->next(x_, y_);
    const Var loss = micro_batch_loss(loss_sum, distill_sum, attention_sum);
    backward(cfg_.grad_accum > 1 ? mul(loss, inv_accum) : loss);
    if (shard_grads) {  // those no op took: zero, as the all-reduce would have them, in the same order on every rank
      for (size_t i = 0; i < params_.size(); i++)
        if (!reduced[i]) reduce_to_keeper(i);
      std::fill(reduced.begin(), reduced.end(), 0);
    }
  }
  hook.reset();
  autocast.reset();  // before the update changes the weights
  s.loss = loss_sum / static_cast<double>(cfg_.grad_accum);
  if (distill) s.distill = distill_sum / static_cast<double>(cfg_.grad_accum);
  if (attention) s.distill_attention = attention_sum / static_cast<double>(cfg_.grad_accum);
  if (multi_) {  // every rank leaves with the same gradients, loss and decision to stop
    const auto t_comm = Clock::now();
    std::tie(s.loss, s.stop) = reducer_->reduce(s.loss, opt_.stop.requested());
    if (shard_grads) {  // the keeper's sum to the mean, as the all-reduce's buffer is scaled
      const float inv = 1.0f / static_cast<float>(world_);
      for (size_t i = 0; i < params_.size(); i++)
        if (owner_[i] == rank_) params_[i].second.grad().scale_(inv);
    }
    for (double* term : {distill ? &s.distill : nullptr, attention ? &s.distill_attention : nullptr}) {
      if (!term) continue;
      dist::allreduce_sum(term, 1);
      *term /= world_;
    }
    res_.comm_seconds += seconds_since(t_comm);
  }
  // Every rank holds the same loss and gradients here, so all of them stop together.
  auto stop_with = [&](const std::string& why) {
    clear_tape();
    const std::string msg = "step " + std::to_string(st_.step) + ": " + why +
                            "; stopping (the last good checkpoint, if any, is " + dir_.checkpoint() + ")";
    if (multi_) throw dist::AgreedError(msg, lead_);
    throw Error(ErrorKind::train, msg);
  };
  if (!std::isfinite(s.loss)) stop_with(std::string("loss is ") + (std::isnan(s.loss) ? "NaN" : "Inf"));
  // A finite loss can still come with a non-finite gradient (the forward after an overflowing
  // update): the update would write NaN into every weight, and the next checkpoint with them.
  const double norm = shard_grads ? sharded_grad_norm() : grad_norm(params_);
  if (!std::isfinite(norm))  // before clipping, which would spread a NaN to every gradient and name the wrong one
    stop_with("the gradient of " + (shard_grads ? first_non_finite_share() : first_non_finite_grad(params_)) +
              " is not finite (gradient norm " + (std::isnan(norm) ? "NaN" : "Inf") + "), the update is refused");
  if (cfg_.grad_clip > 0) clip_grads_to(params_, norm, cfg_.grad_clip);  // sharded: each keeper its own
  optim_->step(s.lr);
  if (!owner_.empty()) {  // sharded: each rank updated its share; the new values go to the others
    const auto t_comm = Clock::now();
    std::vector<dist::Pending> sends;  // all at once: no rank waits for each in turn
    for (size_t i = 0; i < params_.size(); i++)
      if (held_by(params_[i].second) < 0)  // shard parameters: a block's weights are gathered where they are used
        sends.push_back(dist::broadcast_start(params_[i].second.val().data(), static_cast<size_t>(params_[i].second.numel()), owner_[i]));
    for (dist::Pending& p : sends) p.wait();
    res_.comm_seconds += seconds_since(t_comm);
  }
  zero_grads();
  st_.step++;
  st_.tokens_seen += static_cast<int64_t>(tokens_per_step_);
  res_.last_train_loss = s.loss;
  if (multi_ && opt_.check_sync) {  // what every rank holds: shard parameters leaves the blocks' with their keepers
    NamedParams everywhere;
    for (const auto& [name, p] : model_.named_parameters())
      if (held_by(p) < 0 && !(narrowed_ && narrowed_->holds(p))) everywhere.emplace_back(name, p);  // frozen: never changes
    check_ranks_in_sync(everywhere, st_.step);
  }
  if (!multi_) s.stop = opt_.stop.requested();
  return s;
}

namespace {
/// (1/L) Σ_l ‖o_l − t_l‖² / ‖t_l‖² over the blocks' attention outputs o_l (on the tape) and the
/// teacher's t_l (constants).
Var attention_distance(const std::vector<Var>& outs, const std::vector<Var>& teacher_outs) {
  if (teacher_outs.size() != outs.size())
    throw Error(ErrorKind::config, "distill_attention: the teacher has " + std::to_string(teacher_outs.size()) +
                                       " layers, the model " + std::to_string(outs.size()));
  Var a;
  for (size_t l = 0; l < outs.size(); l++) {
    const Tensor& t = teacher_outs[l].val();
    double tt = 0;  // ‖t_l‖²
    for (int64_t i = 0; i < t.numel(); i++) tt += static_cast<double>(t[i]) * t[i];
    const Var d = sub(outs[l], Var(t));
    const Var rel = mul(sum(mul(d, d)), static_cast<float>(1.0 / (std::max(tt, 1e-30) * static_cast<double>(outs.size()))));
    a = l == 0 ? rel : add(a, rel);
  }
  return a;
}
}  // namespace

Var Trainer::micro_batch_loss(double& ce_sum, double& distill_sum, double& attention_sum) {
  const bool kl = cfg_.distill_lambda > 0, attention = cfg_.distill_attention > 0;
  if (!opt_.teacher || (!kl && !attention)) {
    Var loss = model_.loss(x_, y_);
    ce_sum += loss.item();
    return loss;
  }
  std::vector<Var> outs, teacher_outs;
  const Var logits = model_.forward(x_, nullptr, attention ? &outs : nullptr);
  const Var ce = cross_entropy(logits, y_);
  Tensor teacher;
  {
    NoGrad no_grad;
    teacher = opt_.teacher->forward(x_, nullptr, attention ? &teacher_outs : nullptr).val();
  }
  ce_sum += ce.item();
  const float lambda = static_cast<float>(cfg_.distill_lambda);
  Var loss = mul(ce, 1.f - lambda);
  if (kl) {
    const Var kd = distill_kl(logits, teacher, y_, static_cast<float>(cfg_.distill_temperature));
    distill_sum += kd.item();
    loss = add(loss, mul(kd, lambda));
  }
  if (attention) {
    const Var a = attention_distance(outs, teacher_outs);
    attention_sum += a.item();
    loss = add(loss, mul(a, static_cast<float>(cfg_.distill_attention)));
  }
  return loss;
}

double Trainer::sharded_grad_norm() {
  // Each parameter's sum of squares from its keeper (the others add 0, exactly), summed in the
  // order grad_norm sums them: the unsharded run's norm, bit for bit.
  std::vector<double> part(params_.size(), 0.0);
  for (size_t i = 0; i < params_.size(); i++)
    if (owner_[i] == rank_) part[i] = grad_sumsq(params_[i].second);
  const auto t_comm = Clock::now();
  dist::allreduce_sum(part.data(), part.size());
  res_.comm_seconds += seconds_since(t_comm);
  double sumsq = 0;
  for (double p : part) sumsq += p;
  return std::sqrt(sumsq);
}

std::string Trainer::first_non_finite_share() {
  uint64_t first = UINT64_MAX;
  for (size_t i = 0; i < params_.size() && first == UINT64_MAX; i++)
    if (owner_[i] == rank_ && !std::isfinite(grad_sumsq(params_[i].second))) first = i;
  dist::allreduce_min(&first, 1);
  return first < params_.size() ? params_[first].first : "?";
}

bool Trainer::stop_between_micro_steps() {
  double stop = opt_.stop.requested() ? 1 : 0;
  if (multi_) {  // every rank abandons the step at the same micro-batch, or none does
    const auto t_comm = Clock::now();
    dist::allreduce_sum(&stop, 1);
    res_.comm_seconds += seconds_since(t_comm);
  }
  return stop > 0;
}

void Trainer::evaluate(nlohmann::json& record) {
  const int64_t B = cfg_.batch_size, T = cfg_.model.block_size;
  const Autocast autocast(precision_);  // evaluated as trained, as nanoGPT's estimate_loss under its autocast context
  const double vl = evaluate_windows(model_, corpus_.val, val_windows_, T, B, multi_);
  const double tl = evaluate_windows(model_, corpus_.train, train_windows_, T, B, multi_);
  record["val_loss"] = vl;
  record["train_loss_eval"] = tl;
  res_.val_loss = vl;
  if (!quiet_)
    std::printf("%sstep %ld: train loss %.4f, val loss %.4f\n", opt_.label.c_str(), static_cast<long>(st_.step), tl, vl);
}

void Trainer::save() {
  if (multi_) {  // rank 0 refuses to write non-finite weights: every rank must stop with it
    std::string err;
    try {
      check_savable(dir_.checkpoint(), model_, optim_.get(), "step " + std::to_string(st_.step));
    } catch (const Error& e) {
      err = e.what();
    }
    dist::agree(err);
  }
  const std::vector<std::string> streams =
      dist::gather(std::to_string(model_.dropout_rng().state()) + "\n" + sampler_->state());
  // sharded: rank 0 writes each parameter's state as its rank sends it, one tensor at a time
  OptimStateSource sharded;
  if (narrowed_)  // the frozen weights widened one tensor at a time
    sharded.weight = [this](const Var& p, const Shape&) { return narrowed_->value(p); };
  if (!owner_.empty()) {
    for (const auto& [name, p] : params_) sharded.names.push_back(name);
    sharded.fetch = [this](const std::string& key, size_t i) { return exchange_state(key, i); };
    if (resident_)  // shard parameters (never with narrowed_): a block's weights from their keeper, one tensor at a time
      sharded.weight = [this](const Var& p, const Shape& shape) { return held_by(p) > 0 ? exchange_weight(p, shape) : p.val(); };
    if (!lead_) {  // the same exchanges, in the order rank 0's writer makes them
      if (resident_) {
        const auto params = model_.named_parameters();
        const auto shapes = parameter_shapes(model_.config());
        for (size_t i = 0; i < params.size(); i++)
          if (held_by(params[i].second) > 0) exchange_weight(params[i].second, shapes[i].second);
      }
      for (const std::string& key : optim_->state_keys())
        for (size_t i = 0; i < params_.size(); i++) exchange_state(key, i);
      return;
    }
  }
  if (!lead_) return;
  st_.dropout_rng = model_.dropout_rng().state();
  st_.sampler_state = sampler_->state();
  st_.world_size = world_;
  st_.rank_dropout_rngs.clear();
  st_.rank_sampler_states.clear();
  for (int r = 1; r < world_; r++) {
    const size_t nl = streams[r].find('\n');
    st_.rank_dropout_rngs.push_back(std::stoull(streams[r].substr(0, nl)));
    st_.rank_sampler_states.push_back(streams[r].substr(nl + 1));
  }
  // unsharded, the state is the optimizer's own (no fetch)
  save_training_checkpoint(dir_.checkpoint(), model_, *optim_, cfg_, st_, corpus_.tok, sharded.fetch || sharded.weight ? &sharded : nullptr);
}

void Trainer::print_progress(const Step& s, double tokens_per_s, int64_t first_step, bool last) {
  const double done = static_cast<double>(st_.step - first_step);
  const double eta = done > 0 ? seconds_since(t_start_) / done * (cfg_.max_iters - st_.step) : 0;
  std::string comm;
  if (multi_) {
    char b[48];
    std::snprintf(b, sizeof b, " | all-reduce %.0f%%", 100.0 * res_.comm_seconds / seconds_since(t_start_));
    comm = b;
  }
  std::string kd;  // " (distill K, attention A)", the terms a distilled run has
  for (const auto& [name, v] : {std::pair{"distill", s.distill}, std::pair{"attention", s.distill_attention}}) {
    if (v < 0) continue;
    char b[40];
    std::snprintf(b, sizeof b, "%s%s %.4f", kd.empty() ? " (" : ", ", name, v);
    kd += b;
  }
  if (!kd.empty()) kd += ")";
  const double model_flops = tokens_per_s * train_flops_;
  std::printf("%sstep %ld/%ld | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%% of sgemm, %.1f%% of CPU%s | ETA %s\n",
              opt_.label.c_str(), static_cast<long>(st_.step), static_cast<long>(cfg_.max_iters), s.loss, kd.c_str(), s.lr,
              tokens_per_s, 100.0 * model_flops / peak_flops_, 100.0 * model_flops / cpu_peak_flops_, comm.c_str(),
              fmt_duration(eta).c_str());
  if (res_.val_loss_full >= 0 && last)
    std::printf("%sstep %ld: val loss on %s %.4f\n", opt_.label.c_str(), static_cast<long>(st_.step),
                split_eval_what(cfg_.final_eval_tokens, static_cast<int64_t>(corpus_.val.size()), cfg_.model.block_size).c_str(),
                res_.val_loss_full);
  std::fflush(stdout);
}

TrainResult Trainer::run() {
  if (!opt_.resume && cfg_.max_iters > 0) {
    nlohmann::json rec{{"step", 0}};
    evaluate(rec);
    if (lead_) dir_.log(rec);
  }
  std::vector<double> rates;
  auto t_log = Clock::now();
  int64_t steps_since_log = 0;
  const int64_t first_step = st_.step;
  while (st_.step < cfg_.max_iters) {
    const Step s = step();
    if (s.abandoned) {  // nothing of the partial step to log: the last completed one is saved
      save();
      res_.interrupted = true;
      if (!quiet_)
        std::printf("%sstopped by signal at step %ld (step %ld abandoned part-way); checkpoint written to %s\n",
                    opt_.label.c_str(), static_cast<long>(st_.step), static_cast<long>(st_.step + 1),
                    dir_.checkpoint().c_str());
      break;
    }
    steps_since_log++;
    const bool last = st_.step == cfg_.max_iters;
    if (st_.step % cfg_.log_interval == 0 || last || s.stop || st_.step % cfg_.eval_interval == 0) {
      const double dt = seconds_since(t_log);
      const double tps = steps_since_log * tokens_per_step_ / std::max(dt, 1e-9);
      rates.push_back(tps);
      steps_since_log = 0;
      nlohmann::json rec{{"step", st_.step}, {"train_loss", s.loss}, {"lr", s.lr}, {"tokens_per_s", tps}};
      if (s.distill >= 0) rec["distill_kl"] = s.distill;
      if (s.distill_attention >= 0) rec["distill_attention"] = s.distill_attention;
      if (st_.step % cfg_.eval_interval == 0 || last) evaluate(rec);
      if (last && opt_.final_eval) {  // the figure to quote: every val position once, as `tapelm eval` (or final_eval_tokens)
        const Autocast autocast(precision_);
        res_.val_loss_full = evaluate_split(model_, corpus_.val, multi_, cfg_.final_eval_tokens);
        rec["val_loss_full"] = res_.val_loss_full;
      }
      if (lead_) dir_.log(rec);
      if (!quiet_) print_progress(s, tps, first_step, last);
    }
    if (st_.step % cfg_.checkpoint_interval == 0 || last || s.stop) {
      const auto t_save = Clock::now();
      save();
      t_log += Clock::now() - t_save;  // not the steps' time (a no-op after a logged step: reset below)
    }
    // tokens/s is the steps' own rate: the clock starts again after an evaluation and a log line,
    // and a checkpoint's time is left out (the first step after an evaluation of the val split was
    // logged at a fraction of the others' rate)
    if (steps_since_log == 0) t_log = Clock::now();
    if (s.stop && !last) {
      res_.interrupted = true;
      if (!quiet_)
        std::printf("%sstopped by signal at step %ld; checkpoint written to %s\n", opt_.label.c_str(),
                    static_cast<long>(st_.step), dir_.checkpoint().c_str());
      break;
    }
  }
  bool have_checkpoint = fs::exists(dir_.checkpoint());
  if (multi_) {  // only rank 0 need see the file
    double h = have_checkpoint && lead_ ? 1 : 0;
    dist::allreduce_sum(&h, 1);
    have_checkpoint = h > 0;
  }
  if (st_.step >= cfg_.max_iters && !have_checkpoint) save();  // max_iters = 0: weights as they start
  TrainResult res = res_;
  res.steps = st_.step;
  res.seconds = seconds_since(t_start_);
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    res.tokens_per_s = rates[rates.size() / 2];
  }
  return res;
}

TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt) {
  return Trainer(cfg, corpus, out_dir, opt).run();
}

}  // namespace tapelm
