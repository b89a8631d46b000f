#include "comm/bootstrap.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/core/error.h"

namespace ampdist {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // The Reducer's bucket all-reduces are MPI_Iallreduce, which Open MPI runs through libnbc. Its default algorithm
  // choice reached 0.47-1.16x (mostly about 0.6x) the busbw of a blocking MPI_Allreduce of the same bytes at
  // 1-256 MiB on 2 ranks (bench/bench_allreduce.cc, two runs); the ring algorithm reached 0.90-3.0x in runs
  // alternated with those. Buckets are megabytes, where the ring is bandwidth-optimal, so it is the default here;
  // a value the user set wins.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
  // A process started without a launcher (MPI's singleton mode) is a world of one. By default Open MPI 4 forks an
  // orted for it, which outlives the process: it removes the session directory /tmp/ompi.<host>.<uid> some 30 ms
  // after the process has exited (seen with strace -f). An mpirun started in that window has just found the
  // directory present and then fails to create its own subdirectory in it ("ORTE_ERROR_LOG: Error in file
  // session_dir.c at line 107", orte_init fails), as after `ampdist prepare-text ...; mpirun ... ampdist train`.
  // An isolated singleton forks nothing and removes its (empty) session directories itself before it exits. It
  // cannot MPI_Comm_spawn, which ampdist never does. Only singleton start-up reads this variable.
  setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed");
  owns_ = true;
  if (provided < MPI_THREAD_FUNNELED) throw Error("the MPI library does not provide MPI_THREAD_FUNNELED");
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

void broadcast_from_rank0(MPI_Comm comm, void* data, size_t bytes, const std::function<void(void*)>& produce,
                          double timeout_s, const std::string& what) {
  // [int32 status | int32 message length | message (kMessage bytes) | data]
  constexpr size_t kMessage = 1024;
  std::vector<char> buf(8 + kMessage + bytes, 0);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int32_t status = 0;
  std::string message;
  if (rank == 0) {
    try {
      produce(buf.data() + 8 + kMessage);
    } catch (const std::exception& e) {
      status = 1;
      message = e.what();
    }
    message.resize(std::min(message.size(), kMessage));
    const int32_t len = static_cast<int32_t>(message.size());
    std::memcpy(buf.data(), &status, 4);
    std::memcpy(buf.data() + 4, &len, 4);
    std::memcpy(buf.data() + 8, message.data(), message.size());
  }
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibcast(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, 0, comm, &req) != MPI_SUCCESS)
    throw Error(what + ": MPI_Ibcast failed");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "ampdist: error: [rank %d] %s did not complete within %.0f s (comm.timeout_s): rank 0 did not "
                   "send it; ending the job\n",
                   rank, what.c_str(), timeout_s);
      std::fflush(stderr);
      MPI_Abort(comm, 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (rank != 0) {
    int32_t len = 0;
    std::memcpy(&status, buf.data(), 4);
    std::memcpy(&len, buf.data() + 4, 4);
    message.assign(buf.data() + 8, static_cast<size_t>(std::clamp<int32_t>(len, 0, kMessage)));
  }
  if (status != 0) {
    Error e(rank == 0 ? message : what + ": rank 0 failed: " + message);
    if (rank != 0) e.set_secondary();
    throw e;
  }
  std::memcpy(data, buf.data() + 8 + kMessage, bytes);
}

NodeRank node_rank(MPI_Comm comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodeRank r;
  MPI_Comm_rank(node, &r.local_rank);
  MPI_Comm_size(node, &r.local_size);
  MPI_Comm_free(&node);
  return r;
}

std::string processor_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, len);
}

}  // namespace ampdist
