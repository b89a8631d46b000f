#include "launch/rank_env.h"

#include <cstdlib>
#include <string>

namespace ampdist {
namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

std::string describe_launcher() {
  if (!env("SLURM_JOB_ID").empty() && !env("SLURM_PROCID").empty()) {
    return "SLURM job " + env("SLURM_JOB_ID") + " step " + env("SLURM_STEP_ID") + " on " + env("SLURMD_NODENAME") +
           " (SLURM_NTASKS=" + env("SLURM_NTASKS") + ", SLURM_NNODES=" + env("SLURM_NNODES") +
           ", SLURM_LOCALID=" + env("SLURM_LOCALID") + ")";
  }
  if (!env("OMPI_COMM_WORLD_SIZE").empty()) return "mpirun (OMPI_COMM_WORLD_SIZE=" + env("OMPI_COMM_WORLD_SIZE") + ")";
  return "single process";
}

std::string launcher_mismatch(int mpi_world_size) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    const std::string v = env(var);
    if (!v.empty() && std::atoi(v.c_str()) != mpi_world_size)
      return std::string(var) + "=" + v + " but MPI reports a world of " + std::to_string(mpi_world_size) +
             ": the launcher and the MPI library disagree (with srun, try --mpi=pmix)";
  }
  return "";
}

}  // namespace ampdist
