#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "runtime/core/device.h"
#include "runtime/kernels/device_ops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/data/token_data.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/mlp.h"
#include "runtime/train/config.h"

namespace ampdist {
namespace {

float nonfinite_value(NonFiniteValue v) {
  switch (v) {
    case NEG_INF: return -std::numeric_limits<float>::infinity();
    case QNAN: return std::numeric_limits<float>::quiet_NaN();
    default: return std::numeric_limits<float>::infinity();
  }
}

bool injection_applies(const NonFiniteInjection& f, int64_t iteration, int rank, InjectTarget target) {
  return f.step() == iteration && (f.rank() < 0 || f.rank() == rank) && f.target() == target;
}

std::set<std::string> to_set(const google::protobuf::RepeatedPtrField<std::string>& r) {
  return std::set<std::string>(r.begin(), r.end());
}

std::set<OpKind> to_ops(const google::protobuf::RepeatedPtrField<std::string>& r) {
  std::set<OpKind> out;
  for (const std::string& s : r)
    if (auto op = parse_op_kind(s)) out.insert(*op);
  return out;
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg, Communicator& comm, std::unique_ptr<Module> model,
                 std::unique_ptr<Criterion> criterion, std::shared_ptr<const Dataset> train,
                 std::shared_ptr<const Dataset> test)
    : cfg_(cfg),
      comm_(comm),
      model_(std::move(model)),
      criterion_(std::move(criterion)),
      train_(std::move(train)),
      test_(std::move(test)),
      consensus_(comm),
      schedule_(cfg.optimizer().lr(), cfg.optimizer().schedule(), 0) {
  device_ = comm_.device();
  const DType working = resolve_dtype(cfg_.precision().dtype(), device_,
                                      device_ == Device::kCUDA && device::properties(device::current_device()).bf16);
  if (device_ == Device::kCUDA) {
    if (cfg_.comm().mode() == REDUCE_SCATTER)
      throw Error("comm.mode: REDUCE_SCATTER is not supported on the CUDA backend yet (use ALLREDUCE)",
                  ErrorKind::kBadInput);
    if (cfg_.precision().on_nonfinite() == DROP_RANK)
      throw Error("precision.on_nonfinite: DROP_RANK is not supported on the CUDA backend yet (use SKIP)",
                  ErrorKind::kBadInput);
    kernels::gpu::set_allow_tf32(cfg_.precision().allow_tf32());
  }
  const int threads = cfg_.train().threads_per_rank() > 0
                          ? cfg_.train().threads_per_rank()
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm_.local_size());
  kernels::set_num_threads(threads);

  model_->collect_parameters(params_);
  masters_ = std::make_unique<MasterWeights>(params_, working, device_);
  masters_->initialize(cfg_.train().seed());
  scaler_ = LossScaler::from_config(cfg_.precision(), dtype_to_name(working));
  const int64_t cap_bytes = static_cast<int64_t>(cfg_.comm().bucket_cap_mb() * 1024.0 * 1024.0);
  reducer_ = std::make_unique<Reducer>(
      comm_, masters_->grads(), masters_->params(), std::max<int64_t>(cap_bytes, 1),
      resolve_dtype(cfg_.comm().reduce_dtype(), Device::kCPU),  // AUTO reduce dtype: FP32 on either device
      cfg_.comm().mode() == REDUCE_SCATTER ? Reducer::Mode::kReduceScatter : Reducer::Mode::kAllreduce);
  optimizer_ = make_optimizer(cfg_.optimizer(), masters_->numel(), device_);
  grad_ctx_.on_grad_ready = [this](Parameter& p) { on_grad_ready(p); };

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
  schedule_ = LrSchedule(cfg_.optimizer().lr(), cfg_.optimizer().schedule(), total_steps_);

