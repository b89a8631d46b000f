// Layering check: core/ includes nothing of ours: this file must not compile
#include "runtime/kernels/math.h"

int core_includes_kernels() { return 0; }
