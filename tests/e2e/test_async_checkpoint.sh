#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.async: true) on 2 ranks, through the program:
#  1. bitwise: a run saving every 25 steps asynchronously ends with the master weights hash of the same run saving
#     blocking and of a run saving nothing; its checkpoints of steps 25, 50 and 75 verify, and a run resumed from
#     each of them ends with that same hash;
#  2. kill -9 of rank 1 while its shard of step 50 is being written in the background (held open by
#     fault.slow_save): the job ends non-zero within the timeout, no process is left, step 50 is never published,
#     step 25 verifies, and --resume auto resumes from it and ends with the same hash;
#  3. a full disk on rank 1 during the background write of step 50: with on_save_error CONTINUE one warning, step 50
#     not published, step 25 intact, training finishes; with STOP exit 1, step 25 intact;
#  4. SIGTERM to one rank while step 50 is written in the background (slow_save, 3 s): every rank finishes that save,
#     saves the step it stops at and exits 0; both checkpoints verify.
# Usage: test_async_checkpoint.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" async_ckpt "$@"
run() {  # run OUT ARGS...
  local out=$1
  shift
  timeout 300 mpirun -q --oversubscribe -np 2 "$AMPDIST" train "$@" > "$out" 2>&1 </dev/null
}

fault_job "$TMP/job.pbtxt" 100 0
cfg=(--config "$TMP/job.pbtxt")
SHARD1=shard_00001_of_00002.pb

# ---- 1. bitwise ------------------------------------------------------------------------------------------------------
run "$TMP/none.txt" "${cfg[@]}" --run-dir "$TMP/none" --set checkpoint.every_steps=0 --set checkpoint.save_final=false ||
  not_ok "run without saves" "exit $?"
run "$TMP/block.txt" "${cfg[@]}" --run-dir "$TMP/block" || not_ok "blocking run" "exit $?"
run "$TMP/async.txt" "${cfg[@]}" --run-dir "$TMP/async" --set checkpoint.async=true || not_ok "async run" "exit $?"
h_none=$(hash_of "$TMP/none.txt")
h_block=$(hash_of "$TMP/block.txt")
h_async=$(hash_of "$TMP/async.txt")
if [ -n "$h_none" ] && [ "$h_none" = "$h_block" ] && [ "$h_none" = "$h_async" ]; then
  ok "async saves, blocking saves and no saves end with the same master weights hash ($h_async)"
else
  not_ok "bitwise" "none $h_none, blocking $h_block, async $h_async"
fi
n=$(grep -c "^saved $TMP/async/checkpoints/step_" "$TMP/async.txt")
if [ "$n" -eq 4 ] && "$AMPDIST" ckpt verify "$TMP/async/checkpoints" > "$TMP/verify.txt" 2>&1 &&
  [ "$(grep -c '^ok: ' "$TMP/verify.txt")" -eq 4 ]; then
  ok "the async run published steps 25, 50, 75 and 100, each verifies"
else
  not_ok "async checkpoints" "$n 'saved' lines; $(cat "$TMP/verify.txt" | tr '\n' ' ')"
  show "$TMP/async.txt"
fi
for step in 25 50 75; do
  r="$TMP/resume$step"
  mkdir -p "$r"
  run "$r.txt" "${cfg[@]}" --run-dir "$r" --set checkpoint.async=true \
    --resume "$TMP/async/checkpoints/step_000000$step" || not_ok "resume from $step" "exit $?"
  h=$(hash_of "$r.txt")
  [ -n "$h" ] && [ "$h" = "$h_none" ] && ok "resumed from the async step $step: same hash" ||
    not_ok "resume from the async step $step" "hash $h, want $h_none"
done

# ---- 2. kill -9 during a background write ----------------------------------------------------------------------------
dir="$TMP/kill"
ck="$dir/checkpoints"
( AMPDIST_FAULT='slow_save { step: 50 rank: 1 seconds: 60 }' run "$TMP/kill.txt" "${cfg[@]}" --run-dir "$dir" \
    --set checkpoint.async=true
  echo $? > "$TMP/kill.rc" ) &
for _ in $(seq 1 600); do
  [ -e "$ck/.tmp_step_00000050/$SHARD1" ] && break
  sleep 0.1
done
t0=$(date +%s)
victim=$(pgrep -f "^$AMPDIST train --config $TMP/job.pbtxt --run-dir $dir " | tail -1)
kill -9 "$victim" 2>/dev/null
wait
took=$(($(date +%s) - t0))
rc=$(cat "$TMP/kill.rc")
sleep 0.5
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$took" -lt 60 ] && ! pgrep -f "$dir" > /dev/null &&
  [ ! -e "$ck/step_00000050" ] && "$AMPDIST" ckpt verify "$ck/step_00000025" > /dev/null 2>&1; then
  ok "kill -9 of rank 1 during the background write of step 50: exit $rc after ${took}s, no process left, step 25 verifies"
