#!/usr/bin/env bash
# The head container's command in docker-compose.yml: wait until every host of AMPDIST_HOSTS (the workers) accepts
# SSH (mpirun starts its daemons there through ssh), print `ampdist env` over them, then train with mpirun across
# them, AMPDIST_RANKS_PER_NODE ranks on each, AMPDIST_CONFIG with AMPDIST_ARGS, into AMPDIST_RUN_DIR with
# --resume auto (so `up` again continues the run). The cluster network is each container's eth0.
set -euo pipefail
# shellcheck disable=SC2206  # a space-separated list
hosts=(${AMPDIST_HOSTS:?AMPDIST_HOSTS unset: the host names of the cluster, space-separated})
per_node=${AMPDIST_RANKS_PER_NODE:-2}
for h in "${hosts[@]}"; do
  for i in $(seq 1 60); do
    ssh -o ConnectTimeout=2 "$h" true 2>/dev/null && break
    [ "$i" = 60 ] && { echo "cluster_run: error: $h does not accept SSH after 60 tries" >&2; exit 1; }
    sleep 1
  done
done
host_list=$(printf "%s:$per_node," "${hosts[@]}")
np=$((${#hosts[@]} * per_node))
# Only the cluster network carries MPI's and NCCL's traffic; mpirun notices a worker that went away within seconds
# (TCP keepalive on its control connections; OpenMPI's default waits 300 s + 9 x 20 s).
mpi=(mpirun --host "${host_list%,}" -np "$np" --map-by "ppr:$per_node:node" --mca btl_tcp_if_include eth0
     --mca oob_tcp_if_include eth0 --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2
     --mca oob_tcp_keepalive_probes 3 -x NCCL_SOCKET_IFNAME=eth0)
"${mpi[@]}" ampdist env
# shellcheck disable=SC2086  # AMPDIST_ARGS: extra arguments, split on spaces
exec "${mpi[@]}" ampdist train --config "${AMPDIST_CONFIG:?AMPDIST_CONFIG unset: the run config}" --run-dir "${AMPDIST_RUN_DIR:-/runs/compose}" \
  --resume auto ${AMPDIST_ARGS:-}
