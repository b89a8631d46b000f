// RankGroup: the ranks of a run as the checkpoint code sees them: this rank, the world size, and the few blocking
// host-side agreements a save or a load makes (every rank's status, sizes and hashes gathered; a count summed; a
// replicated buffer completed from the ranks' slices). Every rank calls them at the same point and in the same
// order, as comm/communicator.h's contract requires; each names itself (`what`) in timeout messages.
//
// A value that refers to its Communicator, which must outlive it; made implicitly from one (a run's communicator is
// its group of ranks).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ampdist {

class RankGroup {
 public:
  RankGroup(Communicator& comm) : comm_(&comm) {}  // NOLINT(google-explicit-constructor): see above

  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }

  // Every rank's `value`, indexed by rank.
  std::vector<uint64_t> gather(uint64_t value, const std::string& what) { return comm_->allgather_u64(value, what); }
  // The sum (or maximum) of `value` over the ranks.
  int64_t sum(int64_t value, const std::string& what);
  int64_t max(int64_t value, const std::string& what);
  void barrier(const std::string& what) { comm_->barrier(what); }

  // `buf` is host memory holding a whole flat FP32 buffer of which this rank has filled its slice, counts[rank()]
  // elements at the sum of the earlier ranks' counts; afterwards every rank holds every slice. Over MPI the host
  // buffer is gathered in place; over NCCL (device buffers only) it travels through a device copy of the buffer.
  void gather_slices(std::span<float> buf, std::span<const int64_t> counts, const std::string& what);

 private:
  Communicator* comm_;
};

}  // namespace ampdist