  if (device_ == Device::kCUDA) {
    const ScheduleConfig& sc = cfg_.optimizer().schedule();
    step_cfg_.base_lr = cfg_.optimizer().lr();
    step_cfg_.warmup = sc.warmup_steps();
    step_cfg_.cosine = sc.kind() == COSINE;
    step_cfg_.total_steps = sc.total_steps() > 0 ? sc.total_steps() : total_steps_;
    step_cfg_.min_lr = sc.min_lr();
    step_cfg_.clip_max_norm = cfg_.optimizer().clip_grad_norm();
    step_cfg_.adamw = cfg_.optimizer().has_adamw();
    step_cfg_.beta1 = cfg_.optimizer().adamw().beta1();
    step_cfg_.beta2 = cfg_.optimizer().adamw().beta2();
    step_cfg_.scaler = scaler_.rule();
    device_state_ = Tensor::zeros({static_cast<int64_t>((sizeof(DeviceTrainState) + 3) / 4)}, DType::kFloat32,
                                  Device::kCUDA);
    dstate_ = static_cast<DeviceTrainState*>(device_state_.data());
    push_device_state();
  }

  setup_observers();
}

Trainer::~Trainer() = default;

int64_t Trainer::steps_per_epoch() const { return sampler_ ? sampler_->steps_per_epoch() : 0; }

int64_t Trainer::epoch_of(int64_t iteration) const {
  const int64_t spe = steps_per_epoch();
  return spe > 0 ? (iteration - 1) / spe : 0;
}

StepResult Trainer::step() {
  if (!loader_) throw Error("Trainer::step(): no training dataset; use step(micro_batches, global_samples)");
  phase_begin(Phase::kDataWait);
  const StepBatch& batch = loader_->next();
  phase_end(Phase::kDataWait);
  return step(batch.micro, batch.global_samples);
}

StepResult Trainer::step(std::span<const MicroBatch> micro, int64_t global_samples) {
  if (micro.empty() || global_samples <= 0) throw Error("Trainer::step: a step needs micro-batches and samples");
  if (device_ == Device::kCUDA) return step_device(micro, global_samples);
  StepResult r;
  r.iteration = ++iteration_;
  r.scale = scaler_.scale();
  r.global_samples = global_samples;
  comm_.set_step(iteration_);
  model_->set_mode(true, iteration_);  // dropout masks are keyed by the iteration

  apply_faults();
  const bool drop_mode = cfg_.precision().on_nonfinite() == DROP_RANK;
  if (numerics_) numerics_->begin_step();

  phase_begin(Phase::kForward);
  masters_->cast_to_working();
  // Each micro-batch's loss is divided by the global sample count of the step (all micro-batches, all ranks), so
  // neither accumulation nor world size changes the gradient; the scale multiplies it once.
  const float grad_scale = static_cast<float>(scaler_.scale() / static_cast<double>(global_samples));
  double loss_sum = 0.0;
  int64_t local_samples = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    final_micro_ = k + 1 == micro.size();
    local_samples += micro[k].size();
    reducer_->begin_backward(final_micro_ && !drop_mode);  // DROP_RANK reduces only after the local check
    if (k > 0) phase_begin(Phase::kForward);
    const Tensor& x = k == 0 ? maybe_inject_input(micro[k].x) : micro[k].x;
    observing_ = true;
    first_micro_ = k == 0;
    const Tensor& logits = model_->forward(x);
    observing_ = false;
    loss_sum += criterion_->forward(logits, micro[k].y);
    phase_end(Phase::kForward);
    phase_begin(Phase::kBackward);
    grad_ctx_.accumulate = k > 0;
    grad_ctx_.need_input_grad = false;
    model_->backward(criterion_->backward(grad_scale), grad_ctx_);
    phase_end(Phase::kBackward);
  }
  double mean_correction = 1.0;
  if (drop_mode) {
    mean_correction = drop_nonfinite_ranks(local_samples, global_samples, r);
    reducer_->begin_backward(true);  // wait() launches every bucket
  }
  phase_begin(Phase::kCommWait);
  reducer_->wait();
  phase_end(Phase::kCommWait);

  // One fused pass over the reduced gradient this rank holds: unscale, find non-finite values, sum squares.
  phase_begin(Phase::kUnscaleConsensus);
  bool found_inf = mean_correction == 0.0;
  double sum_sq = 0.0;
  const float inv_scale = static_cast<float>(scaler_.inv_scale() * mean_correction);
  for (const GradSpan& s : reducer_->owned()) {
    Tensor g = Tensor::view(masters_->grads().data_as<float>() + s.begin, {s.count}, DType::kFloat32);
    const kernels::UnscaleResult u = kernels::unscale_and_check(g, inv_scale);
    found_inf |= u.found_inf;
    sum_sq += u.sum_sq;
  }
  const Agreement agreed = consensus_.agree(found_inf, scaler_, stop_request().load());
  found_inf = agreed.found_inf;
  r.stop = agreed.stop;
  phase_end(Phase::kUnscaleConsensus);

