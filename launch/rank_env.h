// What launched this process, and whether the launcher agrees with MPI about where this rank is.
//
// Ranks and local ranks always come from MPI itself: MPI_Comm_rank/size of MPI_COMM_WORLD, and the rank/size within
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) for the node. The launchers also export their own idea of it:
//   mpirun (OpenMPI): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   srun (SLURM):     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (per task of a job step)
//   PMIx servers:     PMIX_RANK
// A job whose launcher and MPI library disagree (srun without --mpi=pmix starting N separate worlds of one, an
// mpirun of another MPI installation, a wrapper that rewrote the variables) would train N independent copies or
// deadlock; check_rank_env finds it before any work starts.
#pragma once

#include <mpi.h>

#include <map>
#include <string>

namespace ampdist {

// The launcher variables above (and SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME), as set when the process started.
// Read it before MPI_Init, which may add variables of its own. A variable that is not set is absent from the map.
struct LauncherEnv {
  std::map<std::string, std::string> vars;
  bool has(const std::string& name) const { return vars.count(name) != 0; }
  const std::string& get(const std::string& name) const;  // "" when absent
};
LauncherEnv read_launcher_env();

// Where MPI places this rank. local_rank/local_size: within this node (MPI_COMM_TYPE_SHARED).
struct MpiPlacement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string host;  // MPI_Get_processor_name
};
// Collective over `comm` (MPI_Comm_split_type): every rank of it must call this.
MpiPlacement mpi_placement(MPI_Comm comm);

// The first disagreement between `env` and `mpi`, as one line naming each variable, its value and MPI's value, or ""
// when they agree. Rules:
//  - OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} and PMIX_RANK, when set, must equal MPI's rank/size/local
//    rank/local size.
//  - SLURM_{PROCID,NTASKS,LOCALID} are per-rank only when srun started this process itself; under mpirun
//    (OMPI_COMM_WORLD_SIZE set) they describe the allocation or mpirun's own daemons, and are not compared.
//    With srun: SLURM_PROCID must equal the rank, SLURM_NTASKS the world size and SLURM_LOCALID the local rank,
//    except that a world of one outside a job step (SLURM_STEP_ID unset: a batch script or salloc shell without
//    srun) is legitimate and only gets launch_hint's warning.
// A value that is not a non-negative integer is reported as a disagreement too.
std::string check_rank_env(const LauncherEnv& env, const MpiPlacement& mpi);

// A warning for a job that looks started without the launcher it was meant for (SLURM_NTASKS > 1 but a world of one
// outside an srun step), or "".
std::string launch_hint(const LauncherEnv& env, int mpi_world_size);

// "mpirun (OMPI_COMM_WORLD_SIZE=2)", "SLURM job 812 step 0 on node03 (SLURM_NTASKS=8, SLURM_LOCALID=1)",
// or "single process". Reads the current environment.
std::string describe_launcher();

// launch_hint() for the current environment (the train command prints it as a warning).
std::string launcher_mismatch(int mpi_world_size);

// A warning when a rank runs more compute threads than the CPUs its affinity mask allows (`cpus`, from
// kernels::available_cpus()): the threads would take turns on those CPUs. Names the usual cause (mpirun binds each
// rank to one core when it starts 2 or fewer ranks) and its fix. "" when threads <= cpus.
std::string thread_binding_hint(int threads, int cpus);

}  // namespace ampdist
