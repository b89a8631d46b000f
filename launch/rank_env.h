// What launched this process, read from the launcher's environment (for the log; ranks come from MPI itself).
#pragma once

#include <string>

namespace ampdist {

// "mpirun (OMPI_COMM_WORLD_SIZE=2)", "SLURM job 812 step 0 on node03 (SLURM_NTASKS=8, SLURM_LOCALID=1)",
// or "single process".
std::string describe_launcher();

// A warning when the launcher's idea of the world size differs from MPI's (e.g. srun without --mpi=pmix starting N
// singletons), or "" when they agree or no launcher variables are set.
std::string launcher_mismatch(int mpi_world_size);

}  // namespace ampdist
