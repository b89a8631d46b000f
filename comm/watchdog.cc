#include "comm/watchdog.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace ampdist {

namespace {
constexpr int kFields = 4;  // step, waits, heartbeat (ms), state
constexpr int64_t kRunning = 0, kTimedOut = 1, kWaiting = 2;  // the state field
constexpr size_t kBytes = kFields * sizeof(int64_t);

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string progress_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank_%05d", rank);
  return dir + name;
}
}  // namespace

Watchdog::Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (progress_) munmap(const_cast<int64_t*>(progress_), kBytes);
}

void Watchdog::set_progress_dir(const std::string& dir, int world_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string file = progress_file(dir, rank_.load());
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;  // progress is a diagnostic: without it, timeouts still stop the job
  void* p = MAP_FAILED;
  if (::ftruncate(fd, kBytes) == 0) p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return;
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = static_cast<volatile int64_t*>(p);
  progress_[0] = step_.load();
  progress_[1] = waits_;
  progress_[2] = wall_ms();
  progress_[3] = armed_ ? kWaiting : kRunning;
  progress_dir_ = dir;
  world_size_ = world_size;
}

// "; rank(s) 2, 3 silent for 9.8 s (process or node gone); ranks that did not arrive: 1 (at step 4)" from the other
// ranks' progress files.
std::string Watchdog::missing_ranks(bool& quiet) const {
  quiet = false;
  if (progress_dir_.empty()) return "";
  const double silent_after_s = std::min(2.0, timeout_s_ / 2);
  const int64_t now = wall_ms();
  std::string late, silent;
  double silent_for = 0;
  int n_silent = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_.load()) continue;
    int64_t other[kFields] = {0, 0, 0, 0};
    const int fd = ::open(progress_file(progress_dir_, r).c_str(), O_RDONLY);
    if (fd < 0) continue;
    const ssize_t n = ::pread(fd, other, sizeof other, 0);
    ::close(fd);
    if (n != sizeof other) continue;
    const double age_s = (now - other[2]) / 1000.0;
    if (other[3] != kTimedOut && age_s > silent_after_s) {
      silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      silent_for = std::max(silent_for, age_s);
      ++n_silent;
    } else if (r < rank_.load() && (other[3] != kRunning || other[1] >= waits_)) {
      // Alive and waiting (its own watchdog will fire), timed out, or in this wait or a later one: it names the
      // missing ranks.
      quiet = true;
    } else if (other[1] < waits_) {
      late += (late.empty() ? "" : ", ") + std::to_string(r) + " (at step " + std::to_string(other[0]) + ")";
    }
  }
  std::string out;
  if (!silent.empty()) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", silent_for);
    out += std::string("; ") + (n_silent == 1 ? "rank " : "ranks ") + silent + " silent for " + secs +
           " s (process or node gone)";
  }
  if (!late.empty()) out += "; ranks that did not arrive: " + late;
  return out;
}

void Watchdog::set_timeout(double timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_s_ = timeout_s;
}

void Watchdog::arm(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  ++waits_;
  if (progress_) {
    progress_[0] = step_.load();
    progress_[1] = waits_;
    progress_[3] = kWaiting;
  }
  what_ = what;
  armed_ = true;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s_));
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  if (progress_) progress_[3] = kRunning;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (progress_) progress_[2] = wall_ms();  // the heartbeat
    if (stop_ || !armed_ || std::chrono::steady_clock::now() < deadline_) continue;
    const long long step = step_.load();
    bool quiet = false;
    const std::string missing = missing_ranks(quiet);
    if (progress_) progress_[3] = kTimedOut;
    if (quiet) std::_Exit(1);  // a lower rank alive in this wait prints the line
    std::fprintf(stderr,
                 "ampdist: error: [rank %d] %s%s%s did not complete within %g s (comm.timeout_s)%s; stopping the job\n",
                 rank_.load(), step ? ("step " + std::to_string(step)).c_str() : "", step ? ": " : "",
                 what_.c_str(), timeout_s_,
                 missing.empty() ? ": another rank stalled or died" : missing.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace ampdist
