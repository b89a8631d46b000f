#!/usr/bin/env bash
# Multi-node runs without nodes: two network namespaces ("hostA", "hostB", each with its own host name through a UTS
# namespace) joined by a veth pair, 10.77.0.1/24 <-> 10.77.0.2/24. mpirun runs inside hostA and reaches hostB through
# an rsh agent that enters hostB's namespaces (`ip netns exec`) instead of ssh; OpenMPI's TCP traffic (the BTL and
# the runtime's out-of-band channel) is restricted to the veth subnet; 2 ranks per host.
#  1. `ampdist env` across the two hosts: ranks 0-1 on hostA and 2-3 on hostB, local ranks 0,1 on each, MPI's TCP on
#     the veth interface only.
#  2. The main job (fewer steps) on 2 hosts x 2 ranks ends with the test accuracy and master weights hash of the same
#     config on 4 ranks of one host (the CPU backend is deterministic: same world size, same bits).
#  3. hostB cut off mid-run (its veth link down after the step-100 checkpoint): the job stops, no rank left running
#     in either namespace, within 60 s; --resume auto on both hosts then finishes the run with the single-host
#     run's accuracy and hash.
# Needs root's CAP_SYS_ADMIN/CAP_NET_ADMIN (ip netns add, unshare --uts); without them it exits 77 (CTest: skipped)
# and says why. Namespaces are removed on exit.
# Usage: test_netns.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" netns "$@"

source "$(dirname "$0")/lib/netns.sh"
command -v mpirun > /dev/null || skip "mpirun is not installed"
netns_two_hosts

# OpenMPI's launcher agent: called as `agent HOST COMMAND...` where ssh would be; runs COMMAND in HOST's namespaces.
cat > "$TMP/agent.sh" << EOF
#!/usr/bin/env bash
host=\$1
shift
case "\$host" in
  10.77.0.1) ns=$NS_A name=hostA ;;
  10.77.0.2) ns=$NS_B name=hostB ;;
  *) echo "agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts bash -c "hostname \$name; \$*"
EOF
chmod +x "$TMP/agent.sh"
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' > "$TMP/hosts"

