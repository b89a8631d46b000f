// `ampdist env [--json]`: what to check before a long run, gathered from every rank and printed by rank 0.
//
//   mpirun -np 8 ampdist env            srun --mpi=pmix ampdist env --json
//
// Per host (the ranks on it, gathered over MPI): the MPI library (MPI_Get_library_version); the GPU driver
// (NVML, libnvidia-ml.so.1), the CUDA driver API (libcuda.so.1), CUDA runtime (libcudart.so), cuBLAS (libcublas.so)
// and NCCL (libnccl.so.2) versions, each dlopen()ed at run time so that this works whether or not ampdist was built
// with the CUDA backend, and "not found" when a library is absent; every GPU's model, memory, compute capability and
// bf16 support (compute capability >= 8.0, Ampere and later: the first with bf16 tensor-core math); the local rank ->
// device binding (device = local_rank % device_count, the rule the CUDA backend uses); the network interfaces
// (getifaddrs) and which of them NCCL and OpenMPI's TCP transport would use given NCCL_SOCKET_IFNAME,
// OMPI_MCA_btl_tcp_if_include and OMPI_MCA_btl_tcp_if_exclude.
#pragma once

#include <string>
#include <vector>

#include "launch/rank_env.h"

namespace ampdist {

struct EnvArgs {
  bool json = false;  // --json: one JSON object on stdout instead of the human-readable report
};

// Collective over MPI_COMM_WORLD. Returns the exit code (0; 1 when the gather fails).
int run_env_command(const EnvArgs& args, const LauncherEnv& launcher, const MpiPlacement& placement);

// ---- pieces with no side effects, for tests ------------------------------------------------------------------

// One network interface with its addresses ("192.0.2.2/24", "fd00::2/64"), as getifaddrs reports it.
struct NetInterface {
  std::string name;
  std::vector<std::string> addresses;  // IPv4 and IPv6, with prefix length
  bool up = false;
  bool loopback = false;
};

// The interfaces NCCL's socket transport (and its bootstrap) would use, in `ifaces` order, following NCCL's rules
// (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, NCCL_SOCKET_IFNAME): `ifname` is a comma-separated
// list of name prefixes; a leading '^' makes it an exclude list, a leading '=' exact names. Unset (empty): interfaces
// named ib* first; else every interface except lo* and docker*; else docker*; else lo*. Only interfaces that are up
// and have an address count.
std::vector<std::string> nccl_socket_interfaces(const std::vector<NetInterface>& ifaces, const std::string& ifname);

// The interfaces OpenMPI's TCP BTL would use (docs.open-mpi.org, "TCP" tuning: btl_tcp_if_include/exclude): each
// list is comma-separated interface names or IPv4 CIDR subnets ("10.0.0.0/8"). include, when set, wins; exclude
// defaults to "127.0.0.1/8,sppp" (the loopback and PPP interfaces). Only interfaces that are up and have an address.
std::vector<std::string> mpi_tcp_interfaces(const std::vector<NetInterface>& ifaces, const std::string& include,
                                            const std::string& exclude);

// A version code from cudaRuntimeGetVersion/cuDriverGetVersion (1000*major + 10*minor: 12040 -> "12.4") and from
// ncclGetVersion (2.9 and later: 10000*major + 100*minor + patch; earlier: 1000*major + 100*minor + patch).
std::string cuda_version_string(int code);
std::string nccl_version_string(int code);

}  // namespace ampdist
