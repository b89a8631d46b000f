// Process bootstrap: MPI start-up and shut-down, and where this rank runs.
//
// Ranks and local ranks always come from MPI itself (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) for the node), so
// mpirun, srun and a lone process (a world of one, MPI's singleton mode) all work the same way.
#pragma once

#include <mpi.h>

#include <string>

namespace ampdist {

class MpiRuntime {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED): only the main thread calls MPI (the loader and watchdog threads never
  // do). A no-op when MPI is already initialised, in which case the destructor leaves it running too. Before
  // initialising, sets OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 (ring) unless the environment has a value: see
  // bootstrap.cc for the measurement behind it.
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

// This process's host name (MPI_Get_processor_name).
std::string processor_name();

}  // namespace ampdist
