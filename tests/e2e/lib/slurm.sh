# shellcheck shell=bash
# A real SLURM cluster of two nodes on one machine, for the e2e scripts (sourced after lib.sh and lib/netns.sh, not a
# test itself):
#   slurm_cluster_up [nopmix]   # or exits 77 (CTest: skipped) saying why
#   on_slurm COMMAND...         # a SLURM client command (sbatch, srun, scontrol, ...) on hostA
#   slurm_cluster_down          # every daemon stopped (also done on exit)
# Debian 12's SLURM 22.05: munged with its own key and socket (on this machine, reached by every namespace through
# the file system), slurmctld and node hostA's slurmd in namespace $NS_A, node hostB's slurmd in $NS_B, each slurmd
# started with -N <node name> and the host name of its node. slurm.conf is generated in $SLURM_DIR: the two nodes at
# the veth addresses, one partition "test", the pmix MPI plugin by default (`nopmix`: a plugin directory without the
# mpi_pmix plugins, as on a SLURM built without PMIx), processes tracked by /proc (proctrack/linuxproc, no cgroups),
# no task plugin, every daemon as root, state and spool under $SLURM_DIR, and short timeouts so that a lost node is
# declared down within seconds (SlurmdTimeout=6 s: slurmctld pings each node every SlurmdTimeout/3 s); KillWait=10 s
# between the SIGTERM of a requeue or cancel and the SIGKILL, time for the ranks to save. Each node has a TmpFS of
# its own (the nodes share this machine's /tmp, where the pmix plugin's per-step directories would collide) and
# offers 4 CPUs whatever the machine has (SlurmdParameters=config_overrides), so that two small jobs can share them.
SLURM_DIR=$TMP/slurm
SLURM_PLUGINS=/usr/lib/x86_64-linux-gnu/slurm-wlm
export SLURM_CONF=$SLURM_DIR/slurm.conf

on_slurm() { on_host A env SLURM_CONF="$SLURM_CONF" "$@"; }

# The pids of the daemons started here (munged and slurmctld write theirs too).
SLURM_PIDS=()
slurm_cluster_down() {
  local pid
  for pid in "${SLURM_PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null; done
  for _ in $(seq 1 30); do
    local alive=0
    for pid in "${SLURM_PIDS[@]}"; do kill -0 "$pid" 2> /dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${SLURM_PIDS[@]}"; do kill -9 "$pid" 2> /dev/null; done
  SLURM_PIDS=()
  return 0
}

slurm_write_conf() {  # slurm_write_conf PLUGIN_DIR
  cat > "$SLURM_CONF" << EOF
ClusterName=ampdist
SlurmctldHost=hostA($IP_A)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.socket.2
PluginDir=$1
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=$2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=6
SlurmctldTimeout=10
MessageTimeout=3
TCPTimeout=2
KillWait=10
InactiveLimit=0
MinJobAge=600
Waittime=0
TmpFS=$SLURM_DIR/tmp/%n
NodeName=hostA NodeAddr=$IP_A CPUs=4 State=UNKNOWN
NodeName=hostB NodeAddr=$IP_B CPUs=4 State=UNKNOWN
PartitionName=test Nodes=hostA,hostB Default=YES MaxTime=INFINITE State=UP
EOF
}

slurm_cluster_up() {
  local tool plugins=$SLURM_PLUGINS mpi=pmix node
  trap slurm_atexit EXIT
  for tool in munged slurmctld slurmd srun sbatch scontrol; do
    command -v "$tool" > /dev/null || skip "$tool is not installed (Debian: munge slurmctld slurmd slurm-client)"
  done
  [ -e "$SLURM_PLUGINS/mpi_pmix.so" ] || skip "SLURM's pmix MPI plugin is missing ($SLURM_PLUGINS/mpi_pmix.so)"
  mkdir -p "$SLURM_DIR/munge" "$SLURM_DIR/state" "$SLURM_DIR"/spool/host{A,B} "$SLURM_DIR"/tmp/host{A,B}
  chmod 700 "$SLURM_DIR/munge"
  if [ "${1:-}" = nopmix ]; then
    plugins=$SLURM_DIR/plugins mpi=none
    mkdir -p "$plugins"
    for f in "$SLURM_PLUGINS"/*.so; do
      case "${f##*/}" in mpi_pmix*) ;; *) ln -sf "$f" "$plugins/" ;; esac
    done
  fi
  slurm_write_conf "$plugins" "$mpi"
  if [ ! -e "$SLURM_DIR/munge/munged.pid" ]; then
    dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$SLURM_DIR/munge/munge.key"
    munged --force --key-file="$SLURM_DIR/munge/munge.key" --socket="$SLURM_DIR/munge/munge.socket.2" \
      --pid-file="$SLURM_DIR/munge/munged.pid" --log-file="$SLURM_DIR/munge/munged.log" \
      --seed-file="$SLURM_DIR/munge/munged.seed" 2> "$SLURM_DIR/munged.err" ||
      skip "munged does not start: $(head -1 "$SLURM_DIR/munged.err")"
    SLURM_MUNGED=$(cat "$SLURM_DIR/munge/munged.pid")
  fi
  # In the foreground (-D), in the background of this shell, so that their pids are known and nothing outlives us.
  on_host A slurmctld -D -i -f "$SLURM_CONF" > "$SLURM_DIR/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  for node in A B; do
    on_host "$node" slurmd -D -N "host$node" -f "$SLURM_CONF" > "$SLURM_DIR/slurmd.host$node.out" 2>&1 &
    SLURM_PIDS+=($!)
  done
  # Both nodes idle, or skip with what the daemons said.
  local state=""
  for _ in $(seq 1 150); do
    state=$(on_slurm sinfo -h -N -o '%N=%t' 2> /dev/null | sort | tr '\n' ' ')
    [ "$state" = "hostA=idle hostB=idle " ] && return 0
    sleep 0.2
  done
  echo "slurm cluster did not come up: sinfo '$state'"
  tail -5 "$SLURM_DIR"/slurmctld.log "$SLURM_DIR"/slurmd.*.log "$SLURM_DIR"/*.out 2> /dev/null | sed 's/^/    | /'
  return 1
}

slurm_atexit() {
  slurm_cluster_down
  [ -n "${SLURM_MUNGED:-}" ] && kill -TERM "$SLURM_MUNGED" 2> /dev/null
  netns_cleanup
  e2e_cleanup
}
