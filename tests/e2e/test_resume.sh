#!/usr/bin/env bash
# Checkpoint and resume with whole runs of the ampdist program:
#  1. Crash during save: 2 ranks, checkpoints every 10 steps; rank 1 dies halfway through writing its step-20
#     shard. The job stops (no rank left running), step 20 is never chosen, step 10 verifies intact, and
#     --resume auto from step 10 ends at step 20 with the master weights of the uninterrupted run, bitwise.
#  2. SIGUSR1 (SLURM's warning before a time limit) to ONE rank: every rank saves at the same step boundary and
#     exits 0; --resume auto finishes the run with the master weights of the uninterrupted run, bitwise.
#  3. Resume on another world size: a checkpoint saved on 2 ranks loads on 1 and on 4 ranks with the same master
#     weights (the hash printed at resume), and training continues.
# Usage: test_resume.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" resume "$@"
run() {  # run NP OUT ARGS...
  local np=$1 out=$2
  shift 2
  timeout 300 mpirun -q --oversubscribe -np "$np" "$AMPDIST" train "$@" > "$out" 2>&1
}

# ---- 1. crash during save --------------------------------------------------------------------------------------
cfg="$SRC/configs/fashion_mnist_mlp.pbtxt"
common=(--config "$cfg" --precision fp16 --set train.steps=20 --set checkpoint.every_steps=10 --set log.every_steps=10)
run 2 "$TMP/u.txt" "${common[@]}" --run-dir "$TMP/u" || not_ok "crash: uninterrupted run" "exit $?: $(tail -2 "$TMP/u.txt")"
h_straight=$(hash_of "$TMP/u.txt")

run 2 "$TMP/k.txt" "${common[@]}" --run-dir "$TMP/k" --set fault.crash_during_save.step=20 \
  --set fault.crash_during_save.rank=1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then ok "crash: a rank killed during the step-20 save stops the job (exit $rc)"; else
  not_ok "crash during save" "exit code $rc (124 = hang)"; fi
sleep 1
if pgrep -f "$TMP/k" > /dev/null; then not_ok "crash during save" "ampdist processes left running"; else
  ok "crash: no rank left running"; fi
ck="$TMP/k/checkpoints"
[ ! -e "$ck/step_00000020" ] && [ -d "$ck/.tmp_step_00000020" ] && ok "crash: step 20 never published" ||
  not_ok "crash: publish" "$(ls -a "$ck")"
[ "$(cat "$ck/latest" 2>/dev/null)" = "step_00000010" ] && ok "crash: latest still names step 10" ||
  not_ok "crash: latest" "latest is '$(cat "$ck/latest" 2>/dev/null)'"
"$AMPDIST" ckpt verify "$ck/step_00000010" > "$TMP/verify.txt" 2>&1 && ok "crash: step 10 verifies intact" ||
  not_ok "crash: verify step 10" "$(cat "$TMP/verify.txt")"

run 2 "$TMP/r.txt" "${common[@]}" --run-dir "$TMP/k" --resume auto ||
  not_ok "crash: resume" "exit $?: $(tail -2 "$TMP/r.txt")"
grep -q "^resumed from $ck/step_00000010 (step 10" "$TMP/r.txt" && ok "crash: --resume auto chose step 10" ||
  not_ok "crash: resume choice" "$(grep resumed "$TMP/r.txt")"
h_resumed=$(hash_of "$TMP/r.txt")
[ -n "$h_straight" ] && [ "$h_straight" = "$h_resumed" ] &&
  ok "crash: steps 11-20 after resume match the uninterrupted run bitwise ($h_resumed)" ||
  not_ok "crash: bitwise" "uninterrupted $h_straight, resumed $h_resumed"

