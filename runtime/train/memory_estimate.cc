#include "runtime/train/memory_estimate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <spdlog/fmt/fmt.h>

#include "runtime/core/error.h"

namespace ampdist {

namespace {
// Samples per micro-batch on each rank: global_batch_size / (world_size * accumulation_steps).
int64_t micro_batch_size(const RunConfig& cfg, int world_size) {
  const int64_t per_step = static_cast<int64_t>(std::max(world_size, 1)) *
                           std::max(cfg.optimizer().accumulation_steps(), 1);
  return std::max<int64_t>(cfg.data().global_batch_size() / per_step, 1);
}
}  // namespace

int64_t eval_batch_size(const RunConfig& cfg, int world_size) {
  return cfg.data().eval_batch_size() > 0 ? cfg.data().eval_batch_size() : micro_batch_size(cfg, world_size);
}

MemoryEstimate estimate_memory(const RunConfig& cfg, const Module& model, int64_t parameters,
                               const Shape& sample_shape, DType working, int world_size) {
  MemoryEstimate e;
  e.parameters = parameters;
  e.micro_batch = micro_batch_size(cfg, world_size);
  e.eval_batch = eval_batch_size(cfg, world_size);
  const bool zero1 = cfg.optimizer().zero_stage() >= 1 && world_size > 1;
  const int64_t slice = zero1 ? (parameters + world_size - 1) / world_size : parameters;
  e.master_bytes = 4 * slice;
  e.grad_bytes = 4 * parameters;
  e.working_bytes = working == DType::kFloat32 ? 0 : parameters * static_cast<int64_t>(dtype_size(working));
  if (cfg.optimizer().has_adamw())
    e.optimizer_bytes = 8 * slice;  // exp_avg and exp_avg_sq
  else  // SGD (the default): a momentum buffer when momentum != 0
    e.optimizer_bytes = cfg.optimizer().sgd().momentum() != 0.0f ? 4 * slice : 0;
  auto batched = [&](int64_t b) {
    Shape s{b};
    s.insert(s.end(), sample_shape.begin(), sample_shape.end());
    return s;
  };
  e.train_activation_bytes = model.activation_bytes(batched(e.micro_batch), working, true);
  const int64_t train_forward = model.activation_bytes(batched(e.micro_batch), working, false);
  const int64_t eval_forward = model.activation_bytes(batched(e.eval_batch), working, false);
  e.eval_extra_bytes = std::max<int64_t>(eval_forward - train_forward, 0);
  return e;
}

namespace {

// A cgroup limit file's value: bytes, or 0 for "max" / no file / an absurd value (v1's "no limit" is 2^63 - page).
int64_t read_limit(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return 0;
  try {
    const long long x = std::stoll(v);
    return x > 0 && x < (int64_t{1} << 60) ? x : 0;
  } catch (...) {
    return 0;
  }
}

// The tightest memory limit of this process's cgroup and its ancestors (v2), or v1's memory controller.
int64_t cgroup_limit() {
  std::ifstream f("/proc/self/cgroup");
  std::string line, v2_path;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
  int64_t best = 0;
  auto take = [&](int64_t x) {
    if (x > 0 && (best == 0 || x < best)) best = x;
  };
  if (!v2_path.empty()) {
    for (std::string p = v2_path;; p = p.substr(0, p.find_last_of('/'))) {
      take(read_limit("/sys/fs/cgroup" + p + "/memory.max"));
      if (p.empty() || p == "/") break;
    }
  }
  take(read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
  return best;
}

}  // namespace

MemoryBudget memory_budget(Device device, int ranks_on_node) {
  MemoryBudget b;
  const int64_t ranks = std::max(ranks_on_node, 1);
  const std::string share = ranks > 1 ? " / " + std::to_string(ranks) + " ranks on this node" : "";
  auto take = [&](int64_t bytes, const std::string& what) {
    if (bytes > 0 && (b.bytes == 0 || bytes < b.bytes)) {
      b.bytes = bytes;
      b.what = what;
    }
  };
  if (device == Device::kCUDA) {
    take(device::properties(device::current_device()).total_memory, "the GPU's memory");
    return b;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) take(static_cast<int64_t>(pages) * page / ranks, "physical memory" + share);
  take(cgroup_limit() / ranks, "the cgroup's memory limit" + share);
  struct rlimit r {};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    take(static_cast<int64_t>(r.rlim_cur), "the address-space limit (ulimit -v)");
  return b;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

void check_memory_fits(const MemoryEstimate& e, const MemoryBudget& budget, const RunConfig& cfg, int world_size) {
  if (budget.bytes <= 0 || e.total_bytes() <= budget.bytes) return;
  std::string field;
  if (e.eval_extra_bytes >= e.train_activation_bytes && e.eval_extra_bytes >= e.state_bytes())
    field = "data.eval_batch_size (" + std::to_string(e.eval_batch) + " per rank) to lower";
  else if (e.train_activation_bytes >= e.state_bytes())
    field = "data.global_batch_size to lower (a micro-batch of " + std::to_string(e.micro_batch) +
            " per rank), or optimizer.accumulation_steps to raise";
  else if (cfg.optimizer().zero_stage() == 0 && world_size > 1)
    field = "optimizer.zero_stage: 1 to shard the master weights and optimizer state, or a smaller model";
  else
    field = "a smaller model, or more ranks with optimizer.zero_stage: 1";
  throw ConfigInput(fmt::format(
      "the run needs about {} per rank (weights, gradients and optimizer state {}, activations of a micro-batch "
      "{}{}) but {} allows {}; change {}",
      gib(e.total_bytes()), gib(e.state_bytes()), gib(e.train_activation_bytes),
      e.eval_extra_bytes > 0 ? ", evaluation batch beyond that " + gib(e.eval_extra_bytes) : std::string(),
      budget.what, gib(budget.bytes), field));
}

std::string describe(const MemoryEstimate& e, const MemoryBudget& budget) {
  std::ostringstream o;
  o << "memory estimate per rank: " << gib(e.total_bytes()) << " (" << e.parameters << " parameters)\n"
    << "  master weights " << gib(e.master_bytes) << ", gradients " << gib(e.grad_bytes) << ", working copy "
    << gib(e.working_bytes) << ", optimizer state " << gib(e.optimizer_bytes) << "\n"
    << "  activations: micro-batch of " << e.micro_batch << " " << gib(e.train_activation_bytes)
    << ", evaluation batch of " << e.eval_batch << " beyond that " << gib(e.eval_extra_bytes) << "\n"
    << "  this rank may use " << (budget.bytes > 0 ? gib(budget.bytes) + " (" + budget.what + ")" : "no known limit")
    << "\n";
  return o.str();
}

}  // namespace ampdist