  r.loss = loss_sum / static_cast<double>(global_samples);
  r.skipped = found_inf;
  r.grad_norm = std::numeric_limits<double>::quiet_NaN();
  phase_begin(Phase::kOptimizer);
  if (!found_inf) {
    reducer_->gather();
    // Reduce-scatter mode summed squares over this rank's shards only; the norm needs the whole gradient.
    if (reducer_->mode() == Reducer::Mode::kReduceScatter) sum_sq = kernels::sum_squares(masters_->grads());
    r.grad_norm = std::sqrt(sum_sq);
    clip_grad_norm(masters_->grads(), r.grad_norm, cfg_.optimizer().clip_grad_norm());
    r.lr = schedule_.lr(optimizer_->step_count());
    optimizer_->step(masters_->master(), masters_->grads(), r.lr);
  }
  scaler_.update(found_inf);
  phase_end(Phase::kOptimizer);
  if (timer_) timer_->end_step();

  // ---- numerics report (observability): found_inf and the iteration are agreed, so every rank reduces alike ----
  if (numerics_) {
    const int64_t every = cfg_.precision().numerics_report_every();
    const bool first_bad = found_inf && !reported_first_nonfinite_;
    if (first_bad || iteration_ % every == 0) {
      r.numerics = std::make_shared<const NumericsReport>(numerics_->reduce(comm_, iteration_));
      reported_first_nonfinite_ |= found_inf;
    }
  }
  return r;
}

// ---- the CUDA backend's step -------------------------------------------------------------------------------------
// The same order as step() above, with every decision on the device: unscale + check into the device state, the
// consensus MAX all-reduce of the device payload, then one thread computes the agreed flag, clip factor, learning
// rate and scaler update, and the optimizer kernels read that gate. Nothing waits for the GPU unless sync_due().

bool Trainer::sync_due(int64_t it) const {
  const auto every = [it](int64_t n) { return n > 0 && it % n == 0; };
  const int64_t spe = steps_per_epoch();
  return it >= total_steps_ || every(cfg_.log().every_steps()) || every(cfg_.checkpoint().every_steps()) ||
         every(cfg_.train().eval_every_steps()) || every(spe);
}

void Trainer::push_device_state() {
  DeviceTrainState h;
  device::copy(&h, Device::kCPU, dstate_, Device::kCUDA, sizeof h);
  h.scaler = scaler_.scalars();
  h.optimizer_steps = optimizer_->step_count();
  h.status = 0;
  h.stop = 0;
  h.loss_sum = 0.0;
  device::copy(dstate_, Device::kCUDA, &h, Device::kCPU, sizeof h);
  device::synchronize();  // h is on this stack frame
}

void Trainer::read_device_state(StepResult& r) {
  DeviceTrainState h;
  device::copy(&h, Device::kCPU, dstate_, Device::kCUDA, sizeof h);  // waits for the queued steps
  const double zero = 0.0;
  device::copy(&dstate_->loss_sum, Device::kCUDA, &zero, Device::kCPU, sizeof zero);
  device::synchronize();
  scaler_.set_scalars(h.scaler);
  optimizer_->set_step_count(h.optimizer_steps);
  if (h.status == kStateDisagree)
    throw Error("loss-scaler state differs across ranks at step " + std::to_string(iteration_) +
                " (the consensus saw different scales or growth trackers): a bug, not a data problem")
        .set_collective();
  if (h.status != 0) scaler_.throw_status(h.status);
  r.loss = h.loss_sum + host_loss_since_read_;
  host_loss_since_read_ = 0.0;
  r.skipped = h.last_skipped != 0;
  r.scale = h.last_scale;
  r.lr = h.last_lr;
  r.grad_norm = h.grad_norm;
  r.stop = h.stop != 0;
}

