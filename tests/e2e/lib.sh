# Shared by the e2e scripts (sourced, not a test itself):
#   source "$(dirname "$0")/lib.sh" NAME "$@"
# checks the arguments (<path-to-ampdist> [<source-dir>]), sets AMPDIST, SRC and a private temp dir TMP (removed on
# exit together with any process whose command line still names it), lets OpenMPI run as root as CTest does, and
# defines the result lines: ok CASE, not_ok CASE WHY (sets FAILED=1), show FILE, hash_of FILE. End with
# `exit "$FAILED"`.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 <path-to-ampdist> [<source-dir>]" >&2
  exit 2
fi
command -v pgrep > /dev/null || { echo "not ok - pgrep is missing (Debian package procps): cannot check for leftover ranks"; exit 1; }
AMPDIST=$(readlink -f "$2")
SRC=$(readlink -f "${3:-.}")
if [ ! -x "$AMPDIST" ]; then
  echo "not ok - setup: $2 is not an executable"
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
unset AMPDIST_FAULT

TMP=$(mktemp -d "${TMPDIR:-/tmp}/ampdist_$1.XXXXXX")
# shellcheck disable=SC2317  # called by the trap
e2e_cleanup() {
  local pids
  pids=$(pgrep -f "$TMP" || true)
  # shellcheck disable=SC2086  # one pid a word
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  rm -rf "$TMP"
}
trap e2e_cleanup EXIT

FAILED=0
ok() { echo "ok - $1"; }
not_ok() {
  echo "not ok - $1: $2"
  FAILED=1
}
# A captured output under a failing case, indented, so the log says what went wrong.
show() { sed -e 's/^/    | /' "$1" | head -30; }
# The 16 hex digits of the "master weights hash: ..." summary line in FILE.
hash_of() { sed -n 's/^master weights hash: \([0-9a-f]\{16\}\)$/\1/p' "$1"; }

# fault_job FILE STEPS KEEP_LAST: the fault drills' job (an MLP on synthetic data, fp16, a checkpoint every 25 steps,
# a log line every 50) as a config file, STEPS steps long, keeping KEEP_LAST checkpoints.
fault_job() {
  cat >"$1" <<PB
name: "job"
model { mlp { hidden: [512, 128] } }
data { synthetic { train_samples: 16384 test_samples: 512 features: 256 classes: 10 noise: 2.0 } global_batch_size: 64 }
optimizer { adamw {} lr: 0.001 }
precision { dtype: FP16 }
train { steps: $2 eval_every_epochs: 0 }
log { every_steps: 50 }
checkpoint { every_steps: 25 keep_last: $3 }
PB
}

# fashion_mnist_slice DIR [TRAIN TEST]: the first TRAIN (512) training and TEST (256) test images of Debian's
# Fashion-MNIST written to DIR as an IDX directory (the reader's layout), so that a conv net or an MLP trains in
# seconds. Returns non-zero on failure.
fashion_mnist_slice() {
  python3 - /usr/share/datasets/fashion-mnist "$1" "${2:-512}" "${3:-256}" <<'PY'
import gzip, os, struct, sys
src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(dst)
def read(name):
    p = os.path.join(src, name)
    return (gzip.open(p + ".gz") if os.path.exists(p + ".gz") else open(p, "rb")).read()
for split, n in (("train", n_train), ("t10k", n_test)):
    img, lab = read(split + "-images-idx3-ubyte"), read(split + "-labels-idx1-ubyte")
    _, _, rows, cols = struct.unpack(">IIII", img[:16])
    open(os.path.join(dst, split + "-images-idx3-ubyte"), "wb").write(
        struct.pack(">IIII", 0x803, n, rows, cols) + img[16:16 + n * rows * cols])
    open(os.path.join(dst, split + "-labels-idx1-ubyte"), "wb").write(struct.pack(">II", 0x801, n) + lab[8:8 + n])
PY
}