# Run "mpirun ... ARGS" in hostA. The keepalive settings let mpirun and the daemons notice a host that dropped off
# the network within seconds (OpenMPI's defaults wait 300 s + 9 x 20 s); yield_when_idle because the 4 ranks share
# this machine's cores.
on_two_hosts() {  # on_two_hosts TIMEOUT OUT ARGS...
  local limit=$1 out=$2
  shift 2
  timeout "$limit" ip netns exec "$NS_A" unshare --uts bash -c 'hostname hostA; exec "$@"' two-hosts \
    env OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 OMPI_MCA_oob_tcp_if_include=10.77.0.0/24 \
    OMPI_MCA_oob_tcp_keepalive_time=2 OMPI_MCA_oob_tcp_keepalive_intvl=1 OMPI_MCA_oob_tcp_keepalive_probes=3 \
    OMPI_MCA_mpi_yield_when_idle=1 \
    mpirun -q --hostfile "$TMP/hosts" -np 4 --map-by ppr:2:node --mca plm_rsh_agent "$TMP/agent.sh" "$@" \
    > "$out" 2>&1
}
acc_of() { sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' "$1"; }

# ---- 1. ampdist env across the hosts ---------------------------------------------------------------------------
if on_two_hosts 60 "$TMP/env.json" "$AMPDIST" env --json; then
  got=$(/usr/bin/python3 - "$TMP/env.json" "$IF_A" "$IF_B" << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ifname = {"hostA": sys.argv[2], "hostB": sys.argv[3]}
print(d["world_size"], " ".join(f'{r["rank"]}:{r["host"]}:{r["local_rank"]}/{r["local_size"]}:'
      f'{",".join(r["network"]["mpi_tcp"])}={ifname[r["host"]]}' for r in d["ranks"]))
PY
  )
  want="4 0:hostA:0/2:$IF_A=$IF_A 1:hostA:1/2:$IF_A=$IF_A 2:hostB:0/2:$IF_B=$IF_B 3:hostB:1/2:$IF_B=$IF_B"
  [ "$got" = "$want" ] && ok "ampdist env: ranks 0-1 on hostA, 2-3 on hostB, MPI TCP on the veth only" ||
    not_ok "env across hosts" "got '$got', want '$want'"
else
  not_ok "env across hosts" "exit $?"
  show "$TMP/env.json"
fi

# ---- 2. two hosts against one -----------------------------------------------------------------------------------
cfg="$SRC/configs/fashion_mnist_mlp.pbtxt"
common=(--config "$cfg" --set train.steps=300 --set log.every_steps=50 --set checkpoint.every_steps=100
  --set comm.timeout_s=10)
timeout 300 mpirun -q --oversubscribe -np 4 "$AMPDIST" train "${common[@]}" --run-dir "$TMP/one" > "$TMP/one.txt" 2>&1 ||
  not_ok "single-host run" "exit $?: $(tail -2 "$TMP/one.txt")"
h_one=$(hash_of "$TMP/one.txt")
a_one=$(acc_of "$TMP/one.txt")
on_two_hosts 300 "$TMP/two.txt" "$AMPDIST" train "${common[@]}" --run-dir "$TMP/two" ||
  { not_ok "two-host run" "exit $?"; show "$TMP/two.txt"; }
h_two=$(hash_of "$TMP/two.txt")
a_two=$(acc_of "$TMP/two.txt")
[ -n "$h_one" ] && [ "$h_one" = "$h_two" ] && [ "$a_one" = "$a_two" ] &&
  ok "2 hosts x 2 ranks: test accuracy $a_two and master weights $h_two, as on 1 host x 4 ranks" ||
  not_ok "two hosts vs one" "one host: accuracy $a_one hash $h_one; two hosts: accuracy $a_two hash $h_two"

# ---- 3. hostB cut off mid-run, then resume ----------------------------------------------------------------------
( on_two_hosts 300 "$TMP/cut.txt" "$AMPDIST" train "${common[@]}" --run-dir "$TMP/cut"; echo $? > "$TMP/cut.rc" ) &
for _ in $(seq 1 600); do  # until the step-100 checkpoint is published
  [ -e "$TMP/cut/checkpoints/latest" ] && break
  sleep 0.1
done
ip -n "$NS_B" link set "$IF_B" down
cut_at=$(date +%s)
for _ in $(seq 1 600); do
  [ -e "$TMP/cut.rc" ] && break
  sleep 0.1
done
stopped_after=$(($(date +%s) - cut_at))
rc=$(cat "$TMP/cut.rc" 2> /dev/null || echo "still running")
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != "still running" ]; then
  ok "hostB cut off after $(cat "$TMP/cut/checkpoints/latest"): the job stopped in ${stopped_after} s (exit $rc)"
else
  not_ok "cut-off stops the job" "exit $rc after ${stopped_after} s (124 or still running = hang; 0 = never noticed)"
  show "$TMP/cut.txt"
fi
wait
# mpirun returns as soon as it has given up on hostB; hostB's ranks, cut off from it, end by their own watchdog
# (comm.timeout_s = 10 s after their last collective began) or when their daemon notices the lost link. Allow that
# long plus margin before calling anything a leftover.
left=""
for _ in $(seq 1 200); do
  left=$(netns_leftovers)
  [ -z "$left" ] && break
  sleep 0.1
done
gone_after=$(($(date +%s) - cut_at))
[ -z "$left" ] && ok "no rank or daemon left running on either host ${gone_after} s after the cut" ||
  not_ok "leftovers ${gone_after} s after the cut (comm.timeout_s is 10 s)" "$left"

ip -n "$NS_B" link set "$IF_B" up
on_two_hosts 300 "$TMP/resume.txt" "$AMPDIST" train "${common[@]}" --run-dir "$TMP/cut" --resume auto ||
  { not_ok "resume after the cut" "exit $?"; show "$TMP/resume.txt"; }
from=$(sed -n 's/^resumed from .*\/\(step_[0-9]*\) .*/\1/p' "$TMP/resume.txt")
h_res=$(hash_of "$TMP/resume.txt")
a_res=$(acc_of "$TMP/resume.txt")
[ -n "$from" ] && [ -n "$h_one" ] && [ "$h_res" = "$h_one" ] && [ "$a_res" = "$a_one" ] &&
  ok "--resume auto from $from on both hosts finishes with accuracy $a_res and master weights $h_res" ||
  not_ok "resume after the cut" "resumed from '$from': accuracy $a_res hash $h_res, want $a_one $h_one"

exit "$FAILED"
