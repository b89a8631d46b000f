// Layering check: kernels/ must not see runtime/train/: this file must not compile
#include "runtime/train/trainer.h"

int kernels_includes_train() { return 0; }
