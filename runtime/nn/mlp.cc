#include "runtime/nn/mlp.h"

namespace ampdist {

std::unique_ptr<Sequential> build_mlp(const MlpConfig& cfg, int64_t in_features, int64_t classes,
                                      const Autocast& autocast) {
  // Refuse a model that cannot fit before allocating it: 2^31 parameters are 8 GiB of master weights alone.
  int64_t params = 0, w = in_features;
  for (int64_t h : cfg.hidden()) {
    params += (w + 1) * h;
    w = h;
    if (params > (int64_t{1} << 31) || h > (int64_t{1} << 24))
      throw Error("model.mlp.hidden: more than 2^31 parameters (" + std::to_string(params) + " so far)",
                  ErrorKind::kBadInput);
  }
  auto model = std::make_unique<Sequential>("mlp");
  int64_t width = in_features;
  int layer = 1;
  for (int64_t h : cfg.hidden()) {
    model->add(std::make_unique<Linear>("fc" + std::to_string(layer), width, h, cfg.bias(), autocast));
    model->add(std::make_unique<Activation>(
        "act" + std::to_string(layer), cfg.activation() == GELU ? Activation::Kind::kGELU : Activation::Kind::kReLU,
        autocast));
    width = h;
    ++layer;
  }
  model->add(std::make_unique<Linear>("fc" + std::to_string(layer), width, classes, cfg.bias(), autocast));
  return model;
}

}  // namespace ampdist
