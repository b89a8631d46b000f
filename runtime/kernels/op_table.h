// The ids of the op table (kernels/ops.def), in its order: every op either backend implements, and the composites
// whose GPU side is a device-only function. The GPU-against-CPU tests walk this list (tests/gpu/op_coverage.h).
#pragma once

#include <span>
#include <string_view>

namespace ampdist::kernels {

std::span<const std::string_view> op_ids();

}  // namespace ampdist::kernels
