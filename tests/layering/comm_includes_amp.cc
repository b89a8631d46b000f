// Layering check: comm/ must not see runtime/amp/: this file must not compile
#include "runtime/amp/loss_scaler.h"

int comm_includes_amp() { return 0; }