# ---- 2. SIGUSR1 to one rank --------------------------------------------------------------------------------------
cat > "$TMP/slow.pbtxt" <<'PB'
name: "slow"
model { mlp { hidden: [1024, 256] } }
data { synthetic { train_samples: 16384 test_samples: 512 features: 512 classes: 10 noise: 2.0 } global_batch_size: 64 }
optimizer { adamw {} lr: 0.001 }
precision { dtype: FP16 }
train { steps: 600 eval_every_epochs: 0 }
log { every_steps: 100 }
checkpoint { keep_last: 2 }
PB
run 2 "$TMP/s_u.txt" --config "$TMP/slow.pbtxt" --run-dir "$TMP/s_u" || not_ok "SIGUSR1 reference run" "exit $?"
h_ref=$(hash_of "$TMP/s_u.txt")
( run 2 "$TMP/s_k.txt" --config "$TMP/slow.pbtxt" --run-dir "$TMP/s_k"; echo $? > "$TMP/s_k.rc" ) &
for _ in $(seq 1 100); do  # wait for training to be under way, then signal the newest rank only
  grep -q "^step " "$TMP/s_k.txt" 2>/dev/null && break
  sleep 0.1
done
victim=$(pgrep -f "^$AMPDIST train --config $TMP/slow.pbtxt --run-dir $TMP/s_k" | tail -1)
kill -USR1 "$victim" 2>/dev/null
wait
rc=$(cat "$TMP/s_k.rc")
stopped_at=$(sed -n 's/^stopping at step \([0-9]*\).*/\1/p' "$TMP/s_k.txt")
if [ "$rc" = 0 ] && [ -n "$stopped_at" ] && [ "$stopped_at" -lt 600 ] && grep -q "^stopped early" "$TMP/s_k.txt" &&
  grep -q "^test accuracy: not evaluated" "$TMP/s_k.txt"; then
  ok "SIGUSR1 to one rank: every rank saved at step $stopped_at and exited 0; the summary says no evaluation ran"
else
  not_ok "SIGUSR1 stop" "exit $rc, stopped at '$stopped_at' (signalled pid $victim; the run's whole output below)"
  sed -e "s/^/    | /" "$TMP/s_k.txt"
fi
run 2 "$TMP/s_r.txt" --config "$TMP/slow.pbtxt" --run-dir "$TMP/s_k" --resume auto || not_ok "SIGUSR1 resume" "exit $?"
h_res=$(hash_of "$TMP/s_r.txt")
[ -n "$h_ref" ] && [ "$h_ref" = "$h_res" ] && ok "SIGUSR1 resume ends bitwise equal to the uninterrupted run ($h_res)" ||
  not_ok "SIGUSR1 bitwise" "uninterrupted $h_ref, resumed $h_res"

# ---- 2b. checkpoint.every_minutes: rank 0's clock, agreed at log steps --------------------------------------------
run 2 "$TMP/m.txt" --config "$TMP/slow.pbtxt" --run-dir "$TMP/m" --set train.steps=200 --set log.every_steps=50 \
  --set checkpoint.every_minutes=0.0001 --set checkpoint.keep_last=0 || not_ok "every_minutes run" "exit $?"
saved=$(ls -d "$TMP/m/checkpoints"/step_* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')
[ "$saved" = "step_00000050 step_00000100 step_00000150 step_00000200 " ] &&
  ok "checkpoint.every_minutes saves at log steps on every rank: $saved" || not_ok "every_minutes" "saved: '$saved'"

# ---- 3. another world size ---------------------------------------------------------------------------------------
saved_hash=$("$AMPDIST" ckpt inspect "$ck/step_00000010" 2>/dev/null | sed -n 's/.*master weights hash[: ]*\([0-9a-f]\{16\}\).*/\1/p' | head -1)
for np in 1 4; do
  mkdir -p "$TMP/w$np/checkpoints" && cp -r "$ck/step_00000010" "$TMP/w$np/checkpoints/"
  run "$np" "$TMP/w$np.txt" "${common[@]}" --run-dir "$TMP/w$np" --resume auto ||
    not_ok "resume on $np ranks" "exit $?: $(tail -2 "$TMP/w$np.txt")"
  got=$(sed -n 's/^resumed from .*saved on 2 ranks, master weights hash \([0-9a-f]\{16\}\)).*/\1/p' "$TMP/w$np.txt")
  [ -n "$got" ] && [ "$got" = "$saved_hash" ] && ok "a 2-rank checkpoint loads on $np rank(s) bitwise ($got)" ||
    not_ok "resume on $np ranks" "loaded hash '$got', saved '$saved_hash'"
done

exit "$FAILED"