StepResult Trainer::step_device(std::span<const MicroBatch> micro, int64_t global_samples) {
  StepResult r;
  r.iteration = ++iteration_;
  r.global_samples = global_samples;
  comm_.set_step(iteration_);
  model_->set_mode(true, iteration_);  // dropout masks are keyed by the iteration
  apply_faults();

  masters_->cast_to_working();
  kernels::gpu::step_begin(dstate_);
  // A criterion with a device path reads the scale and adds its loss on the device; for any other, the scale comes
  // to the host (one 4-byte copy, which waits for the previous step) and the loss is summed here.
  const bool device_criterion = criterion_->supports_device_step();
  float grad_scale = 0.0f;
  if (device_criterion) {
    criterion_->set_device_step(&dstate_->step_loss, &dstate_->scaler.scale, static_cast<double>(global_samples));
  } else {
    float scale = 0.0f;
    device::copy(&scale, Device::kCPU, &dstate_->scaler.scale, Device::kCUDA, sizeof scale);
    grad_scale = static_cast<float>(scale / static_cast<double>(global_samples));
  }
  double host_loss = 0.0;
  if (x_dev_.size() < micro.size()) x_dev_.resize(micro.size());
  for (size_t k = 0; k < micro.size(); ++k) {
    final_micro_ = k + 1 == micro.size();
    reducer_->begin_backward(final_micro_);
    const Tensor& x_host = k == 0 ? maybe_inject_input(micro[k].x) : micro[k].x;
    const Tensor* x = &x_host;
    if (!model_->takes_host_input()) {
      x_dev_[k].ensure(x_host.shape(), x_host.dtype(), Device::kCUDA);
      x_host.copy_to(x_dev_[k]);
      x = &x_dev_[k];
    }
    const Tensor& logits = model_->forward(*x);
    host_loss += criterion_->forward(logits, micro[k].y);  // 0 from a device criterion
    grad_ctx_.accumulate = k > 0;
    grad_ctx_.need_input_grad = false;
    model_->backward(criterion_->backward(grad_scale), grad_ctx_);
  }
  criterion_->set_device_step(nullptr, nullptr, 1.0);
  host_loss_since_read_ += host_loss / static_cast<double>(global_samples);
  reducer_->wait();  // stream order: the compute stream waits for the bucket all-reduces

  for (const GradSpan& s : reducer_->owned()) {
    Tensor g = Tensor::view(masters_->grads().data_as<float>() + s.begin, {s.count}, DType::kFloat32, Device::kCUDA);
    kernels::gpu::unscale_and_check(g, dstate_);
  }
  kernels::gpu::step_fill_consensus(dstate_, stop_request().load());
  comm_.allreduce_async(dstate_->consensus, 6, DType::kFloat32, ReduceOp::kMax, "consensus all-reduce")->wait();
  kernels::gpu::step_finish(dstate_, step_cfg_, static_cast<double>(global_samples));
  optimizer_->step_device(masters_->master(), masters_->grads(), dstate_);
  if (sync_due(iteration_)) read_device_state(r);
  return r;
}

