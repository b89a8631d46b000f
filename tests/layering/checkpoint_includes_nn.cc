// Layering check: checkpoint/ must not see runtime/nn/: this file must not compile
#include "runtime/nn/module.h"

int checkpoint_includes_nn() { return 0; }
