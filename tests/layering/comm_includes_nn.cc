// Layering check: comm/ must not see runtime/nn/ (DESIGN.md's folder table): this file must not compile
#include "runtime/nn/module.h"

int comm_includes_nn() { return 0; }
