/* What OpenMPI's MPI_Allreduce allocates beside the buffer it reduces: every rank fills COUNT
 * floats, records its peak RSS, all-reduces them in place (as the trainer's flat gradient buffer
 * is) and prints how much the peak grew. train_config.cpp's estimate counts the result (B/2 for a
 * buffer of B bytes, measured at N = 2, 3 and 4 ranks with OpenMPI 4.1 on Debian 12).
 *
 *   mpicc -O2 bench/allreduce_memory.c -o /tmp/allreduce_memory
 *   mpirun --allow-run-as-root --oversubscribe -np 2 /tmp/allreduce_memory 100000000
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const size_t n = argc > 1 ? (size_t)atol(argv[1]) : 100000000;
  float* buf = malloc(n * sizeof(float));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(buf, 1, n * sizeof(float));
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  const long before = u.ru_maxrss;
  MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  getrusage(RUSAGE_SELF, &u);
  printf("rank %d: buffer %.0f MB; peak RSS %.0f MB before the all-reduce, %.0f MB after (+%.0f MB)\n", rank, n * 4 / 1e6,
         before * 1024 / 1e6, u.ru_maxrss * 1024 / 1e6, (u.ru_maxrss - before) * 1024 / 1e6);
  free(buf);
  MPI_Finalize();
  return 0;
}