else
  not_ok "kill -9 during a background write" "exit $rc after ${took}s; $(ls -a "$ck" | tr '\n' ' ')"
  show "$TMP/kill.txt"
fi
run "$TMP/kill_resume.txt" "${cfg[@]}" --run-dir "$dir" --set checkpoint.async=true --resume auto
rc=$?
h=$(hash_of "$TMP/kill_resume.txt")
[ "$rc" -eq 0 ] && grep -q "^resumed from $ck/step_00000025 (step 25" "$TMP/kill_resume.txt" && [ "$h" = "$h_none" ] &&
  ok "--resume auto resumed from step 25 and ended with the same hash" ||
  not_ok "resume after kill -9" "exit $rc, hash $h: $(grep -m1 -e resumed -e error "$TMP/kill_resume.txt")"

# ---- 3. disk full during a background write --------------------------------------------------------------------------
for policy in CONTINUE STOP; do
  dir="$TMP/full_$policy"
  ck="$dir/checkpoints"
  AMPDIST_FAULT='save_error { step: 50 rank: 1 }' run "$TMP/full_$policy.txt" "${cfg[@]}" --run-dir "$dir" \
    --set checkpoint.async=true --set train.steps=75 --set checkpoint.on_save_error=$policy
  rc=$?
  intact=$("$AMPDIST" ckpt verify "$ck/step_00000025" > /dev/null 2>&1 && echo yes)
  out="$TMP/full_$policy.txt"
  if [ "$policy" = CONTINUE ]; then
    [ $rc -eq 0 ] && [ "$intact" = yes ] && [ ! -e "$ck/step_00000050" ] && [ ! -e "$ck/.tmp_step_00000050" ] &&
      [ -d "$ck/step_00000075" ] && [ "$(grep -c '^warning: checkpoint' "$out")" -eq 1 ] &&
      grep -q "^warning: checkpoint .*step_00000050 not saved: rank 1 could not write its shard (.tmp_step_00000050/shard_00001_of_00002.pb): No space left on device" "$out" &&
      ok "disk full during a background write, CONTINUE: one warning, step 25 intact, step 75 saved" ||
      { not_ok "async disk full CONTINUE" "exit $rc, intact '$intact': $(ls -a "$ck" | tr '\n' ' ')"; show "$out"; }
  else
    [ $rc -eq 1 ] && [ "$intact" = yes ] && [ ! -e "$ck/step_00000050" ] && [ ! -e "$ck/step_00000075" ] &&
      grep -q "No space left on device" "$out" &&
      ok "disk full during a background write, STOP: exit 1, step 25 intact" ||
      { not_ok "async disk full STOP" "exit $rc, intact '$intact': $(ls -a "$ck" | tr '\n' ' ')"; show "$out"; }
  fi
done

# ---- 4. SIGTERM to one rank during a background write ----------------------------------------------------------------
dir="$TMP/term"
ck="$dir/checkpoints"
( AMPDIST_FAULT='slow_save { step: 50 rank: 1 seconds: 3 }' run "$TMP/term.txt" "${cfg[@]}" --run-dir "$dir" \
    --set checkpoint.async=true --set log.every_steps=1
  echo $? > "$TMP/term.rc" ) &
for _ in $(seq 1 600); do
  [ -e "$ck/.tmp_step_00000050/$SHARD1" ] && break
  sleep 0.1
done
victim=$(pgrep -f "^$AMPDIST train --config $TMP/job.pbtxt --run-dir $dir " | tail -1)
kill -TERM "$victim" 2>/dev/null
wait
rc=$(cat "$TMP/term.rc")
stopped=$(sed -n 's/^stopping at step \([0-9]*\).*/\1/p' "$TMP/term.txt")
if [ "$rc" = 0 ] && [ -n "$stopped" ] && [ "$stopped" -lt 100 ] && grep -q "^saved $ck/step_00000050 " "$TMP/term.txt" &&
  "$AMPDIST" ckpt verify "$ck/step_00000050" > /dev/null 2>&1 &&
  "$AMPDIST" ckpt verify "$ck/$(printf 'step_%08d' "$stopped")" > /dev/null 2>&1; then
  ok "SIGTERM to rank 1 during the background write of step 50: it was published, step $stopped saved, exit 0"
else
  not_ok "SIGTERM during a background write" "exit $rc, stopped at '$stopped'; $(ls -a "$ck" | tr '\n' ' ')"
  show "$TMP/term.txt"
fi

exit "$FAILED"
