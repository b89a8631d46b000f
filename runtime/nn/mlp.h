// Multi-layer perceptron from the config: Linear fc1, activation act1, ..., Linear fcN (logits).
#pragma once

#include <memory>

#include "ampdist/config.pb.h"
#include "runtime/nn/module.h"

namespace ampdist {

// in_features: e.g. 784 for 28x28 images; classes: logits width.
std::unique_ptr<Sequential> build_mlp(const MlpConfig& cfg, int64_t in_features, int64_t classes,
                                      const Autocast& autocast);

}  // namespace ampdist
