#!/usr/bin/env bash
# `ampdist env` and the launcher cross-check, on the CPU backend:
#  1. `mpirun -np 2 ampdist env --json`: world size 2, ranks 0 and 1 on this host with local ranks 0/1 of 2, MPI's
#     library version as `ompi_info` prints it; each CUDA library reported found exactly when Python's ctypes can
#     load it (with the version the library itself returns), GPUs and device binding only with a driver; the
#     interfaces with their IPv4 addresses as `ip -4 addr` lists them; NCCL_SOCKET_IFNAME and
#     OMPI_MCA_btl_tcp_if_include change which interfaces are reported.
#  2. The human-readable report has its header, host, rank and library lines.
#  3. Launcher variables that disagree with MPI (an srun-like launch whose SLURM_PROCID is swapped; srun without
#     PMIx: a world of one with SLURM_NTASKS=2 in a job step) stop `env` and `train` on every rank with exit code 2
#     and one error line naming the variables; a batch shell without srun (world of one, SLURM_NTASKS=4, no step)
#     only gets a warning.
#  4. A process started without a launcher (MPI's singleton mode) has removed its OpenMPI session directory by the
#     time it exits, so an mpirun started right after it cannot find that directory vanishing under it.
# Usage: test_env.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" env "$@"
PY=/usr/bin/python3
mpi2() { timeout 120 mpirun -q --oversubscribe -np 2 "$@"; }

# ---- 1. JSON -------------------------------------------------------------------------------------------------------
mpi2 "$AMPDIST" env --json > "$TMP/env.json" 2> "$TMP/env.err" || not_ok "env --json" "exit $?: $(cat "$TMP/env.err")"
ompi_info --parsable 2> /dev/null | sed -n 's/^ompi:version:full:\(.*\)$/\1/p' > "$TMP/ompi_version"
ip -o -4 addr show | awk '{print $2, $4}' | sort > "$TMP/ipv4"
"$PY" - "$TMP/env.json" "$TMP/ompi_version" "$TMP/ipv4" > "$TMP/check.txt" 2>&1 << 'PY'
import ctypes, json, socket, sys
d = json.load(open(sys.argv[1]))
ompi = open(sys.argv[2]).read().strip()
ipv4 = sorted(l.split() for l in open(sys.argv[3]) if l.strip())
bad = []
def check(what, got, want):
    print(("ok " if got == want else "BAD ") + f"{what}: got {got!r}, want {want!r}")
check("world size", d["world_size"], 2)
check("ranks", [(r["rank"], r["local_rank"], r["local_size"]) for r in d["ranks"]], [(0, 0, 2), (1, 1, 2)])
check("hosts", {r["host"] for r in d["ranks"]}, {socket.gethostname()})
r0 = d["ranks"][0]
libs = r0["libraries"]
check("MPI library", libs["mpi"]["version"].startswith(f"Open MPI v{ompi},"), True)
check("MPI standard", libs["mpi"]["standard"], "3.1")

def try_load(names):
    for n in names:
        try:
            return n, ctypes.CDLL(n)
        except OSError:
            pass
    return None, None
def cuda_ver(v): return f"{v // 1000}.{v % 1000 // 10}"
def nccl_ver(v): return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v % 1000 // 100}.{v % 100}"
def query(lib, fn, decode):
    out = ctypes.c_int(0)
    return decode(out.value) if getattr(lib, fn)(ctypes.byref(out)) == 0 else None
