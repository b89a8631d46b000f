// make_trainer: the datasets, the model and the loss a config describes.
#include <set>
#include <string>

#include "runtime/checkpoint/pretrained.h"
#include "runtime/core/device.h"
#include "runtime/data/token_data.h"
#include "runtime/nn/cnn.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/mlp.h"
#include "runtime/train/config.h"
#include "runtime/train/trainer.h"

namespace ampdist {
namespace {

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

void check_init_from(const RunConfig& cfg) {
  if (cfg.model().init_from().empty() || !cfg.model().has_gpt()) return;
  GptModel model(cfg.model().gpt(), Autocast(DType::kFloat32), 0);
  std::vector<Parameter*> params;
  model.collect_parameters(params);
  const PretrainedSource source(cfg.model().init_from(), flat_layout(params), &cfg.model().gpt());
}

Autocast make_autocast(const RunConfig& cfg, Device device) {
  const DType working = resolve_dtype(cfg.precision().dtype(), device,
                                      device == Device::kCUDA && device::properties(device::current_device()).bf16);
  return Autocast(working, to_set(cfg.precision().fp32_layers()), to_ops(cfg.precision().fp32_ops()));
}

ModelParts build_model_parts(const RunConfig& cfg, Communicator& comm) {
  const Device dev = comm.device();
  ModelParts m{make_autocast(cfg, dev)};
  const Autocast& autocast = m.autocast;
  if (cfg.model().has_gpt()) {
    // Language model: windows of the token data; evaluation is the validation loss in nats per token.
    const GptConfig& g = cfg.model().gpt();
    DatasetPair data = load_token_datasets(cfg.data(), g.seq_len(), g.vocab_size());
    auto model = std::make_unique<GptModel>(g, autocast, cfg.train().seed());
    m.criterion = std::make_unique<LanguageModelLoss>(*model);
    m.model = std::move(model);
    m.train = data.train;
    m.test = data.test;
    return m;
  }
  DatasetPair data = load_datasets(cfg.data(), cfg.train().seed());
  m.train = data.train;
  m.test = data.test;
  m.criterion = std::make_unique<SoftmaxCrossEntropy>();
  if (cfg.model().has_cnn() || cfg.model().has_resnet()) {
    validate_for_device(cfg, dev, "config");
    BatchNorm2d::AllReduce sync;
    if (cfg.model().sync_batchnorm())
      sync = [&comm](std::span<double> v) { comm.allreduce_f64(v, ReduceOp::kSum, "sync batchnorm all-reduce"); };
    const std::vector<int64_t> image = data.train->sample_shape();
    m.model = cfg.model().has_cnn() ? build_cnn(cfg.model().cnn(), image, data.train->classes(), autocast, sync)
                                    : build_resnet(cfg.model().resnet(), image, data.train->classes(), autocast, sync);
    return m;
  }
  m.model = build_mlp(cfg.model().mlp(), data.train->feature_dim(), data.train->classes(), autocast);
  return m;
}

MemoryEstimate ModelParts::estimate(const RunConfig& cfg, int world_size) const {
  std::vector<Parameter*> params;
  model->collect_parameters(params);
  int64_t numel = 0;
  for (const Parameter* p : params) numel += p->numel();
  return estimate_memory(cfg, *model, numel, {train->feature_dim()}, autocast.working(), world_size);
}

std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, Communicator& comm) {
  ModelParts m = build_model_parts(cfg, comm);
  // Before the trainer allocates anything of the model's size: refuse a run that cannot fit.
  check_memory_fits(m.estimate(cfg, comm.world_size()), memory_budget(comm.device(), comm.local_size()), cfg,
                    comm.world_size());
  return std::make_unique<Trainer>(cfg, comm, m.autocast, std::move(m.model), std::move(m.criterion), m.train,
                                   m.test);
}

}  // namespace ampdist