void Trainer::apply_faults() {
  const FaultConfig& f = cfg_.fault();
  if (f.has_kill() && f.kill().step() == iteration_ && f.kill().rank() == comm_.rank()) {
    std::fprintf(stderr, "ampdist: fault injection: rank %d kills itself at step %lld\n", comm_.rank(),
                 static_cast<long long>(iteration_));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  if (f.has_stall() && f.stall().step() == iteration_ && f.stall().rank() == comm_.rank())
    std::this_thread::sleep_for(std::chrono::duration<double>(f.stall().seconds()));
}

double Trainer::drop_nonfinite_ranks(int64_t local_samples, int64_t global_samples, StepResult& r) {
  Tensor& g = masters_->grads();
  const bool bad = kernels::unscale_and_check(g, 1.0f).found_inf;  // a read-only check: factor 1 changes nothing
  double v[2] = {bad ? 1.0 : 0.0, bad ? static_cast<double>(local_samples) : 0.0};
  comm_.allreduce_f64(v, ReduceOp::kSum, "non-finite rank count all-reduce");
  r.dropped_ranks = static_cast<int>(v[0]);
  r.dropped_samples = static_cast<int64_t>(v[1]);
  if (bad) std::memset(g.data(), 0, g.nbytes());
  const int64_t kept = global_samples - r.dropped_samples;
  // Each rank's loss was divided by the whole step's sample count; the mean over the kept samples is the sum
  // times global / kept.
  return kept > 0 ? static_cast<double>(global_samples) / static_cast<double>(kept) : 0.0;
}

void Trainer::on_grad_ready(Parameter& p) {
  if (final_micro_) {
    for (const NonFiniteInjection& f : cfg_.fault().inject_nonfinite()) {
      if (!injection_applies(f, iteration_, comm_.rank(), GRADIENT)) continue;
      if (f.element() >= p.offset && f.element() < p.offset + p.numel()) {
        const float v = nonfinite_value(f.value());
        float* dst = p.grad.data_as<float>() + (f.element() - p.offset);
        if (device_ == Device::kCUDA) device::copy(dst, Device::kCUDA, &v, Device::kCPU, sizeof v);
        else *dst = v;
      }
    }
    if (numerics_) numerics_->on_gradient(p.name, p.grad);
  }
  reducer_->mark_ready(p);
}

const Tensor& Trainer::maybe_inject_input(const Tensor& x) {
  for (const NonFiniteInjection& f : cfg_.fault().inject_nonfinite()) {
    if (!injection_applies(f, iteration_, comm_.rank(), INPUT) || f.element() >= x.numel()) continue;
    injected_x_.ensure(x.shape(), x.dtype());
    kernels::cast(x, injected_x_);
    injected_x_.data_as<float>()[f.element()] = nonfinite_value(f.value());
    return injected_x_;
  }
  return x;
}

// ---- observability (runtime/obs) ----------------------------------------------------------------------------

void Trainer::setup_observers() {
  bool inject_activation = false;
  for (const NonFiniteInjection& f : cfg_.fault().inject_nonfinite()) inject_activation |= f.target() == ACTIVATION;
  if (device_ == Device::kCUDA) {
    // These observers read activations and gradients on the host; on the GPU, host clocks would time kernel
    // launches, not kernels. Neither has a device implementation yet.
    if (cfg_.precision().numerics_report_every() > 0)
      throw BadInput("precision.numerics_report_every", "not supported on the CUDA backend yet (0 = off)");
    if (inject_activation)
      throw BadInput("fault.inject_nonfinite.target", "ACTIVATION is not supported on the CUDA backend yet");
    return;
  }
  if (cfg_.log().phase_timing()) timer_ = std::make_unique<SteadyClockPhaseTimer>();
  if (cfg_.precision().numerics_report_every() <= 0 && !inject_activation) return;
  auto* seq = dynamic_cast<Sequential*>(model_.get());
  std::vector<std::string> names;
  if (seq)
    for (size_t i = 0; i < seq->size(); ++i) names.push_back(seq->at(i).name());
  else
    names.push_back(model_->name());  // one opaque layer: only its parameters' gradients are observed
  for (int i = 0; i < cfg_.fault().inject_nonfinite_size(); ++i) {
    const NonFiniteInjection& f = cfg_.fault().inject_nonfinite(i);
    if (f.target() != ACTIVATION) continue;
    if (!seq || std::find(names.begin(), names.end(), f.layer()) == names.end()) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      throw BadInput("fault.inject_nonfinite[" + std::to_string(i) + "].layer",
                     "no layer named \"" + f.layer() + "\" in the model (layers: " + all + ")");
    }
  }
  if (cfg_.precision().numerics_report_every() > 0)
    numerics_ = std::make_unique<NumericsMonitor>(names, masters_->working_dtype());
  if (seq) seq->forward_observer = [this](size_t i, Module& m, Tensor& y) { on_layer_output(i, m, y); };
}

void Trainer::on_layer_output(size_t index, Module& layer, Tensor& y) {
  if (!observing_) return;
  if (first_micro_) {
    for (const NonFiniteInjection& f : cfg_.fault().inject_nonfinite()) {
      if (!injection_applies(f, iteration_, comm_.rank(), ACTIVATION) || f.layer() != layer.name() ||
          f.element() >= y.numel())
        continue;
      const float v = nonfinite_value(f.value());
      dispatch_dtype(y.dtype(), [&](auto tag) {
        using T = decltype(tag);
        y.data_as<T>()[f.element()] = static_cast<T>(v);
      });
    }
  }
  if (numerics_) numerics_->on_activation(index, y);
}