for key, names, fn, decode in [
        ("cuda_runtime", ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"], "cudaRuntimeGetVersion", cuda_ver),
        ("nccl", ["libnccl.so.2", "libnccl.so"], "ncclGetVersion", nccl_ver),
        ("cuda_driver", ["libcuda.so.1", "libcuda.so"], "cuDriverGetVersion", cuda_ver),
        ("cublas", ["libcublas.so", "libcublas.so.12", "libcublas.so.11"], None, None),
        ("gpu_driver", ["libnvidia-ml.so.1", "libnvidia-ml.so"], None, None)]:
    name, lib = try_load(names)
    check(f"{key} found", libs[key]["found"], lib is not None)
    if lib is None:
        check(f"{key} says which library", libs[key]["library"], names[0])
    elif fn:
        check(f"{key} version", libs[key].get("version"), query(lib, fn, decode))
    if key == "cublas" and lib is not None:
        v = []
        for p in range(3):
            out = ctypes.c_int(0)
            lib.cublasGetProperty(p, ctypes.byref(out))
            v.append(out.value)
        check("cublas version", libs[key].get("version"), ".".join(map(str, v)))
if not libs["cuda_driver"]["found"]:
    check("no driver: no GPUs", r0["gpus"], [])
    check("no driver: device", [r["device"] for r in d["ranks"]], [None, None])
else:
    n = r0["device_count"]
    check("binding local_rank % device_count", [r["device"] for r in d["ranks"]], [0 % n, 1 % n] if n else [None, None])
    check("bf16 = compute capability >= 8.0",
          all(g["bf16"] == (float(g["compute_capability"]) >= 8.0) for g in r0["gpus"] if "bf16" in g), True)
got = sorted([i["name"], a] for i in r0["network"]["interfaces"] for a in i["addresses"] if ":" not in a)
check("IPv4 addresses", got, ipv4)
check("nccl defaults exclude lo", "lo" in r0["network"]["nccl"], False)
check("mpi defaults exclude lo", "lo" in r0["network"]["mpi_tcp"], False)
PY
if grep -q "^BAD" "$TMP/check.txt"; then not_ok "env --json" "$(grep '^BAD' "$TMP/check.txt" | tr '\n' ';')"; else
  ok "env --json: $(wc -l < "$TMP/check.txt") checks against mpirun, ompi_info, ctypes and ip"; sed "s/^/    /" "$TMP/check.txt"; fi
grep -q "^Traceback" "$TMP/check.txt" && { not_ok "env --json" "checker failed"; show "$TMP/check.txt"; }

NCCL_SOCKET_IFNAME=lo OMPI_MCA_btl_tcp_if_include=127.0.0.0/8 mpi2 "$AMPDIST" env --json > "$TMP/lo.json" 2>&1
got=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(*[",".join(r["network"][k]) for r in d["ranks"] for k in ("nccl","mpi_tcp")])' "$TMP/lo.json" 2>&1)
[ "$got" = "lo lo lo lo" ] && ok "NCCL_SOCKET_IFNAME=lo and OMPI_MCA_btl_tcp_if_include=127.0.0.0/8 select lo on every rank" ||
  not_ok "interface selection" "$got"

# ---- 2. the report ----------------------------------------------------------------------------------------------
mpi2 "$AMPDIST" env > "$TMP/env.txt" 2>&1 || not_ok "env" "exit $?"
host=$(hostname)
for want in "^ampdist env: world size 2 (mpirun (OMPI_COMM_WORLD_SIZE=2))$" "^host $host (ranks 0-1)$" \
  "^  MPI:           MPI 3.1, Open MPI v" "^    rank 0 local rank 0 of 2 -> " "^    rank 1 local rank 1 of 2 -> " \
  "^  NCCL sockets:  .* (NCCL_SOCKET_IFNAME unset: " "^  MPI TCP:       .* (OMPI_MCA_btl_tcp_if_exclude unset: " \
  "^  CUDA runtime:  " "^  cuBLAS:        " "^  NCCL:          " "^  GPU driver:    " "^  CUDA driver:   "; do
  grep -q "$want" "$TMP/env.txt" || { not_ok "env report" "no line matching '$want'"; show "$TMP/env.txt"; }
done
[ "$FAILED" = 0 ] && ok "env report: header, host, ranks, libraries and interfaces"
if ! "$PY" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2> /dev/null; then
  grep -q "^  CUDA driver:   not found (libcuda.so.1)$" "$TMP/env.txt" &&
    grep -q "^    rank 0 local rank 0 of 2 -> cpu$" "$TMP/env.txt" &&
    grep -q "^  GPUs:          none: ranks compute on the CPU backend$" "$TMP/env.txt" &&
    ok "without a CUDA driver: 'not found (libcuda.so.1)', ranks on the CPU" || not_ok "no driver" "$(cat "$TMP/env.txt")"
fi

# ---- 3. launcher cross-check ------------------------------------------------------------------------------------
# An srun-like launch (mpirun's own variables removed, SLURM's set per task) with SLURM_PROCID swapped.
swap='export SLURM_PROCID=$((1 - OMPI_COMM_WORLD_RANK)) SLURM_LOCALID=$OMPI_COMM_WORLD_LOCAL_RANK SLURM_NTASKS=2
  SLURM_STEP_ID=0 SLURM_JOB_ID=7
  unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE
  exec "$@"'
for cmd in "env" "train --config $SRC/configs/fashion_mnist_mlp.pbtxt --run-dir $TMP/never"; do
  # shellcheck disable=SC2086  # cmd: the subcommand and its arguments
  mpi2 bash -c "$swap" task "$AMPDIST" $cmd > "$TMP/swap.out" 2> "$TMP/swap.err"
  rc=$?
  want="ampdist: error: rank environment on $host (MPI rank 0 of 2, local rank 0 of 2): SLURM_PROCID=1 but MPI's rank is 0; the launcher and the MPI library disagree about this process: a mis-launched job"
  if [ "$rc" = 2 ] && [ "$(cat "$TMP/swap.err")" = "$want" ] && [ ! -e "$TMP/never" ]; then
    ok "ampdist ${cmd%% *}: swapped SLURM_PROCID stops every rank with exit 2 and one line"
  else
    not_ok "swapped SLURM_PROCID (${cmd%% *})" "exit $rc"
    show "$TMP/swap.err"
  fi
done
# srun without PMIx: every task is a world of one.
SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 timeout 60 "$AMPDIST" env > /dev/null 2> "$TMP/single.err"
rc=$?
[ "$rc" = 2 ] && [ "$(wc -l < "$TMP/single.err")" = 1 ] &&
  grep -q "SLURM_PROCID=1 but MPI's rank is 0, SLURM_NTASKS=2 but MPI's world size is 1, SLURM_LOCALID=1 but MPI's local rank is 0; srun started separate processes that MPI did not join into one job: use srun --mpi=pmix" "$TMP/single.err" &&
  ok "srun without PMIx (worlds of one in a job step): exit 2, one line naming the variables" ||
  { not_ok "srun without PMIx" "exit $rc"; show "$TMP/single.err"; }
# A batch shell without srun: a warning, the command runs.
SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=4 timeout 60 "$AMPDIST" env > "$TMP/batch.txt" 2>&1
rc=$?
[ "$rc" = 0 ] && grep -q "^warning: SLURM_NTASKS=4 but this is a world of 1: started without srun or mpirun?" "$TMP/batch.txt" &&
  ok "world of one in an allocation without srun: a warning, exit 0" || { not_ok "batch hint" "exit $rc"; show "$TMP/batch.txt"; }

# ---- 4. a singleton's session directory ---------------------------------------------------------------------------
# Open MPI 4's default singleton forks an orted that removes /tmp/ompi.<host>.<uid> some 30 ms after the process
# exits; an mpirun starting in that window fails in orte_init ("session_dir.c at line 107"). The check runs right
# after each exit, with a TMPDIR of its own so no other job's directory counts; before the fix it found the
# directory still there after 19 of 20 runs.
mkdir -p "$TMP/sd"
left=0
for _ in 1 2 3 4 5; do
  TMPDIR="$TMP/sd" timeout 60 "$AMPDIST" env > /dev/null 2>&1 || not_ok "singleton env" "exit $?"
  [ -n "$(ls -A "$TMP/sd")" ] && left=$((left + 1))
  rm -rf "${TMP:?}/sd/"*
done
[ "$left" = 0 ] && ok "a singleton leaves no OpenMPI session directory behind when it exits (5 runs)" ||
  not_ok "singleton session directory" "still present right after exit in $left of 5 runs"

exit "$FAILED"
