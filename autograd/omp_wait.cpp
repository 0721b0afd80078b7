#include "autograd/omp_wait.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tapelm {

namespace {
double now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e9 * static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec);
}
bool given(const char* v) { return v && *v; }
int online_cpus() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }
}  // namespace

long spin_count_for(double micros, double ns_per_spin) {
  if (!(ns_per_spin > 0) || !std::isfinite(ns_per_spin)) return 1000;
  const double n = std::round(micros * 1e3 / ns_per_spin);
  return static_cast<long>(std::clamp(n, 100.0, 1e6));
}

double measure_ns_per_spin() {
  static int flag = 0;
  constexpr int kIters = 2000;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {  // a run the scheduler interrupted does not count
    const double t0 = now_ns();
    for (int i = 0; i < kIters; i++) {
      if (__atomic_load_n(&flag, __ATOMIC_RELAXED)) break;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    best = std::min(best, (now_ns() - t0) / kIters);
  }
  return best;
}

int others_running_at_start() {
  // At most five readings 50 ms apart: a program that runs through all of them is a load; one
  // starting beside tapelm (the other end of a shell pipeline, say) is not. The first reading
  // that sees no other task ends the count, so a quiet machine pays for one read.
  int least = 100000;
  for (int i = 0; i < 5 && least > 0; i++) {
    if (i) {
      const timespec wait{0, 50000000};
      nanosleep(&wait, nullptr);
    }
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[256];
    long running = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "procs_running ", 14) == 0) {
        running = std::strtol(line + 14, nullptr, 10);
        break;
      }
    std::fclose(f);
    if (running < 1) return -1;
    least = std::min(least, static_cast<int>(std::min(running - 1, 100000L)));
  }
  return least;
}

long spin_count_for_load(double micros, double ns_per_spin, int others_running, int threads, int cpus, int online) {
  // An unknown load (-1) counts as none. The load is the machine's, so a process bound to some of
  // its cpus counts the share of it on them, were the tasks spread evenly: 1 task on a 64-cpu
  // machine is none on 4 of them, 10 are 1. More threads than cpus do not fit even alone.
  const double others = std::max(others_running, 0) * (online > cpus ? static_cast<double>(cpus) / online : 1.0);
  const bool shared = std::lround(others) + threads > cpus;
  return shared ? 0 : spin_count_for(micros, ns_per_spin);
}

int planned_threads(char** argv, int cpus) {
  long n = 0;
  for (int i = 1; argv && argv[i]; i++) {
    if (std::strcmp(argv[i], "--threads") == 0 && argv[i + 1]) {
      n = std::strtol(argv[i + 1], nullptr, 10);
      break;
    }
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      n = std::strtol(argv[i] + 10, nullptr, 10);
      break;
    }
  }
  // main refuses more than it can run (max_threads, train/train_config.h); the bound here only
  // keeps a stray value in an int
  return n >= 1 && n <= 100000 ? static_cast<int>(n) : cpus;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
  return online_cpus();
}

std::string omp_spin_to_set(char** argv) {
  if (given(std::getenv("OMP_WAIT_POLICY")) || given(std::getenv("GOMP_SPINCOUNT"))) return "";
  const int cpus = usable_cpus(), online = online_cpus();
  const int threads = planned_threads(argv, cpus);
  // one thread never waits for another, and more threads than cpus do not fit: no load to read
  const int others = threads > 1 && threads <= cpus ? others_running_at_start() : 0;
  return std::to_string(spin_count_for_load(kSpinMicros, measure_ns_per_spin(), others, threads, cpus, online));
}

std::string omp_wait_description() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* marker = std::getenv(kSpinSetVar);
  char b[256];
  if (!given(policy) && given(spin) && given(marker) && std::strcmp(spin, marker) == 0) {
    if (std::strcmp(spin, "0") == 0)
      return "sleep at once (its threads and the programs running at start-up outnumber its cpus): GOMP_SPINCOUNT=0 set by tapelm";
    const double ns = measure_ns_per_spin();
    std::snprintf(b, sizeof b, "spin %s pauses (about %.0f us), then sleep: GOMP_SPINCOUNT set by tapelm", spin,
                  std::strtod(spin, nullptr) * ns / 1e3);
    return b;
  }
  if (!given(policy) && !given(spin)) return "libgomp's default (spin 300000 pauses, then sleep)";
  std::string s = "as the environment sets it:";
  if (given(policy)) s += std::string(" OMP_WAIT_POLICY=") + policy;
  if (given(spin)) s += std::string(" GOMP_SPINCOUNT=") + spin;
  return s;
}

}  // namespace tapelm
