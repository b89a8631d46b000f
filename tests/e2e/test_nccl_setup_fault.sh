#!/usr/bin/env bash
# NCCL set-up faults end every rank within the deadline, with one line and exit code 1 (GPU hosts only: exit 77,
# skipped, without a GPU; one GPU is enough, the two ranks share it with device.allow_sharing):
#  1. rank 1 fails before joining the communicator (fault nccl_setup_error, stage INIT): the ranks agree on it at
#     once, rank 0 aborts its join, and only rank 1's error is printed;
#  2. rank 0's ncclGetUniqueId fails (stage UNIQUE_ID): the id's status word takes the error to rank 1, and only
#     rank 0's line is printed.
# comm.timeout_s is 30 s; both must end in under 60 s (a hang would run into the 120 s limit of each run).
# Usage: test_nccl_setup_fault.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" nccl_setup_fault "$@"
if "$AMPDIST" env 2>/dev/null | grep -q 'GPUs: *none'; then
  echo "skipped: no GPU ($("$AMPDIST" env 2>/dev/null | grep -m1 'CUDA driver:' | sed 's/^ *//'))"
  exit 77
fi
drill() {  # drill NAME FAULT WANT
  local name=$1 fault=$2 want=$3 t0=$SECONDS
  AMPDIST_FAULT="$fault" timeout 120 mpirun -q --oversubscribe -np 2 "$AMPDIST" train \
    --config "$SRC/configs/fashion_mnist_mlp.pbtxt" --device cuda --set device.allow_sharing=true \
    --set comm.timeout_s=30 --set data.synthetic.train_samples=1024 --set data.synthetic.test_samples=256 \
    --set data.synthetic.features=784 --set data.synthetic.classes=10 --set train.steps=5 \
    --run-dir "$TMP/run_$name" > "$TMP/$name.log" 2>&1
  local rc=$? dt=$((SECONDS - t0)) lines
  lines=$(grep -c '^ampdist: error:' "$TMP/$name.log")
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [ "$dt" -lt 60 ] && grep -q "$want" "$TMP/$name.log"; then
    ok "$name: exit 1 in $dt s with one line: $(grep '^ampdist: error:' "$TMP/$name.log" | cut -c1-140)"
  else
    not_ok "$name" "exit $rc in $dt s, $lines error lines, wanted exit 1, one line matching '$want', under 60 s"
    show "$TMP/$name.log"
  fi
}
drill init 'nccl_setup_error { rank: 1 stage: INIT }' \
  '^ampdist: error: .*ncclCommInitRankConfig (rank 1 of 2, device 0): injected failure'
drill unique_id 'nccl_setup_error { rank: 0 stage: UNIQUE_ID }' '^ampdist: error: .*ncclGetUniqueId: injected failure'
exit "$FAILED"
