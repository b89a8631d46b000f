#include "comm/watchdog.h"

#include <cstdio>
#include <cstdlib>

namespace ampdist {

Watchdog::Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::set_timeout(double timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_s_ = timeout_s;
}

void Watchdog::arm(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  what_ = what;
  armed_ = true;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s_));
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_ || !armed_ || std::chrono::steady_clock::now() < deadline_) continue;
    const long long step = step_.load();
    std::fprintf(stderr,
                 "ampdist: error: [rank %d] %s%s%s did not complete within %g s (comm.timeout_s): another rank "
                 "stalled or died; stopping the job\n",
                 rank_.load(), step ? ("step " + std::to_string(step)).c_str() : "", step ? ": " : "",
                 what_.c_str(), timeout_s_);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace ampdist
