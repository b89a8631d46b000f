// Layering check: control: comm/ may use core/, so this file compiles
#include "runtime/core/tensor.h"

int comm_includes_core() { return 0; }
