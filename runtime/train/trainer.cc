#include "runtime/train/trainer.h"

#include <algorithm>
#include <thread>

#include <fnmatch.h>

#include "runtime/checkpoint/pretrained.h"
#include "runtime/core/device.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/train/config.h"

namespace ampdist {

Trainer::Trainer(const RunConfig& cfg, Communicator& comm, const Autocast& autocast, std::unique_ptr<Module> model,
                 std::unique_ptr<Criterion> criterion, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> test)
    : cfg_(cfg),
      comm_(comm),
      device_(comm.device()),
      model_(std::move(model)),
      criterion_(std::move(criterion)),
      train_(std::move(train)),
      test_(std::move(test)),
      consensus_(comm) {
  const DType working = autocast.working();
  exec_.allow_tf32 = device_ == Device::kCUDA && cfg_.precision().allow_tf32();
  // By default the node's cores shared by its ranks, and never more than the CPUs this rank may run on: a rank that
  // mpirun bound to one core gets one thread, not a team that would take turns on that core.
  const int node_share = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm_.local_size());
  exec_.threads = cfg_.train().threads_per_rank() > 0 ? cfg_.train().threads_per_rank()
                                                      : std::min(node_share, kernels::available_cpus());
  const kernels::ExecScope scope(exec_);  // the set-up's casts and initialisation run as the step's kernels will

  model_->collect_parameters(params_);
  model_->collect_buffers(buffer_list_);
  if (!buffer_list_.empty()) buffers_ = std::make_unique<ModelBuffers>(buffer_list_, device_);  // on the step's device
  // The ZeRO stage, decided once (zero_stage): the plan gives the master weights their slice and the Reducer its mode.
  plan_ = ShardPlan(zero_stage(cfg_), comm_.rank(), comm_.world_size());
  masters_ = bind_parameters(params_, working, device_, cfg_.train().seed(), plan_.master_slice());
  if (!cfg_.model().init_from().empty()) {
    // Pretrained weights over the random ones: master slice, working copy and FP32 copies alike (fill).
    const PretrainedSource source(cfg_.model().init_from(), masters_->layout(),
                                  cfg_.model().has_gpt() ? &cfg_.model().gpt() : nullptr);
    masters_->fill([&](size_t i, int64_t first, int64_t count, float* out) { source.read(i, first, count, out); });
  }
  scaler_policy_ = LossScaler::from_config(cfg_.precision(), dtype_to_name(working));
  const int64_t cap_bytes = static_cast<int64_t>(cfg_.comm().bucket_cap_mb() * 1024.0 * 1024.0);
  reducer_ = std::make_unique<Reducer>(comm_, masters_->grads(), masters_->layout(), std::max<int64_t>(cap_bytes, 1),
                                       resolve_dtype(cfg_.comm().reduce_dtype(), Device::kCPU),  // AUTO: FP32
                                       plan_);
  optimizer_ = make_optimizer(cfg_.optimizer(), masters_->slice_count(), device_);
  if (cfg_.optimizer().no_decay_size() > 0) optimizer_->set_no_decay(no_decay_ranges(cfg_.optimizer(), *masters_));
  checkpoint_ = std::make_unique<CheckpointBinding>(*masters_, *optimizer_, buffers_.get(), device_);
  if (plan_.sharded()) rank_sums_ = Tensor::zeros({4 * static_cast<int64_t>(comm_.world_size())}, DType::kFloat16, device_);

  const int accumulation = cfg_.optimizer().accumulation_steps();
  if (train_) {
    SamplerOptions so;
    so.dataset_size = train_->size();
    so.global_batch_size = cfg_.data().global_batch_size();
    so.world_size = comm_.world_size();
    so.rank = comm_.rank();
    so.accumulation_steps = accumulation;
    so.drop_last = cfg_.data().drop_last();
    so.shuffle = cfg_.data().shuffle();
    so.seed = cfg_.train().seed();
    sampler_.emplace(so);
    micro_batch_ = sampler_->micro_batch_size();
    total_steps_ = cfg_.train().steps() > 0 ? cfg_.train().steps() : cfg_.train().epochs() * sampler_->steps_per_epoch();
    loader_ = std::make_unique<Loader>(train_, *sampler_, accumulation, cfg_.data().prefetch_steps());
  } else {
    total_steps_ = cfg_.train().steps();
  }
  due_ = std::make_unique<DueSteps>(cfg_, total_steps_, steps_per_epoch());
  if (test_) evaluator_ = std::make_unique<Evaluator>(test_, comm_, device_, eval_batch_size(cfg_, comm_.world_size()));

  step_cfg_ = make_step_config(cfg_, total_steps_, scaler_policy_.rule());
  state_ = std::make_unique<StepStateBuffer>(device_);
  snapshot_.scaler = scaler_policy_.state();
  write_state();
  setup_observers();
}

Trainer::~Trainer() = default;

EvalResult Trainer::evaluate() {
  if (!evaluator_) return {};
  const kernels::ExecScope scope(exec_);
  masters_->ensure_working();
  model_->set_mode(false, iteration_);
  return evaluator_->run(*model_, *criterion_);
}

std::vector<std::pair<int64_t, int64_t>> no_decay_ranges(const OptimizerConfig& cfg, const MasterWeights& masters) {
  const FlatLayout& layout = masters.layout();
  std::vector<bool> matched(static_cast<size_t>(cfg.no_decay_size()), false);
  const int64_t sb = masters.slice_begin(), se = sb + masters.slice_count();
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < layout.size(); ++i) {
    bool hit = false;
    for (int k = 0; k < cfg.no_decay_size(); ++k)
      if (::fnmatch(cfg.no_decay(k).c_str(), layout[i].name.c_str(), 0) == 0) hit = matched[static_cast<size_t>(k)] = true;
    if (!hit) continue;
    const int64_t b = std::max(sb, layout[i].offset), e = std::min(se, layout[i].offset + layout[i].numel());
    if (e <= b) continue;
    if (!out.empty() && out.back().second == b - sb) out.back().second = e - sb;  // adjacent tensors: one range
    else out.emplace_back(b - sb, e - sb);
  }
  for (int k = 0; k < cfg.no_decay_size(); ++k)
    if (!matched[static_cast<size_t>(k)])
      throw ConfigInput("optimizer.no_decay[" + std::to_string(k) + "] \"" + cfg.no_decay(k) +
                        "\" matches no tensor of the model (names such as " + layout[0].name + ")");
  return out;
}

int64_t Trainer::steps_per_epoch() const { return sampler_ ? sampler_->steps_per_epoch() : 0; }

int64_t Trainer::epoch_of(int64_t iteration) const {
  const int64_t spe = steps_per_epoch();
  return spe > 0 ? (iteration - 1) / spe : 0;
}

StepConfig make_step_config(const RunConfig& cfg, int64_t total_steps, const ScalerRule& scaler) {
  StepConfig c;
  const OptimizerConfig& o = cfg.optimizer();
  const ScheduleConfig& sc = o.schedule();
  c.base_lr = o.lr();
  c.warmup = sc.warmup_steps();
  c.cosine = sc.kind() == COSINE;
  c.total_steps = sc.total_steps() > 0 ? sc.total_steps() : total_steps;  // as LrSchedule
  c.min_lr = sc.min_lr();
  c.clip_max_norm = o.clip_grad_norm();
  c.adamw = o.has_adamw();
  c.beta1 = o.adamw().beta1();
  c.beta2 = o.adamw().beta2();
  c.scaler = scaler;
  return c;
}

std::atomic<bool>& stop_request() {
  static std::atomic<bool> flag{false};
  return flag;
}

}  // namespace ampdist
