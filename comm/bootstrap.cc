#include "comm/bootstrap.h"

#include <cstdlib>

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

std::string processor_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, len);
}

}  // namespace ampdist
