#include "comm/consensus.h"

#include <cstring>
#include <sstream>

#include "runtime/core/error.h"

namespace ampdist {

Agreement Consensus::agree(bool local_found_inf, const LossScaler& scaler, bool local_stop) {
  ++calls_;
  const double s = scaler.scale();
  const double g = static_cast<double>(scaler.state().growth_tracker);
  double v[6] = {local_found_inf ? 1.0 : 0.0, s, -s, g, -g, local_stop ? 1.0 : 0.0};
  comm_.allreduce_f64(v, ReduceOp::kMax, "consensus all-reduce");
  if (v[1] != -v[2] || v[3] != -v[4]) {
    uint64_t bits;
    std::memcpy(&bits, &s, sizeof bits);
    const std::vector<uint64_t> all = comm_.allgather_u64(bits, "consensus scale gather");
    std::ostringstream o;
    o << "loss scales differ across ranks (a bug: every rank must update its scaler from the agreed flag only):";
    for (size_t r = 0; r < all.size(); ++r) {
      double sr;
      std::memcpy(&sr, &all[r], sizeof sr);
      o << " rank " << r << " S=" << sr << (r + 1 < all.size() ? "," : "");
    }
    if (v[3] != -v[4]) o << "; growth trackers differ too";
    throw Error(o.str()).set_collective();
  }
  return Agreement{v[0] > 0.0, v[5] > 0.0};
}

}  // namespace ampdist
