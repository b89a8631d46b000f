#include "runtime/nn/cnn.h"

#include <cmath>
#include <string>

namespace ampdist {
namespace {

Error bad(const std::string& field, const std::string& what) {
  return Error("model." + field + ": " + what, ErrorKind::kBadInput);
}

void check_image(const std::vector<int64_t>& image, const char* model) {
  if (image.size() != 3)
    throw bad(model, "needs image data ([C, H, W] samples: data.idx, or data.synthetic with image_shape); got "
                     "samples of " + std::to_string(image.size()) + " dimension(s)");
}

}  // namespace

std::unique_ptr<Sequential> build_cnn(const CnnConfig& cfg, const std::vector<int64_t>& image, int64_t classes,
                                      const Autocast& autocast, const BatchNorm2d::AllReduce& allreduce_sum) {
  check_image(image, "cnn");
  auto model = std::make_unique<Sequential>("cnn");
  model->add(std::make_unique<ImageView>("input", Shape(image.begin(), image.end())));
  int64_t c = image[0], h = image[1], w = image[2];
  BatchNorm2d* pending_bn = nullptr;  // the last BatchNorm, when a conv may follow it directly
  for (int i = 0; i < cfg.conv_size(); ++i) {
    const ConvLayerConfig& l = cfg.conv(i);
    const std::string n = std::to_string(i + 1);
    const std::string field = "cnn.conv[" + std::to_string(i) + "]";
    if (l.channels() <= 0 || l.channels() > (1 << 16)) throw bad(field + ".channels", "must be in [1, 65536]");
    if (l.kernel() <= 0 || l.stride() <= 0 || l.dilation() <= 0 || l.groups() <= 0 || l.padding() < -1)
      throw bad(field, "kernel, stride, dilation and groups must be > 0 and padding >= -1");
    if (c % l.groups() != 0 || l.channels() % l.groups() != 0)
      throw bad(field + ".groups", std::to_string(l.groups()) + " does not divide the input channels (" +
                                       std::to_string(c) + ") and the output channels (" +
                                       std::to_string(l.channels()) + ")");
    if (l.max_pool() > 0 && l.avg_pool() > 0) throw bad(field, "set max_pool or avg_pool, not both");
    Conv2d::Options o;
    o.in = c;
    o.out = l.channels();
    o.kernel = l.kernel();
    o.stride = l.stride();
    o.padding = l.padding() >= 0 ? l.padding() : l.dilation() * (l.kernel() - 1) / 2;
    o.dilation = l.dilation();
    o.groups = l.groups();
    o.bias = l.bias();
    kernels::ConvShape s{1, c, h, w, o.out, o.kernel, o.kernel, o.stride, o.padding, o.dilation, o.groups};
    if (s.out_h() <= 0 || s.out_w() <= 0)
      throw bad(field, "the " + std::to_string(h) + "x" + std::to_string(w) + " input is smaller than the kernel");
    auto conv = std::make_unique<Conv2d>("conv" + n, o, autocast);
    if (pending_bn) pending_bn->fuse_relu(conv->compute_dtype());  // the BatchNorm + ReLU just before this conv
    pending_bn = nullptr;
    model->add(std::move(conv));
    c = o.out;
    h = s.out_h();
    w = s.out_w();
    const int pool = std::max(l.max_pool(), l.avg_pool());
    if (l.batch_norm()) {
      // bn -> relu as one op (BatchNorm2d::fuse_relu). Its output stays FP32 unless the next layer is a conv: then
      // it is written in that conv's dtype, which is exact (the conv would round it so anyway), where a pooling
      // or a Linear in between would see values rounded too early.
      auto bn = std::make_unique<BatchNorm2d>("bn" + n, c, allreduce_sum);
      bn->fuse_relu(DType::kFloat32);
      if (pool == 0) pending_bn = bn.get();
      model->add(std::move(bn));
    } else {
      model->add(std::make_unique<Activation>("relu" + n, Activation::Kind::kReLU, autocast));
    }
    if (pool > 0) {
      if (pool > h || pool > w)
        throw bad(field, "pooling " + std::to_string(pool) + " does not fit the " + std::to_string(h) + "x" +
                             std::to_string(w) + " feature map");
      model->add(std::make_unique<Pool2d>("pool" + n, l.max_pool() > 0 ? Pool2d::Kind::kMax : Pool2d::Kind::kAvg,
                                          pool, pool, 0));
      h = (h - pool) / pool + 1;
      w = (w - pool) / pool + 1;
    }
  }
  if (cfg.global_avg_pool()) {
    model->add(std::make_unique<GlobalAvgPool2d>("avgpool"));
    h = w = 1;
  }
  model->add(std::make_unique<Flatten>("flatten"));
  int64_t width = c * h * w;
  int layer = 1;
  for (int64_t hd : cfg.hidden()) {
    if (hd <= 0 || hd > (int64_t{1} << 24)) throw bad("cnn.hidden", "widths must be in [1, 2^24]");
    model->add(std::make_unique<Linear>("fc" + std::to_string(layer), width, hd, true, autocast));
    model->add(std::make_unique<Activation>("act" + std::to_string(layer), Activation::Kind::kReLU, autocast));
    width = hd;
    ++layer;
  }
  model->add(std::make_unique<Linear>("fc" + std::to_string(layer), width, classes, true, autocast));
  return model;
}

std::unique_ptr<Sequential> build_resnet(const ResnetConfig& cfg, const std::vector<int64_t>& image, int64_t classes,
                                         const Autocast& autocast, const BatchNorm2d::AllReduce& allreduce_sum) {
  check_image(image, "resnet");
  std::vector<int> blocks;
  if (cfg.depth() == 18) blocks = {2, 2, 2, 2};
  else if (cfg.depth() == 34) blocks = {3, 4, 6, 3};
  else throw bad("resnet.depth", "must be 18 or 34 (BasicBlock ResNets), got " + std::to_string(cfg.depth()));
  if (cfg.width() <= 0 || cfg.width() > 1024) throw bad("resnet.width", "must be in [1, 1024]");
  const bool imagenet = cfg.stem() != SMALL;
  const int64_t min_side = imagenet ? 32 : 8;  // the last stage's feature map stays at least 1x1
  if (image[1] < min_side || image[2] < min_side)
    throw bad("resnet.stem", std::string(imagenet ? "IMAGENET" : "SMALL") + " needs images of at least " +
                                 std::to_string(min_side) + "x" + std::to_string(min_side) + ", got " +
                                 std::to_string(image[1]) + "x" + std::to_string(image[2]));
  const float gain = std::sqrt(2.0f);  // He initialisation for ReLU
  auto model = std::make_unique<Sequential>("resnet");
  model->add(std::make_unique<ImageView>("input", Shape(image.begin(), image.end())));
  const int64_t w0 = cfg.width();
  Conv2d::Options stem;
  stem.in = image[0];
  stem.out = w0;
  stem.kernel = imagenet ? 7 : 3;
  stem.stride = imagenet ? 2 : 1;
  stem.padding = imagenet ? 3 : 1;
  stem.bias = false;
  stem.init_bound = gain * std::sqrt(3.0f / static_cast<float>(w0 * stem.kernel * stem.kernel));
  model->add(std::make_unique<Conv2d>("conv1", stem, autocast));
  auto bn1 = std::make_unique<BatchNorm2d>("bn1", w0, allreduce_sum);
  bn1->fuse_relu(DType::kFloat32);  // bn1 -> relu in one pass; FP32, since layer1.0's identity path adds it
  model->add(std::move(bn1));
  if (imagenet) model->add(std::make_unique<Pool2d>("maxpool", Pool2d::Kind::kMax, 3, 2, 1));
  int64_t in = w0;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t out = w0 << stage;
    for (int b = 0; b < blocks[static_cast<size_t>(stage)]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      model->add(std::make_unique<BasicBlock>("layer" + std::to_string(stage + 1) + "." + std::to_string(b), in, out,
                                              stride, autocast, allreduce_sum, gain));
      in = out;
    }
  }
  model->add(std::make_unique<GlobalAvgPool2d>("avgpool"));
  model->add(std::make_unique<Flatten>("flatten"));
  model->add(std::make_unique<Linear>("fc", in, classes, true, autocast));
  return model;
}

}  // namespace ampdist
