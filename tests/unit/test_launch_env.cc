// The launcher cross-check (launch/rank_env.h) and `ampdist env`'s pure pieces (launch/env_command.h).
#include <gtest/gtest.h>

#include "launch/env_command.h"
#include "launch/rank_env.h"

namespace ampdist {
namespace {

LauncherEnv make_env(std::map<std::string, std::string> vars) { return LauncherEnv{std::move(vars)}; }
MpiPlacement at(int rank, int size, int local_rank, int local_size) {
  return MpiPlacement{rank, size, local_rank, local_size, "node7"};
}

TEST(RankEnv, NoLauncherVariablesAgree) {
  EXPECT_EQ(check_rank_env(make_env({}), at(0, 1, 0, 1)), "");
  EXPECT_EQ(launch_hint(make_env({}), 1), "");
}

TEST(RankEnv, MpirunVariablesThatMatchAgree) {
  auto e = make_env({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"PMIX_RANK", "3"}});
  EXPECT_EQ(check_rank_env(e, at(3, 4, 1, 2)), "");
}

TEST(RankEnv, MpirunRankDisagreementNamesVariableAndBothValues) {
  auto e = make_env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMIX_RANK", "2"}});
  const std::string msg = check_rank_env(e, at(3, 4, 1, 2));
  EXPECT_EQ(msg,
            "rank environment on node7 (MPI rank 3 of 4, local rank 1 of 2): OMPI_COMM_WORLD_RANK=2 but MPI's rank "
            "is 3, PMIX_RANK=2 but MPI's rank is 3; the launcher and the MPI library disagree about this process: a "
            "mis-launched job");
}

TEST(RankEnv, SlurmVariablesAreComparedUnderSrun) {
  auto good = make_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(check_rank_env(good, at(5, 8, 1, 4)), "");
  auto bad = make_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}});
  const std::string msg = check_rank_env(bad, at(5, 8, 1, 4));
  EXPECT_NE(msg.find("SLURM_LOCALID=0 but MPI's local rank is 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("SLURM_PROCID"), std::string::npos) << msg;
}

TEST(RankEnv, SrunWithoutPmixStartsWorldsOfOne) {
  // srun -n 4 without --mpi=pmix: each task is a singleton, rank 0 of 1.
  auto e = make_env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}, {"SLURM_STEP_ID", "0"}});
  const std::string msg = check_rank_env(e, at(0, 1, 0, 1));
  EXPECT_NE(msg.find("SLURM_PROCID=2 but MPI's rank is 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SLURM_NTASKS=4 but MPI's world size is 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("srun --mpi=pmix"), std::string::npos) << msg;
}

TEST(RankEnv, UnderMpirunSlurmVariablesDescribeTheAllocation) {
  // mpirun inside an sbatch allocation: its ranks inherit the batch step's SLURM_PROCID=0, SLURM_NTASKS=8.
  auto e = make_env({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(check_rank_env(e, at(3, 8, 3, 4)), "");
}

TEST(RankEnv, BatchScriptWithoutSrunIsAHintNotAnError) {
  auto e = make_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "77"}});
  EXPECT_EQ(check_rank_env(e, at(0, 1, 0, 1)), "");
  const std::string hint = launch_hint(e, 1);
  EXPECT_NE(hint.find("SLURM_NTASKS=8 but this is a world of 1"), std::string::npos) << hint;
  EXPECT_EQ(launch_hint(e, 8), "");
}

TEST(RankEnv, NonNumericValueIsADisagreement) {
  auto e = make_env({{"OMPI_COMM_WORLD_SIZE", "two"}});
  EXPECT_NE(check_rank_env(e, at(0, 2, 0, 2)).find("OMPI_COMM_WORLD_SIZE=two but MPI's world size is 2"),
            std::string::npos);
}

