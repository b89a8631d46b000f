// Process bootstrap: MPI start-up and shut-down, and where this rank runs.
//
// Ranks and local ranks always come from MPI itself (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) for the node), so
// mpirun, srun and a lone process (a world of one, MPI's singleton mode) all work the same way.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>

namespace ampdist {

class MpiRuntime {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED): only the main thread calls MPI (the loader and watchdog threads never
  // do). A no-op when MPI is already initialised, in which case the destructor leaves it running too. Before
  // initialising, sets OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 (ring) and, for a process started without a
  // launcher, OMPI_MCA_ess_singleton_isolated=1 (no orted left behind), each unless the environment has a value: see
  // bootstrap.cc for the measurement and the failure behind them.
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

// Rank 0 of `comm` runs `produce`, which fills the `bytes` bytes at `data` (an NCCL unique id, say) and may throw;
// one broadcast then carries a status word, rank 0's error message and the bytes to every rank. So a failure on
// rank 0 reaches every rank as an Error (exit code 1; on ranks other than 0 marked secondary, since they only
// heard of it) instead of leaving them waiting in MPI_Bcast for bytes that never come. Rank 0 always reaches the
// broadcast, whatever `produce` did.
// The broadcast is MPI_Ibcast polled every millisecond for at most timeout_s seconds (comm.timeout_s); past that
// (rank 0 is stuck in `produce`, or a rank never arrived) this rank prints one line naming `what` and the limit and
// ends the job with MPI_Abort(comm, 1), since no collective can reach a rank that does not answer.
// Collective over `comm`: every rank calls it once, with the same bytes and what.
void broadcast_from_rank0(MPI_Comm comm, void* data, size_t bytes, const std::function<void(void*)>& produce,
                          double timeout_s, const std::string& what);

// This process's rank and the number of ranks on its node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) of `comm`).
// Collective over `comm`.
struct NodeRank {
  int local_rank = 0, local_size = 1;
};
NodeRank node_rank(MPI_Comm comm);

// This process's host name (MPI_Get_processor_name).
std::string processor_name();

}  // namespace ampdist
