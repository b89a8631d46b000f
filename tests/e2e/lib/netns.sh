# shellcheck shell=bash
# Two "hosts" on one machine, for the e2e scripts (sourced after lib.sh, not a test itself):
#   source "$(dirname "$0")/lib/netns.sh"
#   netns_two_hosts            # or exits 77 (CTest: skipped) saying why
#   on_host A COMMAND...       # COMMAND in hostA's namespaces, host name hostA
# Two network namespaces, $NS_A and $NS_B, each with its own host name (a UTS namespace made per command by
# `unshare --uts`), joined by a veth pair $IF_A 10.77.0.1/24 <-> $IF_B 10.77.0.2/24 ($NET = 10.77.0.0/24). Every
# process still in either namespace is killed and both namespaces are removed on exit (netns_cleanup, which runs
# before lib.sh's e2e_cleanup). Needs root's CAP_SYS_ADMIN/CAP_NET_ADMIN.
skip() {
  echo "skipped: $1"
  exit 77
}
NS_A=ampdist_a_$$
NS_B=ampdist_b_$$
IF_A=vethA$$
IF_B=vethB$$
IP_A=10.77.0.1
IP_B=10.77.0.2
NET=10.77.0.0/24
netns_cleanup() {
  local ns pids
  for ns in "$NS_A" "$NS_B"; do
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    # shellcheck disable=SC2086  # one pid a word
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  done
  return 0
}
netns_two_hosts() {
  local tool
  for tool in ip unshare nsenter; do command -v "$tool" > /dev/null || skip "$tool is not installed"; done
  trap 'netns_cleanup; e2e_cleanup' EXIT
  ip netns add "$NS_A" 2> "$TMP/netns.err" || skip "ip netns add failed (needs CAP_SYS_ADMIN): $(head -1 "$TMP/netns.err")"
  ip netns add "$NS_B" || skip "ip netns add failed for the second namespace"
  ip link add "$IF_A" netns "$NS_A" type veth peer name "$IF_B" netns "$NS_B" 2> "$TMP/veth.err" ||
    skip "cannot create a veth pair: $(head -1 "$TMP/veth.err")"
  ip -n "$NS_A" addr add "$IP_A/24" dev "$IF_A" && ip -n "$NS_B" addr add "$IP_B/24" dev "$IF_B" &&
    ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
    ip -n "$NS_A" link set "$IF_A" up && ip -n "$NS_B" link set "$IF_B" up || skip "cannot configure the veth pair"
  ip netns exec "$NS_A" unshare --uts true 2> /dev/null || skip "unshare --uts fails (needs CAP_SYS_ADMIN)"
}
# on_host A|B COMMAND...: COMMAND (exec'd, so it keeps the caller's pid tree) in that host's network namespace with
# host name hostA or hostB. nsenter rather than `ip netns exec`, which mounts a /sys of its own without the cgroup
# file systems that slurmd looks for.
on_host() {
  local ns=$NS_A name=hostA
  [ "$1" = B ] && ns=$NS_B name=hostB
  shift
  nsenter --net="/run/netns/$ns" unshare --uts bash -c 'hostname "$0"; exec "$@"' "$name" "$@"
}
# The processes left in either namespace, as "comm(pid) ...", empty when none.
netns_leftovers() {
  local pid left=""
  for pid in $(ip netns pids "$NS_A" 2> /dev/null) $(ip netns pids "$NS_B" 2> /dev/null); do
    left+="$(cat "/proc/$pid/comm" 2> /dev/null)($pid) "
  done
  echo "$left"
}
