#include "launch/rank_env.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace ampdist {
namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A non-negative decimal integer, or -1.
long parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9) return -1;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

const char* const kLauncherVars[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",         "SLURM_NTASKS",         "SLURM_LOCALID",              "SLURM_JOB_ID",
    "SLURM_STEP_ID",        "SLURMD_NODENAME",      "PMIX_RANK",
};
}  // namespace

const std::string& LauncherEnv::get(const std::string& name) const {
  static const std::string empty;
  auto it = vars.find(name);
  return it == vars.end() ? empty : it->second;
}

LauncherEnv read_launcher_env() {
  LauncherEnv e;
  for (const char* name : kLauncherVars)
    if (const char* v = std::getenv(name)) e.vars[name] = v;
  return e;
}

MpiPlacement mpi_placement(MPI_Comm comm) {
  MpiPlacement p;
  MPI_Comm_rank(comm, &p.rank);
  MPI_Comm_size(comm, &p.world_size);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &p.local_rank);
  MPI_Comm_size(node, &p.local_size);
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  p.host.assign(name, len);
  return p;
}

std::string check_rank_env(const LauncherEnv& env, const MpiPlacement& mpi) {
  struct Expect {
    const char* var;
    int mpi_value;
    const char* what;
  };
  std::vector<Expect> expected = {
      {"OMPI_COMM_WORLD_RANK", mpi.rank, "rank"},
      {"OMPI_COMM_WORLD_SIZE", mpi.world_size, "world size"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", mpi.local_rank, "local rank"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", mpi.local_size, "local size"},
      {"PMIX_RANK", mpi.rank, "rank"},
  };
  const bool srun_started = env.has("SLURM_PROCID") && !env.has("OMPI_COMM_WORLD_SIZE");
  const bool world_of_one_outside_step = mpi.world_size == 1 && !env.has("SLURM_STEP_ID");
  if (srun_started && !world_of_one_outside_step) {
    expected.push_back({"SLURM_PROCID", mpi.rank, "rank"});
    expected.push_back({"SLURM_NTASKS", mpi.world_size, "world size"});
    expected.push_back({"SLURM_LOCALID", mpi.local_rank, "local rank"});
  }
  std::string diffs;
  for (const Expect& x : expected) {
    if (!env.has(x.var)) continue;
    const std::string& v = env.get(x.var);
    if (parse_count(v) == x.mpi_value) continue;
    if (!diffs.empty()) diffs += ", ";
    diffs += std::string(x.var) + "=" + v + " but MPI's " + x.what + " is " + std::to_string(x.mpi_value);
  }
  if (diffs.empty()) return "";
  std::string why;
  if (mpi.world_size == 1 && srun_started)
    why = "srun started separate processes that MPI did not join into one job: use srun --mpi=pmix (see srun "
          "--mpi=list), or mpirun inside the allocation";
  else if (mpi.world_size == 1)
    why = "the launcher started a job that this MPI library does not join: is ampdist built against the same MPI "
          "as the mpirun on PATH?";
  else
    why = "the launcher and the MPI library disagree about this process: a mis-launched job";
  return "rank environment on " + mpi.host + " (MPI rank " + std::to_string(mpi.rank) + " of " +
         std::to_string(mpi.world_size) + ", local rank " + std::to_string(mpi.local_rank) + " of " +
         std::to_string(mpi.local_size) + "): " + diffs + "; " + why;
}

std::string launch_hint(const LauncherEnv& env, int mpi_world_size) {
  const long ntasks = parse_count(env.get("SLURM_NTASKS"));
  if (mpi_world_size == 1 && ntasks > 1 && !env.has("SLURM_STEP_ID") && !env.has("OMPI_COMM_WORLD_SIZE"))
    return "SLURM_NTASKS=" + env.get("SLURM_NTASKS") +
           " but this is a world of 1: started without srun or mpirun? Start it with srun --mpi=pmix ampdist ... "
           "(or mpirun) to use the whole allocation";
  return "";
}

std::string describe_launcher() {
  if (!env("SLURM_JOB_ID").empty() && !env("SLURM_PROCID").empty()) {
    std::string s = "SLURM job " + env("SLURM_JOB_ID");
    if (!env("SLURM_STEP_ID").empty()) s += " step " + env("SLURM_STEP_ID");
    if (!env("SLURMD_NODENAME").empty()) s += " on " + env("SLURMD_NODENAME");
    std::string vars;
    for (const char* v : {"SLURM_NTASKS", "SLURM_NNODES", "SLURM_LOCALID"})
      if (!env(v).empty()) vars += std::string(vars.empty() ? "" : ", ") + v + "=" + env(v);
    if (!env("OMPI_COMM_WORLD_SIZE").empty())
      vars += std::string(vars.empty() ? "" : ", ") + "mpirun OMPI_COMM_WORLD_SIZE=" + env("OMPI_COMM_WORLD_SIZE");
    return vars.empty() ? s : s + " (" + vars + ")";
  }
  if (!env("OMPI_COMM_WORLD_SIZE").empty()) return "mpirun (OMPI_COMM_WORLD_SIZE=" + env("OMPI_COMM_WORLD_SIZE") + ")";
  return "single process";
}

std::string launcher_mismatch(int mpi_world_size) { return launch_hint(read_launcher_env(), mpi_world_size); }

std::string thread_binding_hint(int threads, int cpus) {
  if (threads <= cpus) return "";
  return "train.threads_per_rank is " + std::to_string(threads) + " but this rank may run on " + std::to_string(cpus) +
         " CPU" + (cpus == 1 ? "" : "s") +
         " (its affinity mask): the threads take turns. mpirun binds each rank to one core when it starts 2 or fewer "
         "ranks; pass `mpirun --bind-to none` (or --map-by slot:PE=" +
         std::to_string(threads) + "), or srun --cpus-per-task=" + std::to_string(threads) + ".";
}

}  // namespace ampdist
