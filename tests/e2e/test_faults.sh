#!/usr/bin/env bash
# Fault drills on whole runs (faults switched on through AMPDIST_FAULT or an external signal, never by editing code):
#  1. kill: one rank SIGKILLed at a random moment (externally) and at a random step (AMPDIST_FAULT kill), on 2 and
#     4 ranks: the job exits non-zero within the timeout, no ampdist process remains, and --resume auto finishes
#     with master weights bitwise equal to the uninterrupted run;
#  2. stall: a rank sleeping past comm.timeout_s stops the job with a message naming the step, the collective and the
#     rank that did not arrive;
#  3. save error (a full disk on one rank): CONTINUE keeps training with the previous checkpoint intact; STOP stops
#     with exit code 1, previous checkpoint intact;
#  4. max_consecutive_skips: non-finite gradients at every step stop the run with a message naming the limit;
#  5. poisoned input on one rank with on_nonfinite DROP_RANK: no step skipped, the drop counted in metrics.jsonl;
#  6. SIGTERM to mpirun while a checkpoint is being written (rank 1's shard held open by fault.slow_save): mpirun passes
#     it on and ends the ranks about a second later, before the save completes. Rank 0 says at once what was being
#     written and which checkpoint is the newest complete one; that one verifies and --resume auto resumes from it.
# Usage: test_faults.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" faults "$@"
run() {  # run NP OUT ARGS...
  local np=$1 out=$2
  shift 2
  timeout 300 mpirun -q --oversubscribe -np "$np" "$AMPDIST" train "$@" > "$out" 2>&1
}
no_leftovers() {  # no_leftovers TAG DIR
  sleep 0.5
  if pgrep -f "$2" > /dev/null; then not_ok "$1" "ampdist processes left running"; else ok "$1: no process left"; fi
}

fault_job "$TMP/job.pbtxt" 300 2
cfg=(--config "$TMP/job.pbtxt")

for np in 2 4; do
  run "$np" "$TMP/ref$np.txt" "${cfg[@]}" --run-dir "$TMP/ref$np" || not_ok "reference run on $np ranks" "exit $?"
  ref=$(hash_of "$TMP/ref$np.txt")

  # 1a. external SIGKILL of one rank at a random moment after training started: once a random one of the step lines
  # (50 .. 200) is out, after up to 90 ms more. A run faster than that on this machine is tried again from a fresh
  # run directory, killed at the first line with no delay (at most 3 tries).
  dir="$TMP/kill$np"
  target=$(( 50 * (1 + RANDOM % 4) ))
  delay="0.0$((RANDOM % 10))"
  for try in 1 2 3; do
    rm -rf "$dir" "$TMP/kill$np.txt"
    ( run "$np" "$TMP/kill$np.txt" "${cfg[@]}" --run-dir "$dir"; echo $? > "$TMP/kill$np.rc" ) &
    for _ in $(seq 1 2000); do grep -Eq "^step +$target/" "$TMP/kill$np.txt" 2>/dev/null && break; sleep 0.005; done
    sleep "$delay"
    victim=$(pgrep -f "^$AMPDIST train --config $TMP/job.pbtxt --run-dir $dir\$" | shuf -n 1)
    start=$(date +%s)
    kill -9 "$victim" 2>/dev/null
    wait
    grep -q "^master weights hash" "$TMP/kill$np.txt" || break
    target=50
    delay=0
  done
  rc=$(cat "$TMP/kill$np.rc")
  took=$(( $(date +%s) - start ))
  if grep -q "^master weights hash" "$TMP/kill$np.txt"; then
    not_ok "kill on $np ranks" "the run finished before the kill; nothing was tested"
  elif [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ]; then
    ok "kill -9 of one of $np ranks: the job exits $rc within ${took}s"
  else
    not_ok "kill on $np ranks" "exit $rc after ${took}s"
  fi
  no_leftovers "kill on $np ranks" "$dir"
  run "$np" "$TMP/kill$np.r.txt" "${cfg[@]}" --run-dir "$dir" --resume auto || not_ok "resume after kill" "exit $?"
  got=$(hash_of "$TMP/kill$np.r.txt")
  [ -n "$ref" ] && [ "$ref" = "$got" ] && ok "resume after the kill on $np ranks ends bitwise equal ($got, $(grep -o 'step [0-9]*,' "$TMP/kill$np.r.txt" | head -1))" ||
    not_ok "resume after kill on $np ranks" "uninterrupted $ref, resumed $got"

  # 1b. AMPDIST_FAULT kill at a random step on the last rank
  step=$((30 + RANDOM % 200))
  dir="$TMP/fkill$np"
  AMPDIST_FAULT="kill { step: $step rank: $((np - 1)) }" run "$np" "$TMP/fkill$np.txt" "${cfg[@]}" --run-dir "$dir"
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "kills itself at step $step" "$TMP/fkill$np.txt" &&
    ok "AMPDIST_FAULT kill at step $step on $np ranks: exit $rc" || not_ok "fault kill" "exit $rc: $(tail -2 "$TMP/fkill$np.txt")"
  no_leftovers "fault kill on $np ranks" "$dir"
  run "$np" "$TMP/fkill$np.r.txt" "${cfg[@]}" --run-dir "$dir" --resume auto || not_ok "resume after fault kill" "exit $?"
  got=$(hash_of "$TMP/fkill$np.r.txt")
  [ "$ref" = "$got" ] && ok "resume after the step-$step kill ends bitwise equal" ||
    not_ok "resume after fault kill on $np ranks" "uninterrupted $ref, resumed $got"
