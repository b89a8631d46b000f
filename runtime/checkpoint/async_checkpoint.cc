#include "runtime/checkpoint/async_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace ampdist {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(RankGroup ranks, std::string dir, int keep_last, const FaultConfig* faults)
    : ranks_(ranks), dir_(std::move(dir)), keep_last_(keep_last), faults_(faults) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (writer_.joinable()) writer_.join();
  staging_.clear();
  for (void* p : pinned_) device::free_host(p);
}

void AsyncCheckpointer::start(const CheckpointState& state) {
  AMPDIST_CHECK(!pending_, "AsyncCheckpointer::start with the save of step " + std::to_string(target_.step) +
                               " still in flight: drain() it first");
  target_ = prepare_save(ranks_, state, dir_);
  meta_ = state.meta;
  names_.clear();
  staging_.resize(state.buffers.size());
  const size_t bytes = static_cast<size_t>(target_.count) * sizeof(float);
  const bool on_device = std::any_of(state.buffers.begin(), state.buffers.end(),
                                     [](const auto& b) { return b.second->device() != Device::kCPU; });
  if (on_device && (pinned_.size() != state.buffers.size() || pinned_bytes_ < bytes)) {
    staging_.assign(state.buffers.size(), Tensor());
    for (void* p : pinned_) device::free_host(p);
    pinned_.assign(state.buffers.size(), nullptr);
    for (void*& p : pinned_) p = device::alloc_host(bytes);
    pinned_bytes_ = bytes;
  }
  // Host buffers: (source, staging) pairs the background thread copies before it writes.
  std::vector<std::pair<const float*, float*>> host_copies;
  for (size_t i = 0; i < state.buffers.size(); ++i) {
    names_.push_back(state.buffers[i].first);
    const Tensor& from = *state.buffers[i].second;
    const float* src = from.data_as<float>() + (target_.begin - state.begin);
    if (from.device() == Device::kCPU) {
      staging_[i].ensure({target_.count}, DType::kFloat32);
      host_copies.emplace_back(src, staging_[i].data_as<float>());
      continue;
    }
    staging_[i] = Tensor::view(pinned_[i], {target_.count}, DType::kFloat32);
    device::copy(pinned_[i], Device::kCPU, src, from.device(), bytes);
  }
  CheckpointState staged;
  staged.meta = meta_;  // write_shard reads the run id only
  staged.numel = target_.numel;
  staged.begin = target_.begin;
  staged.record_elements = target_.per_record;
  for (size_t i = 0; i < staging_.size(); ++i) staged.buffers.emplace_back(names_[i], &staging_[i]);
  written_.store(false);
  {
    std::lock_guard<std::mutex> lock(staged_mu_);
    staged_ = host_copies.empty();
  }
  pending_ = true;
  started_ = now_s();
  const int rank = ranks_.rank(), world = ranks_.world_size();
  // fault.slow_save with before_staging_copy: a slow staging copy (the drill's pause, before the copy).
  const double copy_pause = faults_ && faults_->has_slow_save() && faults_->slow_save().before_staging_copy() &&
                                    faults_->slow_save().step() == target_.step && faults_->slow_save().rank() == rank
                                ? faults_->slow_save().seconds()
                                : 0.0;
  writer_ = std::thread([this, staged = std::move(staged), copies = std::move(host_copies), bytes, rank, world,
                         copy_pause] {
    if (!copies.empty()) {
      if (copy_pause > 0) std::this_thread::sleep_for(std::chrono::duration<double>(copy_pause));
      for (const auto& [src, dst] : copies) std::memcpy(dst, src, bytes);
      {
        std::lock_guard<std::mutex> lock(staged_mu_);
        staged_ = true;
      }
      staged_cv_.notify_all();
    }
    result_ = write_own_shard(target_, staged, rank, world, faults_);
    written_.store(true);
  });
}

void AsyncCheckpointer::wait_staged() {
  std::unique_lock<std::mutex> lock(staged_mu_);
  staged_cv_.wait(lock, [&] { return staged_; });
}

bool AsyncCheckpointer::staged() const {
  std::lock_guard<std::mutex> lock(staged_mu_);
  return staged_;
}

std::optional<AsyncCheckpointer::Published> AsyncCheckpointer::poll() {
  if (!pending_) return std::nullopt;
  if (ranks_.max(written_.load() ? 0 : 1, "asynchronous checkpoint progress all-reduce") != 0)
    return std::nullopt;  // some rank is still writing
  return commit();
}

std::optional<AsyncCheckpointer::Published> AsyncCheckpointer::drain() {
  if (!pending_) return std::nullopt;
  return commit();
}

std::optional<AsyncCheckpointer::Published> AsyncCheckpointer::commit() {
  if (writer_.joinable()) writer_.join();
  pending_ = false;
  Published p;
  p.step = target_.step;
  p.path = commit_save(ranks_, target_, meta_, names_, result_, keep_last_, &p.warnings);
  p.seconds = now_s() - started_;
  return p;
}

}  // namespace ampdist
