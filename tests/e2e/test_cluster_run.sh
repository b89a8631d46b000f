#!/usr/bin/env bash
# docker-compose.yml's head script, launch/docker/cluster_run.sh, run for real without a container engine: three
# network namespaces stand for the head and the two workers (own host name each, an eth0 on one bridge,
# 10.78.0.0/24), and an `ssh` stand-in on PATH enters the namespace of the host it is asked for (`ip netns exec`)
# where the real ssh would log in to the container. The script waits for the workers, prints `ampdist env` over them
# and trains the main job (fewer steps) on 2 workers x 2 ranks:
#  1. its `ampdist env` report shows ranks 0-1 on worker1 and 2-3 on worker2, and MPI and NCCL on eth0 only;
#  2. the run ends with the test accuracy and master weights hash of the same config on 4 ranks of one host;
#  3. run again (docker-compose up a second time), it resumes from the run directory's final checkpoint.
# Needs root (ip netns add, unshare --uts); exits 77 (skipped) with the reason otherwise.
# Usage: test_cluster_run.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" cluster_run "$@"

skip() {
  echo "skipped: $1"
  exit 77
}
for tool in ip unshare mpirun; do command -v "$tool" > /dev/null || skip "$tool is not installed"; done
hosts=(head worker1 worker2)
declare -A NS
for h in "${hosts[@]}" switch; do NS[$h]=ampdist_${h}_$$; done
netns_cleanup() {
  local ns pids
  for ns in "${NS[@]}"; do
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    # shellcheck disable=SC2086  # one pid a word
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  done
  return 0
}
trap 'netns_cleanup; e2e_cleanup' EXIT
ip netns add "${NS[switch]}" 2> "$TMP/netns.err" || skip "ip netns add failed (needs CAP_SYS_ADMIN): $(head -1 "$TMP/netns.err")"
ip -n "${NS[switch]}" link add br0 type bridge && ip -n "${NS[switch]}" link set br0 up || skip "cannot create a bridge"
i=0
for h in "${hosts[@]}"; do
  i=$((i + 1))
  ns=${NS[$h]}
  ip netns add "$ns" || skip "ip netns add failed"
  # Created under temporary names, renamed to eth0 inside the host's namespace (as in a container).
  ip link add "ch$i$$" netns "$ns" type veth peer name "sw$i$$" netns "${NS[switch]}" || skip "cannot create veth pairs"
  ip -n "$ns" link set "ch$i$$" name eth0 && ip -n "$ns" addr add "10.78.0.$i/24" dev eth0 &&
    ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up &&
    ip -n "${NS[switch]}" link set "sw$i$$" master br0 && ip -n "${NS[switch]}" link set "sw$i$$" up ||
    skip "cannot configure $h's eth0"
done
ip netns exec "${NS[head]}" unshare --uts true 2> /dev/null || skip "unshare --uts fails (needs CAP_SYS_ADMIN)"

mkdir -p "$TMP/bin"
ln -s "$AMPDIST" "$TMP/bin/ampdist"
cat > "$TMP/bin/ssh" << EOF
#!/usr/bin/env bash
# ssh [-o OPTION]... HOST COMMAND...: COMMAND in HOST's namespaces instead of a login.
while [ \$# -gt 0 ]; do
  case "\$1" in
    -o | -p | -l | -i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=\$1
shift
case "\$host" in
  worker1) ns=${NS[worker1]} ;;
  worker2) ns=${NS[worker2]} ;;
  head) ns=${NS[head]} ;;
  *) echo "ssh: Could not resolve hostname \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts bash -c "hostname \$host; \$*"
EOF
chmod +x "$TMP/bin/ssh"

cfg="$SRC/configs/fashion_mnist_mlp.pbtxt"
extra="--set train.steps=100 --set log.every_steps=50"
head_run() {  # head_run OUT: cluster_run.sh as the head container runs it, with the compose file's settings
  timeout 300 ip netns exec "${NS[head]}" unshare --uts bash -c 'hostname head; exec "$@"' head \
    env PATH="$TMP/bin:$PATH" AMPDIST_HOSTS="worker1 worker2" AMPDIST_RANKS_PER_NODE=2 AMPDIST_CONFIG="$cfg" \
    AMPDIST_ARGS="$extra" AMPDIST_RUN_DIR="$TMP/runs/compose" OMPI_MCA_mpi_yield_when_idle=1 \
    bash "$SRC/launch/docker/cluster_run.sh" > "$1" 2>&1
}
head_run "$TMP/c1.txt" || { not_ok "cluster_run.sh" "exit $?"; show "$TMP/c1.txt"; }

# ---- 1. the env report -----------------------------------------------------------------------------------------
for want in "^host worker1 (ranks 0-1)$" "^host worker2 (ranks 2-3)$" "^    rank 3 local rank 1 of 2 -> " \
  "^  MPI TCP:       eth0 (OMPI_MCA_btl_tcp_if_include=eth0)$" "^  NCCL sockets:  eth0 (NCCL_SOCKET_IFNAME=eth0)$"; do
  grep -q "$want" "$TMP/c1.txt" || { not_ok "cluster env report" "no line matching '$want'"; show "$TMP/c1.txt"; }
done
grep -q "^host head" "$TMP/c1.txt" && not_ok "cluster env report" "a rank ran on the head"
[ "$FAILED" = 0 ] && ok "cluster_run.sh: ampdist env shows 2 ranks on each worker, MPI and NCCL on eth0"

# ---- 2. against one host ----------------------------------------------------------------------------------------
# shellcheck disable=SC2086  # extra: arguments
timeout 300 mpirun -q --oversubscribe -np 4 "$AMPDIST" train --config "$cfg" $extra --run-dir "$TMP/one" \
  > "$TMP/one.txt" 2>&1 || not_ok "single-host run" "exit $?"
h_one=$(hash_of "$TMP/one.txt")
h_c1=$(hash_of "$TMP/c1.txt")
acc() { sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' "$1"; }
[ -n "$h_one" ] && [ "$h_c1" = "$h_one" ] && [ "$(acc "$TMP/c1.txt")" = "$(acc "$TMP/one.txt")" ] &&
  ok "2 workers x 2 ranks: test accuracy $(acc "$TMP/c1.txt"), master weights $h_c1, as 4 ranks on one host" ||
  not_ok "cluster vs one host" "cluster $(acc "$TMP/c1.txt") $h_c1, one host $(acc "$TMP/one.txt") $h_one"

# ---- 3. up again -------------------------------------------------------------------------------------------------
head_run "$TMP/c2.txt" || not_ok "second cluster_run.sh" "exit $?"
grep -q "^resumed from $TMP/runs/compose/checkpoints/step_00000100 (step 100," "$TMP/c2.txt" &&
  [ "$(hash_of "$TMP/c2.txt")" = "$h_c1" ] && ok "run again: resumed from step 100 of the shared run directory" ||
  { not_ok "second run" "did not resume from step 100"; show "$TMP/c2.txt"; }

exit "$FAILED"