done

# 2. stall
start=$(date +%s)
AMPDIST_FAULT='stall { step: 5 rank: 1 seconds: 120 }' run 2 "$TMP/stall.txt" "${cfg[@]}" --run-dir "$TMP/stall" \
  --set comm.timeout_s=3
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 60 ] &&
   grep -q "\[rank 0\] step 5: .* did not complete within 3 s (comm.timeout_s); ranks that did not arrive: 1 (at step 4)" "$TMP/stall.txt"; then
  ok "stalled rank: stopped after ${took}s: $(grep 'did not complete' "$TMP/stall.txt" | head -1)"
else
  not_ok "stall" "exit $rc after ${took}s: $(cat "$TMP/stall.txt" | head -3)"
fi
no_leftovers "stall" "$TMP/stall"

# 3. save error on one rank
for policy in CONTINUE STOP; do
  dir="$TMP/save_$policy"
  AMPDIST_FAULT='save_error { step: 50 rank: 1 }' run 2 "$TMP/save_$policy.txt" "${cfg[@]}" --run-dir "$dir" \
    --set train.steps=75 --set checkpoint.keep_last=0 --set checkpoint.on_save_error=$policy
  rc=$?
  ck="$dir/checkpoints"
  intact=$("$AMPDIST" ckpt verify "$ck/step_00000025" > /dev/null 2>&1 && echo yes)
  if [ "$policy" = CONTINUE ]; then
    [ $rc -eq 0 ] && [ "$intact" = yes ] && [ ! -e "$ck/step_00000050" ] && [ ! -e "$ck/.tmp_step_00000050" ] &&
      [ -d "$ck/step_00000075" ] && grep -q "^warning: checkpoint .*step_00000050 not saved: rank 1 could not write its shard (.tmp_step_00000050/shard_00001_of_00002.pb): No space left on device" "$TMP/save_$policy.txt" &&
      ok "disk full during a save, CONTINUE: warned, step 25 intact, training finished" ||
      not_ok "save error CONTINUE" "exit $rc, intact '$intact': $(ls -a "$ck" | tr '\n' ' ') $(grep warning "$TMP/save_$policy.txt")"
  else
    [ $rc -eq 1 ] && [ "$intact" = yes ] && [ ! -e "$ck/step_00000050" ] && [ ! -e "$ck/step_00000075" ] &&
      grep -q "No space left on device" "$TMP/save_$policy.txt" &&
      ok "disk full during a save, STOP: exit 1, step 25 intact" ||
      not_ok "save error STOP" "exit $rc, intact '$intact': $(ls -a "$ck" | tr '\n' ' ')"
  fi
