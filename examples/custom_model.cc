// Training a model of your own through the public library API.
//
// The model below is not in ampdist's zoo: a two-branch network whose branches see the two halves of the input and
// whose outputs are added (a Module written from scratch, with its own forward and backward). Everything else,
// mixed precision with FP32 master weights, the loss scaler, the bucketed gradient all-reduce and the consensus, is
// the library's. Run it alone or under mpirun:
//   mpirun -np 2 build/examples/custom_model [fp32|fp16|bf16]
#include <cstdio>
#include <cstring>
#include <memory>

#include "runtime/ampdist.h"

namespace {

// y = branch_a(x[:, :h]) + branch_b(x[:, h:]), each branch Linear -> GELU -> Linear.
class TwoBranchNet : public ampdist::Module {
 public:
  TwoBranchNet(int64_t in, int64_t hidden, int64_t classes, const ampdist::Autocast& ac)
      : Module("two_branch"), half_(in / 2), a_("a"), b_("b") {
    a_.add(std::make_unique<ampdist::Linear>("a.fc1", half_, hidden, true, ac));
    a_.add(std::make_unique<ampdist::Activation>("a.act", ampdist::Activation::Kind::kGELU, ac));
    a_.add(std::make_unique<ampdist::Linear>("a.fc2", hidden, classes, true, ac));
    b_.add(std::make_unique<ampdist::Linear>("b.fc1", in - half_, hidden, true, ac));
    b_.add(std::make_unique<ampdist::Activation>("b.act", ampdist::Activation::Kind::kGELU, ac));
    b_.add(std::make_unique<ampdist::Linear>("b.fc2", hidden, classes, true, ac));
  }

  void collect_parameters(std::vector<ampdist::Parameter*>& out) override {
    a_.collect_parameters(out);
    b_.collect_parameters(out);
  }

  const ampdist::Tensor& forward(const ampdist::Tensor& x) override {
    split(x);
    const ampdist::Tensor& ya = a_.forward(xa_);
    const ampdist::Tensor& yb = b_.forward(xb_);
    // y = float(ya) + float(yb): the sum of the branches in FP32, the logits' dtype for the FP32 loss.
    y_.ensure(ya.shape(), ampdist::DType::kFloat32);
    sum_.ensure(yb.shape(), ampdist::DType::kFloat32);
    ampdist::kernels::cast(ya, y_);
    ampdist::kernels::cast(yb, sum_);
    float* y = y_.data_as<float>();
    const float* s = sum_.data_as<float>();
    for (int64_t i = 0; i < y_.numel(); ++i) y[i] += s[i];
    return y_;
  }

  const ampdist::Tensor& backward(const ampdist::Tensor& dy, ampdist::GradContext& ctx) override {
    // d/dya = d/dyb = dy. The branches are independent, so b's gradients are final (and its buckets can start
    // reducing) before a's backward runs.
    const bool need = ctx.need_input_grad;
    ctx.need_input_grad = false;
    b_.backward(dy, ctx);
    a_.backward(dy, ctx);
    ctx.need_input_grad = need;
    static const ampdist::Tensor none;
    return none;
  }

 private:
  void split(const ampdist::Tensor& x) {
    const int64_t n = x.dim(0), in = x.dim(1);
    xa_.ensure({n, half_}, ampdist::DType::kFloat32);
    xb_.ensure({n, in - half_}, ampdist::DType::kFloat32);
    const float* px = x.data_as<float>();
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xa_.data_as<float>() + i * half_, px + i * in, half_ * sizeof(float));
      std::memcpy(xb_.data_as<float>() + i * (in - half_), px + i * in + half_, (in - half_) * sizeof(float));
    }
  }

  int64_t half_;
  ampdist::Sequential a_, b_;
  ampdist::Tensor xa_, xb_, y_, sum_;
};

}  // namespace

int main(int argc, char** argv) {
  ampdist::MpiRuntime mpi(&argc, &argv);
  int code = 0;
  try {
    ampdist::MpiCommunicator comm;
    const std::string dtype = argc > 1 ? argv[1] : "fp16";
    if (dtype != "fp16" && dtype != "bf16" && dtype != "fp32")
      throw ampdist::BadInput("custom_model", "expected fp32, fp16 or bf16, got '" + dtype + "'");
    ampdist::RunConfig cfg = ampdist::parse_config_text(R"(
        name: "custom_model"
        model { mlp {} }
        data { synthetic { train_samples: 4096 test_samples: 1024 features: 32 classes: 8 noise: 1.5 }
               global_batch_size: 64 }
        optimizer { adamw {} lr: 0.003 schedule { kind: COSINE warmup_steps: 20 } clip_grad_norm: 1.0 }
        train { epochs: 4 }
        log { every_steps: 64 metrics_jsonl: false }
      )", "custom_model");
    ampdist::apply_override(cfg, "precision.dtype=" + std::string(dtype == "bf16" ? "BF16" : dtype == "fp32" ? "FP32" : "FP16"));
    ampdist::validate_config(cfg, "custom_model");

    ampdist::DatasetPair data = ampdist::load_datasets(cfg.data(), cfg.train().seed());
    const ampdist::Autocast autocast = ampdist::make_autocast(cfg, comm.device());
    auto model = std::make_unique<TwoBranchNet>(data.train->feature_dim(), 64, data.train->classes(), autocast);
    ampdist::Trainer trainer(cfg, comm, autocast, std::move(model), std::make_unique<ampdist::SoftmaxCrossEntropy>(),
                             data.train, data.test);
    ampdist::LoopOptions opt;
    opt.out = comm.rank() == 0 ? &std::cout : nullptr;
    const ampdist::RunSummary s = ampdist::run_training(trainer, opt);
    if (comm.rank() == 0)
      std::printf("custom model (%s): test accuracy %.4f, skipped steps %lld, master weights hash %s\n", dtype.c_str(),
                  s.test_accuracy, static_cast<long long>(s.skipped_steps), ampdist::hex16(s.master_hash).c_str());
    // Chance is 1/8; the clusters are separable enough for far better.
    code = s.test_accuracy > 0.5 ? 0 : 3;
  } catch (const ampdist::Error& e) {
    std::fprintf(stderr, "custom_model: error: %s\n", e.what());
    code = e.exit_code();
  }
  return code;
}
