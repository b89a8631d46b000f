// ampdist::Error: the one exception type of the library.
//
// Every throw carries context: which file, which config field, which rank, which collective. The `ampdist` program
// catches it in main, prints one line and exits with `exit_code()`: 2 for bad input (a config, a dataset, a
// command line), 1 for a failure at run time. Library code never calls exit().
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

 private:
  ErrorKind kind_;
  bool secondary_ = false;
};

// Bad input named by its source: `BadInput("configs/x.pbtxt", "optimizer.lr must be > 0, got -1")`.
inline Error BadInput(const std::string& where, const std::string& what) {
  return Error(where + ": " + what, ErrorKind::kBadInput);
}

}  // namespace ampdist

// Internal invariant check: a failure is a bug in ampdist, reported with the source location.
#define AMPDIST_CHECK(cond, msg)                                                                          \
  do {                                                                                                    \
    if (!(cond))                                                                                          \
      throw ::ampdist::Error(std::string("internal check failed at ") + __FILE__ + ":" +                  \
                             std::to_string(__LINE__) + ": " #cond ": " + std::string(msg));            \
  } while (0)
