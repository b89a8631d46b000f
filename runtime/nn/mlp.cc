#include "runtime/nn/mlp.h"

namespace ampdist {

std::unique_ptr<Sequential> build_mlp(const MlpConfig& cfg, int64_t in_features, int64_t classes,
                                      const Autocast& autocast) {
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
