#!/usr/bin/env bash
# The container cluster's files, checked without a container engine:
#  1. `docker-compose config -q` (Debian's docker-compose validates the file against the Compose schema) accepts
#     docker-compose.yml, and rejects a copy with an unknown service key (so the check is not a no-op).
#  2. The resolved file: services head, worker1, worker2 in profile "cpu" built from launch/Dockerfile with CUDA=OFF;
#     gpu-head, gpu-worker1, gpu-worker2 in profile "gpu" with CUDA=ON and an nvidia GPU reservation; every
#     service mounts the shared run volume at /runs; the heads run launch/docker/cluster_run.sh.
#  3. `bash -n` of launch/docker/cluster_run.sh and launch/slurm/ampdist.sbatch.
# Exits 77 (skipped) when docker-compose is not installed.
# Usage: test_compose.sh AMPDIST_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" compose "$@"

for f in launch/docker/cluster_run.sh launch/slurm/ampdist.sbatch; do
  bash -n "$SRC/$f" 2> "$TMP/n.err" && ok "bash -n $f" || not_ok "bash -n $f" "$(cat "$TMP/n.err")"
done
command -v docker-compose > /dev/null || {
  echo "skipped: docker-compose is not installed (Debian package docker-compose)"
  exit 77
}
cd "$SRC" || exit 1
docker-compose -f docker-compose.yml config -q 2> "$TMP/config.err" && ok "docker-compose config -q" ||
  not_ok "docker-compose config -q" "$(cat "$TMP/config.err")"
sed 's/^    hostname: head$/    hostname: head\n    no_such_key: 1/' docker-compose.yml > "$TMP/broken.yml"
if docker-compose -f "$TMP/broken.yml" --project-directory "$SRC" config -q > /dev/null 2>&1; then
  not_ok "docker-compose config -q" "accepted a file with an unknown key"
else
  ok "docker-compose config -q rejects an unknown key"
fi

docker-compose -f docker-compose.yml config > "$TMP/resolved.yml" 2> "$TMP/config.err" ||
  not_ok "docker-compose config" "$(cat "$TMP/config.err")"
got=$(/usr/bin/python3 - "$TMP/resolved.yml" << 'PY' 2>&1
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
for name in sorted(d["services"]):
    s = d["services"][name]
    b = s["build"]
    gpu = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    print(name, ",".join(s["profiles"]), b["dockerfile"], b["args"]["CUDA"],
          ",".join(f'{g["driver"]}:{g["count"]}:{"+".join(g["capabilities"])}' for g in gpu) or "-",
          "runs" if any(v.startswith("runs:/runs") for v in s["volumes"]) else "no-volume",
          " ".join(s.get("command", [])) or "sshd")
PY
)
want="gpu-head gpu launch/Dockerfile ON nvidia:all:gpu runs bash /opt/ampdist/launch/docker/cluster_run.sh
gpu-worker1 gpu launch/Dockerfile ON nvidia:all:gpu runs sshd
gpu-worker2 gpu launch/Dockerfile ON nvidia:all:gpu runs sshd
head cpu launch/Dockerfile OFF - runs bash /opt/ampdist/launch/docker/cluster_run.sh
worker1 cpu launch/Dockerfile OFF - runs sshd
worker2 cpu launch/Dockerfile OFF - runs sshd"
[ "$got" = "$want" ] && ok "services, profiles, images, GPU reservations, the shared /runs volume and commands" ||
  not_ok "resolved compose file" "$(printf 'got:\n%s\nwant:\n%s' "$got" "$want")"

exit "$FAILED"
