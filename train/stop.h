#pragma once
// Asking a run to stop after its current step: a token passed to whatever runs steps (the trainer,
// uptraining, the sweep), so that none of them polls a global.
#include <atomic>
#include <memory>

namespace tapelm {

class StopToken;
StopToken signal_stop_token();

/// A shared stop flag. Copies share one flag; a default-constructed token is never requested
/// unless request() is called on it or a copy.
class StopToken {
 public:
  StopToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  /// Has anyone asked to stop?
  bool requested() const { return flag_->load(std::memory_order_relaxed); }
  /// Asks every holder of this token to stop after its current step.
  void request() const { flag_->store(true, std::memory_order_relaxed); }
  /// Forgets a request (after the caller has acted on it).
  void clear() const { flag_->store(false, std::memory_order_relaxed); }

 private:
  friend StopToken signal_stop_token();
  std::shared_ptr<std::atomic<bool>> flag_;
};

/// The token that SIGINT, SIGTERM and SIGUSR1 request; the first call installs their handler.
/// (mpirun forwards SIGUSR1 to every rank without ending the job; its Ctrl-C sends SIGTERM and,
/// one second later, SIGKILL: too soon for a large model to finish its step and save.)
StopToken signal_stop_token();

}  // namespace tapelm
