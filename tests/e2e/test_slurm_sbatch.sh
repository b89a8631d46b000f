#!/usr/bin/env bash
# The SLURM batch script launch/slurm/ampdist.sbatch, run as sbatch would run it (bash, SLURM_* set) with a stand-in
# srun on PATH (tests/e2e/standin/srun: starts the step's tasks with mpirun and gives each srun's per-task
# variables), so the script's own logic runs:
#  1. `bash -n` accepts it; the srun line it runs carries --mpi=pmix and --kill-on-bad-exit=1.
#  2. Job 4242 trains the main job (fewer steps) in its own run directory <runs>/ampdist-4242; SIGUSR1 to the batch
#     script (SLURM's --signal=B:USR1 warning before the time limit) reaches every rank, which checkpoint at the same
#     step and exit 0.
#  3. The job requeued (same job id, SLURM_RESTART_COUNT=1) resumes from that checkpoint (--resume auto) and ends
#     with the master weights of an uninterrupted mpirun run of the same config, bitwise.
#  4. Another job id gets a fresh run directory; without a PMIx plugin the script falls back to mpirun (each rank
#     bound to its --cpus-per-task cores).
#  5. The ranks under the stand-in see SLURM's variables, which agree with MPI (the run would stop otherwise).
# Usage: test_slurm_sbatch.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" sbatch "$@"
SB="$SRC/launch/slurm/ampdist.sbatch"
bash -n "$SB" && ok "bash -n $SB" || not_ok "bash -n" "syntax errors in $SB"

export PATH="$SRC/tests/e2e/standin:$PATH"
export SLURM_JOB_NAME=ampdist SLURM_NNODES=1 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_SUBMIT_DIR="$SRC"
export AMPDIST_BIN="$AMPDIST" AMPDIST_RUNS="$TMP/runs" SRUN_STANDIN_LOG="$TMP/srun.log"
unset SLURM_RESTART_COUNT SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID AMPDIST_RUN_DIR AMPDIST_LAUNCHER AMPDIST_CONFIG
args=(--set train.steps=300 --set log.every_steps=20 --set checkpoint.every_steps=1000)

# The reference: the same config, uninterrupted, 2 ranks.
timeout 300 mpirun -q --oversubscribe -np 2 "$AMPDIST" train --config "$SRC/configs/fashion_mnist_mlp.pbtxt" \
  "${args[@]}" --run-dir "$TMP/ref" > "$TMP/ref.txt" 2>&1 || not_ok "reference run" "exit $?: $(tail -2 "$TMP/ref.txt")"
h_ref=$(hash_of "$TMP/ref.txt")

# ---- 1-2. job 4242, warned before its time limit ---------------------------------------------------------------
( SLURM_JOB_ID=4242 timeout 300 bash "$SB" "${args[@]}" > "$TMP/j1.txt" 2>&1; echo $? > "$TMP/j1.rc" ) &
for _ in $(seq 1 600); do  # until training is under way
  grep -q "^step " "$TMP/j1.txt" 2> /dev/null && break
  sleep 0.1
done
batch=$(pgrep -f "^bash $SB" | head -1)
[ -n "$batch" ] && kill -USR1 "$batch"
wait
rc=$(cat "$TMP/j1.rc")
run="$TMP/runs/ampdist-4242"
stopped=$(sed -n 's/^stopping at step \([0-9]*\).*/\1/p' "$TMP/j1.txt")
if [ "$rc" = 0 ] && [ -n "$stopped" ] && [ "$stopped" -lt 300 ] && [ -d "$run/checkpoints/step_$(printf %08d "$stopped")" ]; then
  ok "job 4242: SIGUSR1 to the batch script -> every rank checkpointed step $stopped in $run and exited 0"
else
  not_ok "job 4242 SIGUSR1" "exit $rc, stopped at '$stopped', checkpoints: $(ls "$run/checkpoints" 2>&1 | tr '\n' ' ')"
  show "$TMP/j1.txt"
fi
line=$(grep -v -- "--mpi=list" "$TMP/srun.log" | head -1)
case "$line" in
  *--mpi=pmix*--kill-on-bad-exit=1*--ntasks=2*--ntasks-per-node=2*"$AMPDIST train --config"*"--run-dir $run --resume auto"*)
    ok "srun line: $line" ;;
  *) not_ok "srun line" "'$line'" ;;
esac
grep -q "^ampdist train: .* world size 2 (SLURM job 4242 step 0 (SLURM_NTASKS=2, SLURM_NNODES=1, SLURM_LOCALID=0))" \
  "$TMP/j1.txt" && ok "ranks started through srun see SLURM's variables, consistent with MPI" ||
  not_ok "SLURM variables" "$(grep '^ampdist train' "$TMP/j1.txt")"

# ---- 3. requeued: same job id ----------------------------------------------------------------------------------
SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=1 timeout 300 bash "$SB" "${args[@]}" > "$TMP/j2.txt" 2>&1 ||
  not_ok "requeued job" "exit $?: $(tail -3 "$TMP/j2.txt")"
h_j2=$(hash_of "$TMP/j2.txt")
grep -q "^resumed from $run/checkpoints/step_$(printf %08d "${stopped:-0}") (step ${stopped:-0}," "$TMP/j2.txt" &&
  [ -n "$h_ref" ] && [ "$h_j2" = "$h_ref" ] &&
  ok "requeued job 4242 resumed from step $stopped and ended bitwise equal to the uninterrupted run ($h_j2)" ||
  not_ok "requeue resume" "$(grep -E '^(resumed|no checkpoint)' "$TMP/j2.txt"); hash $h_j2, uninterrupted $h_ref"
grep -q "^ampdist.sbatch: job 4242 (restart 1)" "$TMP/j2.txt" && ok "the script reports the restart count" ||
  not_ok "restart count" "$(grep '^ampdist.sbatch' "$TMP/j2.txt")"

# ---- 4. another job, no PMIx: mpirun fallback ------------------------------------------------------------------
SLURM_JOB_ID=4243 SLURM_CPUS_PER_TASK=1 SRUN_STANDIN_NO_PMIX=1 OMPI_MCA_rmaps_base_oversubscribe=1 timeout 300 bash "$SB" \
  --set train.steps=20 --set log.every_steps=10 > "$TMP/j3.txt" 2>&1 || not_ok "job 4243" "exit $?: $(tail -3 "$TMP/j3.txt")"
grep -q "launcher mpirun, run dir $TMP/runs/ampdist-4243$" "$TMP/j3.txt" &&
  grep -q "^no checkpoint in $TMP/runs/ampdist-4243/checkpoints: starting fresh" "$TMP/j3.txt" &&
  grep -q "^master weights hash: " "$TMP/j3.txt" &&
  ok "job 4243 without PMIx: mpirun fallback, a fresh run directory, trained to the end" ||
  { not_ok "job 4243" "see below"; show "$TMP/j3.txt"; }

exit "$FAILED"
