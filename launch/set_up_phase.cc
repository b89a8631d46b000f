#include "launch/set_up_phase.h"

#include <cstdio>

namespace ampdist {

PhaseVerdict agree_on_phase(Communicator& comm, const PhaseResult& mine) {
  const int world = comm.world_size();
  // [the largest code, world - the lowest first-hand failing rank]: one MAX all-reduce gives both.
  int64_t v[2] = {mine.code, mine.code && !mine.secondary ? world - comm.rank() : 0};
  comm.allreduce_i64(v, ReduceOp::kMax, "set-up status all-reduce");
  PhaseVerdict verdict;
  if (v[0] == 0) return verdict;
  int64_t failed[1] = {mine.code ? 1 : 0};
  comm.allreduce_i64(failed, ReduceOp::kSum, "set-up failure count");
  verdict.code = static_cast<int>(v[0]);
  verdict.reporter = v[1] > 0 ? world - static_cast<int>(v[1]) : -1;
  verdict.prefix_rank = failed[0] != world;
  return verdict;
}

void print_error(int rank, bool prefix_rank, const std::string& message) {
  if (prefix_rank) std::fprintf(stderr, "ampdist: error: [rank %d] %s\n", rank, message.c_str());
  else std::fprintf(stderr, "ampdist: error: %s\n", message.c_str());
  std::fflush(stderr);
}

int agree_on_failure(Communicator& comm, const PhaseResult& mine) {
  const PhaseVerdict v = agree_on_phase(comm, mine);
  if (v.code != 0 && comm.rank() == v.reporter) print_error(comm.rank(), v.prefix_rank, mine.message);
  return v.code;
}

}  // namespace ampdist
