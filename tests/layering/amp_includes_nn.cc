// Layering check: amp/ must not see runtime/nn/: this file must not compile
#include "runtime/nn/module.h"

int amp_includes_nn() { return 0; }