std::atomic<bool>& stop_request() {
  static std::atomic<bool> flag{false};
  return flag;
}

CheckpointState Trainer::checkpoint_state() {
  CheckpointState s;
  Manifest& m = s.meta;
  m.set_run_id(run_id_);
  m.set_step(iteration_);
  const int64_t spe = steps_per_epoch();
  m.set_epoch(spe > 0 ? iteration_ / spe : 0);
  m.set_step_in_epoch(spe > 0 ? iteration_ % spe : 0);
  m.set_global_batch_size(cfg_.data().global_batch_size());
  m.set_precision(dtype_to_name(working_dtype()));
  *m.mutable_config() = cfg_;
  m.mutable_config()->clear_fault();
  const LossScalerState& st = scaler_.state();
  m.mutable_scaler()->set_scale(st.scale);
  m.mutable_scaler()->set_growth_tracker(st.growth_tracker);
  m.mutable_scaler()->set_hysteresis_tracker(st.hysteresis_tracker);
  m.mutable_scaler()->set_skipped_steps(st.skipped_steps);
  m.mutable_scaler()->set_consecutive_skips(st.consecutive_skips);
  m.set_optimizer(optimizer_->kind());
  m.set_optimizer_step_count(optimizer_->step_count());
  for (const Parameter* p : masters_->params()) {
    TensorIndexEntry* t = m.add_tensors();
    t->set_name(p->name);
    for (int64_t d : p->shape) t->add_shape(d);
    t->set_offset(p->offset);
    t->set_numel(p->numel());
  }
  if (device_ == Device::kCUDA) {
    // Checkpoints are written from host memory: copy the GPU buffers to host copies (synchronises).
    StepResult ignored;
    read_device_state(ignored);
    host_master_ = masters_->master().to(Device::kCPU);
    m.set_master_xxh3(masters_->hash());
    s.buffers.emplace_back("master", &host_master_);
    const auto state = optimizer_->state();
    host_optim_.resize(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      host_optim_[i] = state[i].second->to(Device::kCPU);
      s.buffers.emplace_back(state[i].first, &host_optim_[i]);
    }
    return s;
  }
  m.set_master_xxh3(masters_->hash());
  s.buffers.emplace_back("master", &masters_->master());
  for (auto& b : optimizer_->state()) s.buffers.push_back(b);
  return s;
}

std::string Trainer::restore(const Manifest& m) {
  iteration_ = m.step();
  LossScalerState st;
  st.scale = m.scaler().scale();
  st.growth_tracker = m.scaler().growth_tracker();
  st.hysteresis_tracker = m.scaler().hysteresis_tracker();
  st.skipped_steps = m.scaler().skipped_steps();
  st.consecutive_skips = m.scaler().consecutive_skips();
  // The saved scaler state belongs to the saved precision's policy. Resumed with another working dtype or loss-scale
  // mode (fp16 -> bf16 after a min_scale stop, say), the configured policy starts afresh: its initial scale and
  // empty trackers; only the run's count of skipped steps carries over.
  const DTypeName saved_dtype = m.has_precision() ? m.precision() : dtype_to_name(working_dtype());
  LossScaler saved = LossScaler::from_config(m.config().precision(), saved_dtype);
  saved.set_state(st);
  std::string note;
  if (saved_dtype != dtype_to_name(working_dtype()) || saved.mode() != scaler_.mode()) {
    note = std::string("precision changed on resume: the checkpoint was trained in ") +
           dtype_name(resolve_dtype(saved_dtype, Device::kCPU)) + " with " + saved.describe() + ", this run is " +
           dtype_name(working_dtype()) + ": the loss scaler starts afresh with " + scaler_.describe();
    const int64_t skipped = st.skipped_steps;
    st = scaler_.state();
    st.skipped_steps = skipped;
  }
  scaler_.set_state(st);
  optimizer_->set_step_count(m.optimizer_step_count());
  if (!m.run_id().empty()) run_id_ = m.run_id();
  if (device_ == Device::kCUDA) {
    // load_checkpoint filled the host copies handed out by checkpoint_state(): move them to the GPU.
    host_master_.copy_to(masters_->master());
    const auto state = optimizer_->state();
    for (size_t i = 0; i < state.size() && i < host_optim_.size(); ++i) host_optim_[i].copy_to(*state[i].second);
    masters_->cast_to_working();
    push_device_state();
  }
  if (sampler_) {
    // Continue at the same global sample position; with the same global batch (any world size, any
    // accumulation) that is the same step of the same epoch.
    const int64_t g = cfg_.data().global_batch_size();
    const int64_t saved_g = m.global_batch_size() > 0 ? m.global_batch_size() : g;
    const int64_t step_in_epoch = m.step_in_epoch() * saved_g / g;
    loader_.reset();
    loader_ = std::make_unique<Loader>(train_, *sampler_, cfg_.optimizer().accumulation_steps(),
                                       cfg_.data().prefetch_steps(), m.epoch(), step_in_epoch);
  }
  return note;
}

