// Which GPU each rank of a node binds. Ranks are told apart by the GPUs they can see, by UUID, so both ways of
// handing GPUs to ranks work: every rank sees every GPU of the node (mpirun; srun without per-task binding), and
// each rank sees only its own (srun --gpus-per-task=1, or a CUDA_VISIBLE_DEVICES per rank), where every rank's
// device 0 is a different GPU.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace ampdist {

// visible[r]: the UUIDs of the GPUs that local rank r sees, in its CUDA device order. Local ranks take GPUs in
// local-rank order, each the first GPU of its list that no lower local rank took; returns the index in
// visible[local_rank] of this rank's GPU. When a rank finds none free (more ranks than distinct GPUs), the node's
// GPUs are shared: with allow_sharing (device.allow_sharing, for tests on one GPU) that rank takes
// local_rank % visible[local_rank].size(); without it, throws Error (bad input) naming the rank and GPU counts. A
// rank that sees no GPU throws Error (bad input). Every rank computes the same assignment, so every rank of a node
// refuses alike.
int choose_device(int local_rank, const std::vector<std::vector<std::string>>& visible, bool allow_sharing);

// Collective over the ranks of `comm` that share a node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): every local
// rank's list of visible GPU UUIDs (empty where the rank sees none, or the build has no CUDA backend), indexed by
// local rank. At most kMaxGpusPerRank GPUs of each rank are listed.
constexpr int kMaxGpusPerRank = 64;
std::vector<std::vector<std::string>> visible_gpus_on_node(MPI_Comm comm);

// Makes device `index` current (cudaSetDevice), after checking that no device work ran on another device of this
// process (a context, a stream or memory there would stay there: binding comes first). Throws Error otherwise.
void bind_device(int index);

// All of the above for a program whose every rank reaches this call: gather, choose, bind. Returns the index.
int bind_node_device(MPI_Comm comm, bool allow_sharing);

}  // namespace ampdist
