// The set-up phases of `ampdist train` (config, device and communicator, resume): each rank runs a phase to its end
// or to its first error without throwing past it, then every rank agrees on the outcome, so that a rank that failed
// never leaves another waiting in a collective and the job prints one error line, from the rank that failed
// first-hand.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "runtime/core/error.h"

namespace ampdist {

// One rank's outcome of a phase. `secondary`: this rank failed only because another did (Error::secondary(): a
// broadcast from a rank that failed, an NCCL join that another rank aborted); such a rank never prints the line.
struct PhaseResult {
  int code = 0;  // 0: the phase succeeded; else the exit code (Error::exit_code(): 2 for bad input, 1 otherwise)
  std::string message;
  bool secondary = false;
};

// Runs f, recording an Error or std::exception as the result instead of throwing. An Error raised where the
// config file is not known (ConfigInput) is named after `source`.
template <typename F>
void run_phase(PhaseResult& r, const std::string& source, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    r.code = e.exit_code();
    r.message = e.in_source(source);
    r.secondary = e.secondary();
  } catch (const std::exception& e) {
    r.code = 1;
    r.message = e.what();
  }
}

// What every rank agreed on. code: the largest exit code of any rank (0: no rank failed). reporter: the lowest rank
// that failed first-hand (the one that prints), or -1 when none did; prefix_rank: whether its line names its rank
// (not when every rank failed, which then all failed alike).
struct PhaseVerdict {
  int code = 0;
  int reporter = -1;
  bool prefix_rank = false;
};

// Collective over `comm` (two small all-reduces); call it on every rank after each phase.
PhaseVerdict agree_on_phase(Communicator& comm, const PhaseResult& mine);

// "ampdist: error: [rank R] message" (without "[rank R] " when prefix_rank is false) on stderr, flushed.
void print_error(int rank, bool prefix_rank, const std::string& message);

// agree_on_phase, then the reporter prints "ampdist: error: [rank R] <message>" to stderr. Returns the agreed code.
int agree_on_failure(Communicator& comm, const PhaseResult& mine);

}  // namespace ampdist
