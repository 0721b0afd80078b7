#pragma once
// Data-parallel training over MPI: the few collectives the trainer needs, on MPI_COMM_WORLD.
//
// MPI is only initialised when an MPI launcher started the process (mpirun sets
// OMPI_COMM_WORLD_SIZE, a PMIx launcher such as srun sets PMIX_RANK). Started any other way,
// tapelm is one process of rank 0 in a world of 1 and no MPI function is ever called, so it
// behaves exactly as a build without MPI would. Every collective below is a no-op in a world of 1.
//
// Collectives must be called by every rank in the same order. Errors that every rank sees alike
// (a NaN loss, a failed setup check) are raised as AgreedError on all ranks, so the job can end
// cleanly; anything else in a multi-rank job ends it with abort_job().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/error.h"

namespace tapelm::dist {

/// An error raised on every rank at once. `print_here` is true on the one rank that should
/// report it (the rank that failed, or rank 0 when all failed alike).
struct AgreedError : Error {
  AgreedError(const std::string& what, bool print_here, ErrorKind kind = ErrorKind::train)
      : Error(kind, what), print_here(print_here) {}
  bool print_here;
};

/// Initialises MPI for the life of the object when a launcher started this process.
class Session {
 public:
  Session(int* argc, char*** argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

/// True when an MPI launcher started this process (whether or not MPI is initialised yet).
bool launched_by_mpi();
int rank();
int size();
/// More than one rank: the trainer must reduce gradients and agree on every decision.
inline bool multi() { return size() > 1; }
/// "rank R of N: " in a multi-rank job, "" otherwise: a prefix for messages.
std::string rank_prefix();

/// Sum over ranks, in place.
void allreduce_sum(float* buf, size_t n);
void allreduce_sum(double* buf, size_t n);
/// Element-wise minimum and maximum over ranks, in place (for comparing checksums).
void allreduce_min(uint64_t* buf, size_t n);
void allreduce_max(uint64_t* buf, size_t n);
/// A collective in flight (broadcast_start): no rank's buffer may change, and
/// the result may not be read, until wait() has returned. A default one
/// is done. One dropped unfinished (an exception on the way) is not waited for: the job ends
/// (abort_job) before any rank could reuse the buffers.
class Pending {
 public:
  Pending() = default;
  void wait();

 private:
  friend Pending broadcast_start(float* buf, size_t n, int root);
  std::shared_ptr<void> requests_;  // MPI's requests (train/dist.cpp alone includes mpi.h)
};
/// Sum over ranks into rank `root`'s buffer, in place (the others' buffers are left as they were).
void reduce_sum(float* buf, size_t n, int root);
/// Starts sending rank `root`'s floats to every rank (MPI_Ibcast). Every rank starts the same
/// collectives in the same order.
Pending broadcast_start(float* buf, size_t n, int root);
/// Rank `root`'s floats to every rank.
void broadcast(float* buf, size_t n, int root = 0);
/// Rank `root`'s 16-bit values (bfloat16 bits) to every rank.
void broadcast(uint16_t* buf, size_t n, int root);
/// Rank 0's string to every rank.
void broadcast(std::string& s);
/// Every rank's string, on rank 0 (indexed by rank); empty on the other ranks.
std::vector<std::string> gather(const std::string& mine);

/// Waits until every rank has come here, sleeping rather than polling (MPI_Ibarrier tested every
/// millisecond): for ranks idle while one works alone (uptrain's rank 0 converting), whose busy
/// wait in a blocking collective would take the cores that rank's threads run on.
void barrier_sleeping();

/// A collective check point: each rank passes "" or its error. If any rank failed, the lowest
/// failing rank's AgreedError carries its message (print_here) and every other rank's does not.
/// In a world of 1 it does nothing (callers rethrow the original exception instead).
void agree(const std::string& error);

/// Ends every rank of the job with this exit code (MPI_Abort); in a world of 1, std::exit.
[[noreturn]] void abort_job(int code);

/// A 64-bit checksum of raw bytes (not cryptographic; for comparing replicas).
uint64_t checksum(const void* data, size_t bytes);

/// Seed of rank `rank`'s random stream derived from the run's seed: rank 0 keeps `seed` itself,
/// so a one-process run draws what it always drew. `epoch` > 0 starts a fresh stream (a rank that
/// joins a resumed run).
uint64_t rank_seed(uint64_t seed, int rank, uint64_t epoch = 0);

}  // namespace tapelm::dist