std::vector<NetInterface> sample_interfaces() {
  return {{"lo", {"127.0.0.1/8", "::1/128"}, true, true},
          {"eth0", {"10.1.2.3/24"}, true, false},
          {"docker0", {"172.17.0.1/16"}, true, false},
          {"veth1", {"192.168.77.2/24"}, true, false},
          {"eth1", {}, true, false},              // no address: never used
          {"eth2", {"10.9.0.1/16"}, false, false}};  // down: never used
}

TEST(EnvNetwork, NcclDefaultSkipsLoopbackAndDocker) {
  const auto i = sample_interfaces();
  EXPECT_EQ(nccl_socket_interfaces(i, ""), (std::vector<std::string>{"eth0", "veth1"}));
  auto ib = i;
  ib.push_back({"ib0", {"10.20.0.1/16"}, true, false});
  EXPECT_EQ(nccl_socket_interfaces(ib, ""), (std::vector<std::string>{"ib0"}));
  EXPECT_EQ(nccl_socket_interfaces({{"lo", {"127.0.0.1/8"}, true, true}}, ""), (std::vector<std::string>{"lo"}));
}

TEST(EnvNetwork, NcclSocketIfnamePrefixExcludeExact) {
  const auto i = sample_interfaces();
  EXPECT_EQ(nccl_socket_interfaces(i, "eth"), (std::vector<std::string>{"eth0"}));
  EXPECT_EQ(nccl_socket_interfaces(i, "^eth,lo"), (std::vector<std::string>{"docker0", "veth1"}));
  EXPECT_EQ(nccl_socket_interfaces(i, "=veth"), (std::vector<std::string>{}));
  EXPECT_EQ(nccl_socket_interfaces(i, "=veth1,eth0"), (std::vector<std::string>{"eth0", "veth1"}));
}

TEST(EnvNetwork, OpenMpiTcpIncludeExclude) {
  const auto i = sample_interfaces();
  EXPECT_EQ(mpi_tcp_interfaces(i, "", ""), (std::vector<std::string>{"eth0", "docker0", "veth1"}));
  EXPECT_EQ(mpi_tcp_interfaces(i, "veth1", ""), (std::vector<std::string>{"veth1"}));
  EXPECT_EQ(mpi_tcp_interfaces(i, "10.1.0.0/16", ""), (std::vector<std::string>{"eth0"}));
  EXPECT_EQ(mpi_tcp_interfaces(i, "", "lo,docker0"), (std::vector<std::string>{"eth0", "veth1"}));
  EXPECT_EQ(mpi_tcp_interfaces(i, "", "172.16.0.0/12"), (std::vector<std::string>{"lo", "eth0", "veth1"}));
}

TEST(EnvVersions, DecodesCudaAndNcclCodes) {
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(11080), "11.8");
  EXPECT_EQ(nccl_version_string(22105), "2.21.5");  // NCCL >= 2.9: 10000*major + 100*minor + patch
  EXPECT_EQ(nccl_version_string(2804), "2.8.4");    // before 2.9: 1000*major + 100*minor + patch
}

// More compute threads than CPUs in the rank's affinity mask (mpirun's default binding of 1 or 2 ranks to a core
// each): one warning naming both counts and the launcher flags that fix it; none when the threads fit.
TEST(ThreadBinding, WarnsWhenThreadsExceedTheAffinityMask) {
  EXPECT_EQ(thread_binding_hint(1, 1), "");
  EXPECT_EQ(thread_binding_hint(2, 8), "");
  const std::string w = thread_binding_hint(2, 1);
  EXPECT_NE(w.find("threads_per_rank is 2"), std::string::npos) << w;
  EXPECT_NE(w.find("on 1 CPU "), std::string::npos) << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  EXPECT_NE(w.find("PE=2"), std::string::npos) << w;
  EXPECT_NE(thread_binding_hint(8, 4).find("on 4 CPUs"), std::string::npos);
}

}  // namespace
}  // namespace ampdist
