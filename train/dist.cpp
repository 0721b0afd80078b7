#include "train/dist.h"

// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "autograd/splitmix.h"

namespace tapelm::dist {

namespace {
int g_rank = 0, g_size = 1;
bool g_initialised = false;  // by us

// MPI counts are ints: larger buffers go in pieces.
constexpr size_t kChunk = static_cast<size_t>(INT_MAX) / 2;

template <class T>
void allreduce(T* buf, size_t n, MPI_Datatype type, MPI_Op op) {
  if (g_size == 1) return;
  for (size_t off = 0; off < n; off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - off));
    MPI_Allreduce(MPI_IN_PLACE, buf + off, count, type, op, MPI_COMM_WORLD);
  }
}

uint64_t mix(uint64_t z) { return splitmix64(z); }
}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

Session::Session(int* argc, char*** argv) {
  if (!launched_by_mpi()) return;
  int done = 0;
  MPI_Initialized(&done);
  if (!done) {
    int provided = 0;
    // Only the main thread calls MPI; OpenMP threads work between the calls.
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    g_initialised = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  // A launcher this MPI library cannot talk to (MPICH's, say) would start N separate worlds of
  // one, each training alone and writing the same files: refuse instead.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* n = std::getenv(v);
    if (n && std::atoi(n) > 1 && g_size == 1) {
      std::fprintf(stderr, "tapelm: error: started as one of %s processes (%s) but MPI sees a world of 1: "
                           "launch with this OpenMPI's mpirun\n", n, v);
      if (g_initialised) MPI_Finalize();
      std::exit(1);
    }
  }
}

Session::~Session() {
  if (!g_initialised) return;
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
  g_initialised = false;
  g_rank = 0;
  g_size = 1;
}

int rank() { return g_rank; }
int size() { return g_size; }

std::string rank_prefix() {
  return g_size > 1 ? "rank " + std::to_string(g_rank) + " of " + std::to_string(g_size) + ": " : "";
}

void allreduce_sum(float* buf, size_t n) { allreduce(buf, n, MPI_FLOAT, MPI_SUM); }
void allreduce_sum(double* buf, size_t n) { allreduce(buf, n, MPI_DOUBLE, MPI_SUM); }
void allreduce_min(uint64_t* buf, size_t n) { allreduce(buf, n, MPI_UINT64_T, MPI_MIN); }
void allreduce_max(uint64_t* buf, size_t n) { allreduce(buf, n, MPI_UINT64_T, MPI_MAX); }

void reduce_sum(float* buf, size_t n, int root) {
  if (g_size == 1) return;
  for (size_t off = 0; off < n; off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - off));
    if (g_rank == root)
      MPI_Reduce(MPI_IN_PLACE, buf + off, count, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
    else
      MPI_Reduce(buf + off, nullptr, count, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
  }
}

Pending broadcast_start(float* buf, size_t n, int root) {
  Pending p;
  if (g_size == 1) return p;
  auto reqs = std::make_shared<std::vector<MPI_Request>>();
  for (size_t off = 0; off < n; off += kChunk) {
    MPI_Request r;
    MPI_Ibcast(buf + off, static_cast<int>(std::min(kChunk, n - off)), MPI_FLOAT, root, MPI_COMM_WORLD, &r);
    reqs->push_back(r);
  }
  p.requests_ = reqs;
  return p;
}

void Pending::wait() {
  if (!requests_) return;
  auto& reqs = *static_cast<std::vector<MPI_Request>*>(requests_.get());
  MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  requests_.reset();
}

void broadcast(float* buf, size_t n, int root) {
  if (g_size == 1) return;
  for (size_t off = 0; off < n; off += kChunk)
    MPI_Bcast(buf + off, static_cast<int>(std::min(kChunk, n - off)), MPI_FLOAT, root, MPI_COMM_WORLD);
}

void broadcast(uint16_t* buf, size_t n, int root) {
  if (g_size == 1) return;
  for (size_t off = 0; off < n; off += kChunk)
    MPI_Bcast(buf + off, static_cast<int>(std::min(kChunk, n - off)), MPI_UINT16_T, root, MPI_COMM_WORLD);
}

void broadcast(std::string& s) {
  if (g_size == 1) return;
  uint64_t len = s.size();
  MPI_Bcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  s.resize(len);
  for (size_t off = 0; off < len; off += kChunk)
    MPI_Bcast(s.data() + off, static_cast<int>(std::min<size_t>(kChunk, len - off)), MPI_CHAR, 0, MPI_COMM_WORLD);
}

std::vector<std::string> gather(const std::string& mine) {
  if (g_size == 1) return {mine};
  if (mine.size() > kChunk) throw std::length_error("dist::gather: a rank's state exceeds 1 GiB");
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(g_rank == 0 ? g_size : 0), offs(lens.size());
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (g_rank == 0) {
    size_t total = 0;
    for (int r = 0; r < g_size; r++) {
      offs[r] = static_cast<int>(total);
      total += static_cast<size_t>(lens[r]);
    }
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < static_cast<int>(lens.size()); r++) out.push_back(all.substr(offs[r], lens[r]));
  return out;
}

void barrier_sleeping() {
  if (g_size == 1) return;
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void agree(const std::string& error) {
  if (g_size == 1) return;
  int first = error.empty() ? g_size : g_rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == g_size) return;
  if (first == g_rank) throw AgreedError(rank_prefix() + error, true);
  throw AgreedError("another rank failed", false);
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

uint64_t checksum(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x6A09E667F3BCC908ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ mix(w)) * 0x100000001B3ull;
  }
  for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001B3ull;
  return mix(h);
}

uint64_t rank_seed(uint64_t seed, int rank, uint64_t epoch) {
  if (rank == 0 && epoch == 0) return seed;
  return mix(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1) + 0xD1B54A32D192ED03ull * epoch);
}

}  // namespace tapelm::dist
