// ampdist::Error: the exception type of the library's interface.
//
// Every throw carries context: which file, which config field, which rank, which collective. The `ampdist` program
// catches it in main, prints one line and exits with `exit_code()`: 2 for bad input (a config, a dataset, a
// command line), 1 for a failure at run time. Two kinds of code are the exceptions: CUDA launchers (*.cu) throw
// std::runtime_error (the kernels' Tensor-level wrappers turn it into Error; the step-state and consensus launchers
// let it reach the program, which prints it as one line with exit code 1); and the communication watchdogs
// (comm/watchdog.cc, the NCCL monitor) end a rank with std::_Exit(1) after one line when a collective hangs past its
// deadline or NCCL fails asynchronously, since no thread of the rank can return from that state.
#pragma once

#include <stdexcept>
#include <string>

namespace ampdist {

enum class ErrorKind {
  kBadInput = 2,  // the user can fix it by changing an input; exit code 2
  kRuntime = 1,   // anything else; exit code 1
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::kRuntime)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }
  // A rank that fails only because another rank reported the real problem (a collective check): its message is
  // not the one to print.
  bool secondary() const { return secondary_; }
  void set_secondary() { secondary_ = true; }
  // Every rank throws this same error at the same point, because it follows from agreed state (the consensus, a
  // gathered verdict): one rank (rank 0) reports it for all, and no rank needs to abort the others.
  bool collective() const { return collective_; }
  Error& set_collective() {
    collective_ = true;
    return *this;
  }
  // Bad input in a config field, thrown by code that does not know which file the config came from (ConfigInput):
  // what() reads "config: <detail>", and the program that read the file reports "<file>: <detail>" (in_source).
  bool config_relative() const { return !config_detail_.empty(); }
  std::string in_source(const std::string& source) const {
    return config_relative() ? source + ": " + config_detail_ : what();
  }

 private:
  ErrorKind kind_;
  bool secondary_ = false;
  bool collective_ = false;
  std::string config_detail_;
  friend Error ConfigInput(const std::string& what);
};

// Bad input named by its source: `BadInput("configs/x.pbtxt", "optimizer.lr must be > 0, got -1")`.
inline Error BadInput(const std::string& where, const std::string& what) {
  return Error(where + ": " + what, ErrorKind::kBadInput);
}

// Bad input in a config field where the config's source is not known: `ConfigInput("data.global_batch_size = 100 is
// not a multiple of world size 3")`; see Error::in_source.
inline Error ConfigInput(const std::string& what) {
  Error e("config: " + what, ErrorKind::kBadInput);
  e.config_detail_ = what;
  return e;
}

}  // namespace ampdist

// Internal invariant check: a failure is a bug in ampdist, reported with the source location.
#define AMPDIST_CHECK(cond, msg)                                                                          \
  do {                                                                                                    \
    if (!(cond))                                                                                          \
      throw ::ampdist::Error(std::string("internal check failed at ") + __FILE__ + ":" +                  \
                             std::to_string(__LINE__) + ": " #cond ": " + std::string(msg));            \
  } while (0)
