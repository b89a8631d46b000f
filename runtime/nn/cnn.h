// Conv nets from the config: model { cnn {...} } (a small conv net) and model { resnet {...} } (torchvision's
// ResNet-18/34 layout and names). Both start with an ImageView of the loader's [N, C*H*W] batch as [N, C, H, W].
#pragma once

#include <memory>
#include <vector>

#include "ampdist/config.pb.h"
#include "runtime/nn/conv.h"

namespace ampdist {

// image: the dataset's sample shape {C, H, W}; classes: logits width. allreduce_sum: set for sync_batchnorm (see
// BatchNorm2d), empty otherwise. Throws Error (bad input) naming the config field for a model that does not fit the
// image (a layer whose output would be empty, channels that groups do not divide).
std::unique_ptr<Sequential> build_cnn(const CnnConfig& cfg, const std::vector<int64_t>& image, int64_t classes,
                                      const Autocast& autocast, const BatchNorm2d::AllReduce& allreduce_sum = {});
std::unique_ptr<Sequential> build_resnet(const ResnetConfig& cfg, const std::vector<int64_t>& image, int64_t classes,
                                         const Autocast& autocast, const BatchNorm2d::AllReduce& allreduce_sum = {});

}  // namespace ampdist
