#include "train/stop.h"

#include <csignal>

namespace tapelm {

namespace {
// A signal handler may only touch lock-free atomics: it reaches the token's flag through this.
std::atomic<std::atomic<bool>*> g_signal_flag{nullptr};
extern "C" void on_stop_signal(int) {
  if (std::atomic<bool>* f = g_signal_flag.load()) f->store(true);
}
}  // namespace

StopToken signal_stop_token() {
  static const StopToken token = [] {
    StopToken t;
    g_signal_flag = t.flag_.get();
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
    return t;
  }();
  return token;
}

}  // namespace tapelm
