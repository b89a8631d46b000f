// Layering check: comm/ links only core (the Reducer's casts live in runtime/dist/): this file must not compile
#include "runtime/kernels/kernels.h"

int comm_includes_kernels() { return 0; }