done

# 4. consecutive skips
inject=""
for s in 3 4 5 6 7 8 9; do inject="$inject inject_nonfinite { step: $s rank: 0 target: GRADIENT value: QNAN }"; done
AMPDIST_FAULT="$inject" run 2 "$TMP/skips.txt" "${cfg[@]}" --run-dir "$TMP/skips" --precision bf16 \
  --set precision.max_consecutive_skips=5
rc=$?
[ $rc -eq 1 ] && grep -q "5 consecutive steps had non-finite gradients .*precision.max_consecutive_skips = 5" "$TMP/skips.txt" &&
  ok "max_consecutive_skips: stopped with exit 1 after 5 skipped steps" || not_ok "skip limit" "exit $rc: $(tail -2 "$TMP/skips.txt")"

# 5. poisoned input, DROP_RANK
AMPDIST_FAULT='inject_nonfinite { step: 5 rank: 1 target: INPUT value: QNAN }' run 2 "$TMP/drop.txt" "${cfg[@]}" \
  --run-dir "$TMP/drop" --set train.steps=20 --set precision.on_nonfinite=DROP_RANK || not_ok "drop_rank run" "exit $?"
python3 - "$TMP/drop/metrics.jsonl" <<'PY' && ok "DROP_RANK: no skipped step, one dropped rank-step in metrics.jsonl" || not_ok "drop_rank metrics" "see above"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
assert s["skipped_steps"] == 0 and s["dropped_rank_steps"] == 1, s
PY

# 6. SIGTERM to mpirun during a checkpoint write
dir="$TMP/sigterm"
ck="$dir/checkpoints"
( AMPDIST_FAULT='slow_save { step: 50 rank: 1 seconds: 60 }' run 2 "$TMP/sigterm.txt" "${cfg[@]}" --run-dir "$dir" \
    --set train.steps=75 --set checkpoint.keep_last=0
  echo $? > "$TMP/sigterm.rc" ) &
for _ in $(seq 1 600); do  # rank 1's shard of step 50 exists: it is now held open for 60 s
  [ -e "$ck/.tmp_step_00000050/shard_00001_of_00002.pb" ] && break
  sleep 0.1
done
pkill -TERM -f "^mpirun -q --oversubscribe -np 2 $AMPDIST train --config $TMP/job.pbtxt --run-dir $dir( |$)"
wait
rc=$(cat "$TMP/sigterm.rc")
want="ampdist: SIGTERM received while writing checkpoint $ck/step_00000050: the ranks finish it, then save and stop"
want2="if the job is ended before $ck/step_00000050 is published, the newest complete checkpoint is $ck/step_00000025"
n=$(grep -c "SIGTERM" "$TMP/sigterm.txt")
if [ "$rc" != 0 ] && [ "$n" -eq 1 ] && grep -Fq "$want" "$TMP/sigterm.txt" && grep -Fq "$want2" "$TMP/sigterm.txt" &&
  [ ! -e "$ck/step_00000050" ] && "$AMPDIST" ckpt verify "$ck/step_00000025" > /dev/null 2>&1; then
  ok "SIGTERM to mpirun during the save of step 50: exit $rc, one line naming it and step 25 (which verifies)"
else
  not_ok "SIGTERM during a save" "exit $rc, $n lines mention SIGTERM; $(ls -a "$ck" | tr '\n' ' ')"
  show "$TMP/sigterm.txt"
fi
no_leftovers "SIGTERM during a save" "$dir"
run 2 "$TMP/sigterm_resume.txt" "${cfg[@]}" --run-dir "$dir" --set train.steps=75 --set checkpoint.keep_last=0 \
  --resume auto
rc=$?
[ $rc -eq 0 ] && grep -q "^resumed from $ck/step_00000025 (step 25" "$TMP/sigterm_resume.txt" &&
  ok "after it, --resume auto resumed from step 25 and finished" ||
  not_ok "resume after SIGTERM during a save" "exit $rc: $(grep -m1 -e resumed -e error "$TMP/sigterm_resume.txt")"

exit "$FAILED"
