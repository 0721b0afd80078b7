#pragma once
// How the OpenMP threads wait between parallel regions, chosen before the program does any work.
//
// libgomp's default, when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, spins 300,000
// pause instructions at every barrier and at the end of every region before it sleeps: 5.6 ms on
// a Zen 5 core, longer than a scheduler time slice. On a quiet machine that costs nothing; beside
// another busy program it is ruinous, because a thread spins away its core while the sibling it
// waits for is descheduled (two tapelm processes sharing 2 cores trained `baby` at 0.16 of one
// process's quiet speed between them; bench/CONTENTION.md). tapelm therefore sets GOMP_SPINCOUNT
// to the count that spins about kSpinMicros on this CPU (a pause costs 3 ns on some cores and 45
// on others, so the count is measured, not fixed) and then sleeps. libgomp reads its variables
// once, when it is loaded, and the C library's start-up discards changes made before it, so the
// start-up guard (guard_blas_core, autograd/cpu.h) sets the variable and re-executes the program
// once, as it does for OpenBLAS's core. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left
// alone. The setting changes only when threads sleep, never what they compute.
//
// Beside another busy program a waiting thread should not spin at all: the sibling it waits for
// shares a core with that program, and the sooner the waiting thread's core is idle, the sooner
// the scheduler moves the sibling there. So when other tasks are running as tapelm starts
// (others_running_at_start) and they and tapelm's threads do not fit the cpus it may use (its
// affinity, usable_cpus), or when its threads alone outnumber those cpus, the count is 0:
// sleep at once, what OMP_WAIT_POLICY=passive does. On a quiet machine sleeping at once costs
// 4-15 % of a training step of short kernels and a third of a small model's decoding step (the
// time to wake a thread), which is why it is not the choice there (bench/CONTENTION.md). The load
// is read once: libgomp cannot change its count later, and a run's wait, unlike its thread count,
// changes none of its bits.
#include <string>

namespace tapelm {

/// How long a waiting thread spins before it sleeps, when tapelm chooses (microseconds).
constexpr double kSpinMicros = 20.0;

/// The variable that records tapelm's choice across the re-execution (and in child processes).
constexpr const char* kSpinSetVar = "TAPELM_GOMP_SPINCOUNT";

/// The spin count for a target time, given one spin-loop iteration's cost; clamped to
/// [100, 1000000] (1000 when the cost is unknown).
long spin_count_for(double micros, double ns_per_spin);

/// One iteration of libgomp's spin loop (a relaxed load of the flag, then the pause hint), timed:
/// the best of several short runs, in nanoseconds.
double measure_ns_per_spin();

/// Tasks running on the machine other than the caller through the first 200 ms: the least of
/// /proc/stat's procs_running less one over five readings 50 ms apart (a task that runs for an
/// instant is not a load), stopping at the first reading of 0; -1 when /proc/stat cannot be read.
int others_running_at_start();

/// The spin count for a target time and a spin's cost (spin_count_for) while the other running
/// tasks and this program's threads fit its cpus; 0 (sleep at once) when they do not, which
/// includes more threads than cpus with no other task. The running tasks are the machine's (of
/// `online` cpus), so a program bound to fewer counts their share on its `cpus`, rounded; an
/// unknown load (-1) counts as none.
long spin_count_for_load(double micros, double ns_per_spin, int others_running, int threads, int cpus, int online);

/// The cpus this thread may run on (its affinity mask, as `taskset` or a container's cpuset sets
/// it, and as libgomp counts them for its default team); the machine's online cpus when the mask
/// cannot be read. Read without touching libgomp, which must not load before GOMP_SPINCOUNT is set.
int usable_cpus();

/// The thread count a command line asks for (`--threads N` or `--threads=N`), also when it is more
/// than cpus (tapelm runs that many), or cpus when it asks for none or for 0 (all cores).
int planned_threads(char** argv, int cpus);

/// The GOMP_SPINCOUNT tapelm sets at start-up (from this CPU's spin cost, the machine's load and
/// the threads argv asks for), or "" when OMP_WAIT_POLICY or GOMP_SPINCOUNT is already set (the
/// user's choice, or tapelm's after its re-execution).
std::string omp_spin_to_set(char** argv);

/// One line for `inspect --system`, `bench` and `train`, read from the environment in force, e.g.
/// "spin 1063 pauses (about 20 us), then sleep: GOMP_SPINCOUNT set by tapelm", or, when they do
/// not fit, "sleep at once (its threads and the programs running at start-up outnumber its cpus):
/// GOMP_SPINCOUNT=0 set by tapelm".
std::string omp_wait_description();

}  // namespace tapelm