EvalResult Trainer::evaluate() {
  EvalResult e;
  if (!test_) return e;
  masters_->cast_to_working();
  model_->set_mode(false, iteration_);
  const std::vector<int64_t> counts = shard_counts(test_->size(), comm_.world_size());
  int64_t begin = 0;
  for (int r = 0; r < comm_.rank(); ++r) begin += counts[r];
  const int64_t end = begin + counts[comm_.rank()];
  const int64_t bs = cfg_.data().eval_batch_size();
  const int64_t dim = test_->feature_dim();
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t b = begin; b < end; b += bs) {
    const int64_t n = std::min(bs, end - b);
    eval_x_.ensure({n, dim}, DType::kFloat32);
    eval_y_.resize(n);
    float* x = eval_x_.data_as<float>();
    for (int64_t i = 0; i < n; ++i) test_->get(b + i, x + i * dim, &eval_y_[i]);
    const Tensor* xin = &eval_x_;
    if (device_ == Device::kCUDA && !model_->takes_host_input()) {
      eval_x_dev_.ensure(eval_x_.shape(), eval_x_.dtype(), Device::kCUDA);
      eval_x_.copy_to(eval_x_dev_);
      xin = &eval_x_dev_;
    }
    loss_sum += criterion_->forward(model_->forward(*xin), eval_y_);
    correct += criterion_->correct();
  }
  int64_t c[2] = {correct, end - begin};
  comm_.allreduce_i64(c, ReduceOp::kSum, "evaluation count all-reduce");
  double l[1] = {loss_sum};
  comm_.allreduce_f64(l, ReduceOp::kSum, "evaluation loss all-reduce");
  e.correct = c[0];
  e.samples = c[1];
  e.loss = e.samples ? l[0] / static_cast<double>(e.samples) : 0.0;
  return e;
}

std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, Communicator& comm) {
  const Device dev = comm.device();
  const DType working = resolve_dtype(cfg.precision().dtype(), dev,
                                      dev == Device::kCUDA && device::properties(device::current_device()).bf16);
  const Autocast autocast(working, to_set(cfg.precision().fp32_layers()), to_ops(cfg.precision().fp32_ops()));
  if (cfg.model().has_gpt()) {
    // Language model: windows of the token data; evaluation is the validation loss in nats per token.
    const GptConfig& g = cfg.model().gpt();
    DatasetPair data = load_token_datasets(cfg.data(), g.seq_len(), g.vocab_size());
    auto model = std::make_unique<GptModel>(g, autocast, cfg.train().seed());
    auto loss = std::make_unique<LanguageModelLoss>(*model);
    return std::make_unique<Trainer>(cfg, comm, std::move(model), std::move(loss), data.train, data.test);
  }
  DatasetPair data = load_datasets(cfg.data(), cfg.train().seed());
  auto model = build_mlp(cfg.model().mlp(), data.train->feature_dim(), data.train->classes(), autocast);
  return std::make_unique<Trainer>(cfg, comm, std::move(model), std::make_unique<SoftmaxCrossEntropy>(), data.train,
                                   data.test);
}

}  // namespace ampdist
