#include "comm/watchdog.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace ampdist {

Watchdog::Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (progress_) munmap(const_cast<int64_t*>(progress_), 2 * sizeof(int64_t));
}

namespace {
std::string progress_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank_%05d", rank);
  return dir + name;
}
}  // namespace

void Watchdog::set_progress_dir(const std::string& dir, int world_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string file = progress_file(dir, rank_.load());
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;  // progress is a diagnostic: without it, timeouts still stop the job
  void* p = MAP_FAILED;
  if (::ftruncate(fd, 2 * sizeof(int64_t)) == 0)
    p = ::mmap(nullptr, 2 * sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return;
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = static_cast<volatile int64_t*>(p);
  progress_[0] = step_.load();
  progress_[1] = waits_;
  progress_dir_ = dir;
  world_size_ = world_size;
}

// "; ranks that did not arrive: 1 (at step 4, wait 17)" from the other ranks' progress files.
std::string Watchdog::missing_ranks() const {
  if (progress_dir_.empty()) return "";
  std::string out;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_.load()) continue;
    int64_t other[2] = {0, 0};
    const int fd = ::open(progress_file(progress_dir_, r).c_str(), O_RDONLY);
    if (fd < 0) continue;
    const ssize_t n = ::pread(fd, other, sizeof other, 0);
    ::close(fd);
    if (n == sizeof other && other[1] < waits_)
      out += (out.empty() ? "" : ", ") + std::to_string(r) + " (at step " + std::to_string(other[0]) + ")";
  }
  return out.empty() ? "" : "; ranks that did not arrive: " + out;
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
  }
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
    const std::string missing = missing_ranks();
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
