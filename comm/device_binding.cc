#include "comm/device_binding.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace ampdist {

int choose_device(int local_rank, const std::vector<std::vector<std::string>>& visible, bool allow_sharing) {
  const int local_size = static_cast<int>(visible.size());
  if (local_rank < 0 || local_rank >= local_size)
    throw Error("choose_device: local rank " + std::to_string(local_rank) + " of " + std::to_string(local_size));
  if (visible[static_cast<size_t>(local_rank)].empty())
    throw Error("no CUDA device for the rank with local rank " + std::to_string(local_rank) + ": " +
                    device::unavailable_reason(),
                ErrorKind::kBadInput);
  std::set<std::string> distinct, taken;
  for (const auto& list : visible) distinct.insert(list.begin(), list.end());
  int mine = -1;
  for (int r = 0; r < local_size; ++r) {
    const std::vector<std::string>& list = visible[static_cast<size_t>(r)];
    const auto free = std::find_if(list.begin(), list.end(), [&](const std::string& u) { return !taken.count(u); });
    if (free == list.end()) {
      if (!allow_sharing)
        throw Error(std::to_string(local_size) + " ranks on this node but " + std::to_string(distinct.size()) +
                        " distinct GPUs visible to them (local rank " + std::to_string(r) +
                        " finds none left): start one rank per GPU (mpirun -np <GPUs per node> per node, srun "
                        "--ntasks-per-node=<GPUs> or --gpus-per-task=1), or set device.allow_sharing for tests",
                    ErrorKind::kBadInput);
      if (r == local_rank) mine = local_rank % static_cast<int>(list.size());
      continue;
    }
    taken.insert(*free);
    if (r == local_rank) mine = static_cast<int>(free - list.begin());
  }
  return mine;
}

std::vector<std::vector<std::string>> visible_gpus_on_node(MPI_Comm comm) {
  constexpr int kUuid = 16;  // bytes of a CUDA device UUID
  constexpr int kRecord = 4 + kMaxGpusPerRank * kUuid;
  std::vector<char> mine(kRecord, 0);
  const int n = std::min(device::device_count(), kMaxGpusPerRank);
  std::memcpy(mine.data(), &n, 4);
  for (int i = 0; i < n; ++i) {
    const std::string u = device::properties(i).uuid;
    std::memcpy(mine.data() + 4 + i * kUuid, u.data(), std::min<size_t>(u.size(), kUuid));
  }
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int size = 1;
  MPI_Comm_size(node, &size);
  std::vector<char> all(static_cast<size_t>(size) * kRecord);
  MPI_Allgather(mine.data(), kRecord, MPI_BYTE, all.data(), kRecord, MPI_BYTE, node);
  MPI_Comm_free(&node);
  std::vector<std::vector<std::string>> out(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const char* rec = all.data() + static_cast<size_t>(r) * kRecord;
    int count = 0;
    std::memcpy(&count, rec, 4);
    for (int i = 0; i < count; ++i) out[static_cast<size_t>(r)].emplace_back(rec + 4 + i * kUuid, kUuid);
  }
  return out;
}

void bind_device(int index) {
  for (int used : device::devices_used())
    if (used != index)
      throw Error("this rank is bound to CUDA device " + std::to_string(index) +
                  ", but device work already ran on CUDA device " + std::to_string(used) +
                  " in this process: bind the device before any device work");
  device::set_device(index);
}

int bind_node_device(MPI_Comm comm, bool allow_sharing) {
  int local_rank = 0;
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  const int index = choose_device(local_rank, visible_gpus_on_node(comm), allow_sharing);
  bind_device(index);
  return index;
}

}  // namespace ampdist
