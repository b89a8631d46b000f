#!/usr/bin/env bash
# ampdist on a real SLURM (Debian 12's slurmctld, slurmd, munge; 22.05 with the pmix MPI plugin) of two nodes,
# hostA and hostB, each in its own network namespace joined by veth (tests/e2e/lib/slurm.sh, on top of the
# namespaces of tests/e2e/lib/netns.sh); 2 ranks per node. The main job with fewer steps (300), a checkpoint every
# 50 steps, comm.timeout_s = 10 s:
#  1. `srun -N 2 -n 4 --mpi=pmix` puts ranks 0-1 on hostA and 2-3 on hostB (`ampdist env`) and trains to the test
#     accuracy and master weights hash of `mpirun -np 4` on one host (the CPU backend is deterministic for a world
#     size and placement; srun is given --ntasks-per-node=2, as 3 + 1 ranks per node gave other bits).
#  2. `sbatch launch/slurm/ampdist.sbatch` on 2 nodes, `scontrol requeue` after the first checkpoint: SLURM's
#     SIGTERM makes every rank save at the same step and the script exit 0; the job restarts (restart 1), resumes
#     from that step with --resume auto and ends bitwise equal to the uninterrupted run of 1.
#  3. The script's --signal=B:USR1@300 with --time=5: the warning is due at once and SLURM sends it at its next
#     time-limit check (slurmctld checks every 30 s); every rank (2, one per node) saves at the same step, the job
#     ends COMPLETED with exit code 0 before its limit. It runs next to 1 and 2.
#  4. hostB lost mid-job (its link cut and every process on it killed, as when a node dies): within comm.timeout_s
#     the ranks on hostA stop with one line naming ranks 2 and 3 as silent, the job ends within comm.timeout_s plus
#     SLURM's own detection, no rank is left running, and the last checkpoint verifies intact.
#  5. The same cluster without the pmix plugin: the script falls back to mpirun inside the allocation, across both
#     nodes. Requeued after a checkpoint (SLURM's SIGTERM reaches mpirun too, which ends its ranks, before or after
#     they saved: the newest complete checkpoint is the one resumed), it ends bitwise equal to 1; and the time-limit
#     warning of 3 reaches every rank through mpirun, which save and exit 0.
# OpenMPI's start-up under srun's PMIx fails now and then during MPI_Init in this set-up (1 of 58 short launches,
# before any ampdist code runs): a launch that fails that way, and only that way, is relaunched, at most twice per
# case, and counted in the last line. Needs root (namespaces) and the packages; exits 77 (skipped) saying why
# otherwise. Every daemon, rank and namespace is gone on exit.
# Usage: test_slurm_cluster.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" slurm "$@"
source "$(dirname "$0")/lib/netns.sh"
source "$(dirname "$0")/lib/slurm.sh"
command -v mpirun > /dev/null || skip "mpirun is not installed"
netns_two_hosts
T0=$(date +%s)
slurm_cluster_up || exit 1
echo "# slurm cluster up in $(($(date +%s) - T0)) s: $(on_slurm sinfo -h -N -o '%N=%t' | tr '\n' ' ')"

