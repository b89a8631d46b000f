// Layering check: runtime/dist/ sits below runtime/train/: this file must not compile
#include "runtime/train/trainer.h"

int dist_includes_train() { return 0; }