SB="$SRC/launch/slurm/ampdist.sbatch"
# For every rank, whichever way it starts: MPI's TCP on the veth subnet only; yield because 4 ranks share the cores.
export OMPI_MCA_btl_tcp_if_include=$NET OMPI_MCA_oob_tcp_if_include=$NET OMPI_MCA_mpi_yield_when_idle=1
export AMPDIST_BIN="$AMPDIST" AMPDIST_SRC="$SRC" AMPDIST_RUNS="$TMP/runs"
common=(--set train.steps=300 --set log.every_steps=10 --set checkpoint.every_steps=50 --set comm.timeout_s=10)
cfg=(--config "$SRC/configs/fashion_mnist_mlp.pbtxt")
# The script's #SBATCH lines are for a GPU cluster: 2 nodes x 2 CPU ranks here.
sbatch_args=(--parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --output="$TMP/job-%j.out")
# The end of a job's output without its progress lines, indented (lib.sh's show gives the start).
show_job() { grep -v -E "^(step|phases) " "$1" | tail -25 | sed -e 's/^/    | /'; }
acc_of() { sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' "$1"; }
field() { on_slurm scontrol show job -o "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }  # field JOB NAME
wait_state() {  # wait_state JOB SECONDS STATE...: until the job is in one of the states; prints the state
  local job=$1 limit=$2 s=""
  shift 2
  for _ in $(seq 1 $((limit * 5))); do
    s=$(field "$job" JobState)
    for want in "$@"; do [ "$s" = "$want" ] && { echo "$s"; return 0; }; done
    sleep 0.2
  done
  echo "$s"
  return 1
}
wait_file() {  # wait_file PATH SECONDS
  for _ in $(seq 1 $(($2 * 10))); do
    [ -e "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
# A launch in which some rank died inside MPI_Init: fewer than 4 ranks printed AMPDIST_STARTUP_TRACE's "MPI_Init
# done" line (in a batch job's output, since the script's last start), no ampdist error, and a rank was killed by a
# signal or OpenMPI reported the failed start-up. Anything else is a failure of the test.
export AMPDIST_STARTUP_TRACE=1
RELAUNCHES=0
mpi_init_failed() {  # mpi_init_failed OUTPUT [RANKS (4)]
  local since
  since=$(grep -n "^ampdist.sbatch: job " "$1" | tail -1 | cut -d: -f1)
  tail -n +"${since:-1}" "$1" > "$TMP/last_start.txt"
  [ "$(grep -c '^ampdist: \[rank [0-9]*\] MPI_Init done$' "$TMP/last_start.txt")" -lt "${2:-4}" ] &&
    ! grep -q "^ampdist: error" "$TMP/last_start.txt" &&
    grep -v "MPI_Init done$" "$TMP/last_start.txt" | grep -qE "$MPI_INIT_FAILURE"
}
MPI_INIT_FAILURE='Segmentation fault|Aborted|Process received signal|MPI_Init|PMIX_ERROR'
# relaunch WHAT: counts and reports a relaunch after a failed MPI_Init, with what the failed launch printed.
relaunch() {
  RELAUNCHES=$((RELAUNCHES + 1))
  echo "# relaunch ($1): a rank died in MPI_Init ($(grep -c "MPI_Init done$" "$TMP/last_start.txt") reported it done):"
  grep -v -E "^(step|phases) " "$TMP/last_start.txt" | head -12 | sed 's/^/#   | /'
}
# with_relaunch FUNCTION ARGS...: FUNCTION returns 75 when its launch failed in MPI_Init; up to 3 launches.
with_relaunch() {
  local try rc
  for try in 1 2 3; do
    "$@"
    rc=$?
    [ $rc = 75 ] || return $rc
    relaunch "$1"
  done
  not_ok "$1" "MPI_Init failed in 3 launches in a row"
  return 1
}

SBATCH_N=0
# sbatch_job OUT_VAR ARGS...: submits the batch script; the job id goes to OUT_VAR.
sbatch_job() {
  local _var=$1 _jid
  shift
  # A TMPDIR of its own: the nodes share this machine's /tmp, where two mpiruns starting at once on one node race
  # to create OpenMPI's session directory, /tmp/ompi.<host>.<uid> ("mkdir: File exists", orte_init fails).
  SBATCH_N=$((SBATCH_N + 1))
  mkdir -p "$TMP/t/$SBATCH_N"
  _jid=$(on_slurm sbatch "${sbatch_args[@]}" --export=ALL,TMPDIR="$TMP/t/$SBATCH_N" "$@" 2> "$TMP/sbatch.err") ||
    return 1
  printf -v "$_var" '%s' "${_jid%%;*}"
}
warning_submit() {
  sbatch_job WARN_ID --time=5 --ntasks-per-node=1 "$SB" --set train.steps=1000000 --set log.every_steps=10 \
    --set checkpoint.every_steps=0 --set comm.timeout_s=10
}
WARN_ID=""
warning_submit || WARN_ID=""

# ---- 1. srun -N 2 -n 4 --mpi=pmix against mpirun -np 4 on one host -------------------------------------------
timeout 300 mpirun -q --oversubscribe -np 4 "$AMPDIST" train "${cfg[@]}" "${common[@]}" --run-dir "$TMP/one" \
  > "$TMP/one.txt" 2>&1 || not_ok "mpirun -np 4 on one host" "exit $?: $(tail -2 "$TMP/one.txt")"
h_one=$(hash_of "$TMP/one.txt")
a_one=$(acc_of "$TMP/one.txt")
echo "# mpirun -np 4 (one host): test accuracy $a_one, master weights hash $h_one"

srun_train() {  # srun_train OUT RUN_DIR: the main job through srun
  rm -rf "$2"
  mkdir -p "$TMP/t/srun"
  on_slurm env TMPDIR="$TMP/t/srun" timeout 300 srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix --kill-on-bad-exit=1 \
    "$AMPDIST" train "${cfg[@]}" "${common[@]}" --run-dir "$2" > "$1" 2>&1 && return 0
  mpi_init_failed "$1" && return 75
  return 1
}
srun_env() {
  mkdir -p "$TMP/t/srun"
  on_slurm env TMPDIR="$TMP/t/srun" timeout 60 srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix "$AMPDIST" env --json \
    > "$TMP/env.json" 2> "$TMP/env.err" && return 0
  mpi_init_failed "$TMP/env.err" && return 75
  return 1
}
with_relaunch srun_env
got=$(/usr/bin/python3 - "$TMP/env.json" 2>&1 << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["world_size"], " ".join(f'{r["rank"]}:{r["host"]}:{r["local_rank"]}/{r["local_size"]}' for r in d["ranks"]))
PY
)
want="4 0:hostA:0/2 1:hostA:1/2 2:hostB:0/2 3:hostB:1/2"
[ "$got" = "$want" ] && ok "srun -N 2 -n 4 --mpi=pmix: ranks 0-1 on hostA, 2-3 on hostB, one MPI world" ||
  { not_ok "srun placement" "got '$got', want '$want'"; show "$TMP/env.err"; }

t=$(date +%s)
with_relaunch srun_train "$TMP/srun.txt" "$TMP/srun" || { not_ok "srun -N 2 -n 4 train" "exit $?"; show "$TMP/srun.txt"; }
h_srun=$(hash_of "$TMP/srun.txt")
a_srun=$(acc_of "$TMP/srun.txt")
grep -q "^ampdist train: .* world size 4 (SLURM job [0-9]* step 0 on hostA (SLURM_NTASKS=4, SLURM_NNODES=2" \
  "$TMP/srun.txt" || not_ok "srun launcher" "$(grep '^ampdist train' "$TMP/srun.txt")"
[ -n "$h_one" ] && [ "$h_srun" = "$h_one" ] && [ "$a_srun" = "$a_one" ] &&
  ok "srun -N 2 -n 4 --mpi=pmix ($(($(date +%s) - t)) s): test accuracy $a_srun, master weights $h_srun, as mpirun -np 4" ||
  not_ok "srun vs mpirun" "srun: accuracy $a_srun hash $h_srun; mpirun -np 4: accuracy $a_one hash $h_one"

# requeue_case NAME LAUNCHER: the main job, requeued after its step-50 checkpoint, restarted and finished.
requeue_case() {
  local name=$1 id run out stopped ckpt state n t latest h
  t=$(date +%s)
  sbatch_job id --time=10 "$SB" "${common[@]}" || { not_ok "$name sbatch" "$(cat "$TMP/sbatch.err")"; return; }
  run="$AMPDIST_RUNS/ampdist-$id"
  out="$TMP/job-$id.out"
  if ! wait_file "$run/checkpoints/latest" 120; then
    wait_state "$id" 30 FAILED COMPLETED CANCELLED > /dev/null
    mpi_init_failed "$out" && return 75
    not_ok "$name" "no checkpoint within 120 s (job $(field "$id" JobState))"
    show_job "$out"
    return
  fi
  on_slurm scontrol requeue "$id"
  # SLURM holds a requeued job back (its BeginTime, 2 minutes here); a user starts it at once like this:
  if ! state=$(wait_state "$id" 60 PENDING); then
    not_ok "$name: requeue" "job $id in state $state 60 s after scontrol requeue"
    return
  fi
  latest=$(cat "$run/checkpoints/latest")
  stopped=$(sed -n 's/^stopping at step \([0-9]*\): a rank was asked to stop.*/\1/p' "$out" | head -1)
  ckpt="$run/checkpoints/$latest"
  n=$(find "$ckpt" -name 'shard_*_of_00004.pb' 2> /dev/null | wc -l)
  if [ "$2" = srun ]; then
    # srun passes the SIGTERM on: every rank saves at the step it stops at, and the script exits 0.
    if [ -n "$stopped" ] && [ "$latest" = "step_$(printf %08d "$stopped")" ] && [ "$n" = 4 ] &&
      "$AMPDIST" ckpt verify "$ckpt" > /dev/null 2>&1 &&
      grep -q "^ampdist.sbatch: srun exited with code 0 after SIGTERM" "$out"; then
      ok "$name: scontrol requeue -> SIGTERM -> all 4 ranks saved $latest (verified), the script exited 0"
    else
      not_ok "$name: checkpoint on requeue" "stopped at '$stopped', newest checkpoint $latest with $n of 4 shards"
      show_job "$out"
    fi
  else
    # mpirun ends its ranks on the SIGTERM that SLURM sends every process of the job, before or after they saved
    # at their next log step: the newest complete checkpoint is the one to resume from.
    "$AMPDIST" ckpt verify "$ckpt" > /dev/null 2>&1 && [ "$n" = 4 ] &&
      ok "$name: scontrol requeue stopped the job${stopped:+ (every rank saved step $stopped)}; newest complete checkpoint $latest" ||
      { not_ok "$name: checkpoint on requeue" "newest checkpoint $latest with $n of 4 shards"; show_job "$out"; }
  fi
  on_slurm scontrol update JobId="$id" StartTime=now
  state=$(wait_state "$id" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL)
  [ "$state" != COMPLETED ] && mpi_init_failed "$out" && return 75
  h=$(hash_of "$out" | tail -1)
  if [ "$state" = COMPLETED ] && [ "$(field "$id" Restarts)" = 1 ] &&
    grep -q "^ampdist.sbatch: job $id (restart 1), 2 node(s) x 2 rank(s), launcher $2, run dir $run$" "$out" &&
    grep -q "^resumed from $ckpt (step $((10#${latest#step_})), saved on 4 ranks" "$out" &&
    [ -n "$h_one" ] && [ "$h" = "$h_one" ]; then
    ok "$name ($(($(date +%s) - t)) s): job $id restarted (launcher $2), resumed from $latest, ended with master weights $h = uninterrupted"
  else
    not_ok "$name: restart" "state $state, restarts $(field "$id" Restarts), hash '$h' want $h_one"
    grep -E "^(ampdist.sbatch|resumed|no checkpoint|master weights|stopping)|error" "$out" | show /dev/stdin
  fi
}

# ---- 2. sbatch, scontrol requeue mid-run, restart, --resume auto -------------------------------------------------
with_relaunch requeue_case "sbatch requeue (srun)" srun

# ---- 3. the time-limit warning: --signal=B:USR1@300 with --time=5 ------------------------------------------------
# Checked here; submitted at the start (below case 1's reference run), since SLURM sends the warning only at its next
# 30-s time-limit check: 2 ranks, one per node, next to the other jobs (each node offers 4 CPUs).
warning_case() {  # warning_case LAUNCHER
  local state out stopped ckpt n run_s
  if [ -z "$WARN_ID" ]; then
    warning_submit || { not_ok "time-limit warning sbatch" "$(cat "$TMP/sbatch.err")"; return; }
  fi
  state=$(wait_state "$WARN_ID" 120 COMPLETED FAILED CANCELLED TIMEOUT)
  out="$TMP/job-$WARN_ID.out"
  if [ "$state" != COMPLETED ] && mpi_init_failed "$out" 2; then
    WARN_ID=""
    return 75
  fi
  stopped=$(sed -n 's/^stopping at step \([0-9]*\): a rank was asked to stop.*/\1/p' "$out")
  ckpt="$AMPDIST_RUNS/ampdist-$WARN_ID/checkpoints/step_$(printf %08d "${stopped:-0}")"
  n=$(find "$ckpt" -name 'shard_*_of_00002.pb' 2> /dev/null | wc -l)
  run_s=$(field "$WARN_ID" RunTime)
  if [ "$state" = COMPLETED ] && [ "$(field "$WARN_ID" ExitCode)" = 0:0 ] && [ -n "$stopped" ] && [ "$n" = 2 ] &&
    "$AMPDIST" ckpt verify "$ckpt" > /dev/null 2>&1 &&
    grep -q "^ampdist.sbatch: SIGUSR1: every rank checkpoints" "$out" &&
    grep -q "^ampdist.sbatch: job $WARN_ID (restart 0), 2 node(s) x 1 rank(s), launcher $1," "$out" &&
    grep -q "^ampdist.sbatch: $1 exited with code 0 after SIGUSR1" "$out"; then
    ok "time-limit warning ($1): SIGUSR1 after $run_s of a 5-minute limit, both ranks (2 nodes) saved step $stopped, COMPLETED, exit 0"
  else
    not_ok "time-limit warning ($1)" "state $state, exit $(field "$WARN_ID" ExitCode), stopped at '$stopped', $n of 2 shards"
    show_job "$out"
  fi
}
with_relaunch warning_case srun

# ---- 4. hostB lost mid-job --------------------------------------------------------------------------------------
node_loss_case() {
  local t id run out last pids cut state ended left lines line latest
  t=$(date +%s)
  if sbatch_job id --time=10 --no-requeue "$SB" --set train.steps=1000000 --set log.every_steps=100 \
    --set checkpoint.every_steps=100 --set comm.timeout_s=10; then
    run="$TMP/runs/ampdist-$id"
    out="$TMP/job-$id.out"
    if ! wait_file "$run/checkpoints/latest" 120; then
      wait_state "$id" 30 FAILED COMPLETED CANCELLED > /dev/null
      mpi_init_failed "$out" && return 75
    fi
    if [ -e "$run/checkpoints/latest" ]; then
      last=$(cat "$run/checkpoints/latest")
      # The node dies: its link goes down and every process on it (slurmd, slurmstepd, the ranks) is gone.
      ip -n "$NS_B" link set "$IF_B" down
      pids=$(ip netns pids "$NS_B")
      # shellcheck disable=SC2086  # one pid a word
      kill -9 $pids 2> /dev/null
      cut=$(date +%s)
      state=$(wait_state "$id" 120 FAILED NODE_FAIL CANCELLED COMPLETED TIMEOUT)
      ended=$(($(date +%s) - cut))
      left=""
      for _ in $(seq 1 100); do
        left=$(pgrep -a -f "$run" | grep -v "^$$ " || true)
        [ -z "$left" ] && break
        sleep 0.1
      done
      lines=$(grep -c "silent for" "$out")
      line=$(grep "silent for" "$out")
      # Within comm.timeout_s (10 s) of the cut plus SLURM's detection of the lost node (SlurmdTimeout, 6 s, found
      # by a ping every 2 s, then MessageTimeout/KillWait for the steps' clean-up): 30 s.
      if [ "$state" != COMPLETED ] && [ "$ended" -le 30 ] && [ "$lines" = 1 ] &&
        echo "$line" | grep -q "ranks 2, 3 silent for [0-9.]* s (process or node gone)"; then
        ok "hostB lost after $last: job $id ended $state ${ended} s after the cut with one line: $line"
      else
        not_ok "node lost" "state $state ${ended} s after the cut, $lines 'silent' lines"
        show_job "$out"
      fi
      [ -z "$left" ] && ok "no rank left running after the node loss" || not_ok "node loss leftovers" "$left"
      latest=$(cat "$run/checkpoints/latest")
      "$AMPDIST" ckpt verify "$run/checkpoints/$latest" > "$TMP/verify.txt" 2>&1 &&
        ok "the last checkpoint, $latest, verifies intact" ||
        { not_ok "last checkpoint after the node loss" "$latest"; show "$TMP/verify.txt"; }
    else
      not_ok "node lost" "no checkpoint within 120 s"
      show_job "$out"
    fi
    echo "# node-loss case: $(($(date +%s) - t)) s"
  else
    not_ok "node loss sbatch" "$(cat "$TMP/sbatch.err")"
  fi
}
with_relaunch node_loss_case

# ---- 5. no pmix plugin: the script's mpirun fallback ------------------------------------------------------------
slurm_cluster_down
ip -n "$NS_B" link set "$IF_B" up
export AMPDIST_RUNS="$TMP/runs-nopmix"
if slurm_cluster_up nopmix; then
  if on_slurm srun --mpi=list 2>&1 | grep -q pmix; then
    not_ok "nopmix cluster" "srun --mpi=list still lists pmix"
  else
    WARN_ID=""
    warning_submit || WARN_ID=""
    with_relaunch requeue_case "sbatch requeue (no pmix: mpirun)" mpirun
    with_relaunch warning_case mpirun
  fi
else
  not_ok "nopmix cluster" "did not come up"
fi

echo "# relaunches after a failed MPI_Init: $RELAUNCHES; whole test $(($(date +%s) - T0)) s"
exit "$FAILED"
