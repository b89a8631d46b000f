#!/usr/bin/env bash
# Checkpoint save/load throughput of ampdist against the disk's own sequential write/read rate, in the same place.
#
#   bench/run_checkpoint_bench.sh                # 1 GiB of AdamW state, 2 ranks, 3 repeats, in build/bench_tmp
#
# Environment: BUILD_DIR (default build), BENCH_TMP (default $BUILD_DIR/bench_tmp; must be on the file system you
# want to measure), GIB (default 1.0), REPEAT (default 3), NP (default 2).
#
# Steps: builds ampdist_bench_checkpoint if needed; checks free space (3 x GIB); runs
#   mpirun --oversubscribe -np $NP ampdist_bench_checkpoint --gib $GIB --dir $BENCH_TMP/ckpt --repeat $REPEAT
# (with --drop-caches when this shell can drop the page cache, i.e. as root), and measures the disk with
#   dd if=/dev/zero of=$BENCH_TMP/dd_test bs=64M count=16*GIB conv=fsync   and   dd if=... of=/dev/null bs=64M,
# and the same with oflag=direct / iflag=direct (ampdist's shard I/O is O_DIRECT where the file system takes it),
# once before and once after ampdist (the read after dropping the page cache when possible; the table uses the
# better run); prints one table and writes
# bench/results/checkpoint-<date>.json. Removes its temporary files on exit.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
BENCH_TMP=${BENCH_TMP:-$BUILD_DIR/bench_tmp}
GIB=${GIB:-1.0}
REPEAT=${REPEAT:-3}
NP=${NP:-2}
BIN=$BUILD_DIR/bench/ampdist_bench_checkpoint
RESULTS=$ROOT/bench/results
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

say() { printf '%s\n' "$*" >&2; }
die() { say "run_checkpoint_bench: $*"; exit 1; }
calc() { awk "BEGIN { printf \"%.4f\", $1 }"; }

# ---- build (if needed)
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
BUILD_LOG=$BUILD_DIR/bench_checkpoint_build.log
if ! cmake --build "$BUILD_DIR" --target ampdist_bench_checkpoint -j"$(nproc)" >"$BUILD_LOG" 2>&1; then
  # A build tree configured before the target existed needs a re-configure first.
  cmake -S "$ROOT" -B "$BUILD_DIR" >/dev/null
  cmake --build "$BUILD_DIR" --target ampdist_bench_checkpoint -j"$(nproc)" >"$BUILD_LOG" 2>&1 ||
    die "build failed (bench/ is built only when Google Benchmark is found); see $BUILD_LOG"
fi
[[ -x $BIN ]] || die "$BIN missing after the build"

# ---- temporary directory, space
CREATED_TMP=0
if [[ ! -d $BENCH_TMP ]]; then mkdir -p "$BENCH_TMP"; CREATED_TMP=1; fi
CKPT=$BENCH_TMP/ckpt
DD_FILE=$BENCH_TMP/dd_test
BENCH_JSON=$BENCH_TMP/bench.json
cleanup() {
  rm -rf "$CKPT" "$DD_FILE" "$BENCH_JSON"
  if [[ $CREATED_TMP == 1 ]]; then rmdir "$BENCH_TMP" 2>/dev/null || true; fi
}
trap cleanup EXIT
[[ ! -e $CKPT && ! -e $DD_FILE ]] || die "$CKPT or $DD_FILE already exists; remove it first"

need_kib=$(awk "BEGIN { printf \"%d\", 3 * $GIB * 1048576 }")
avail_kib=$(df -Pk "$BENCH_TMP" | awk 'NR == 2 { print $4 }')
DF_LINE=$(df -Ph "$BENCH_TMP" | awk 'NR == 2 { print $1 " " $2 " size, " $4 " free, mounted on " $6 }')
FSTYPE=$(df -PT "$BENCH_TMP" | awk 'NR == 2 { print $2 }')
((avail_kib >= need_kib)) || die "$BENCH_TMP: $((avail_kib / 1048576)) GiB free, need $((need_kib / 1048576 + 1)) GiB"

# ---- page cache
drop_caches() { sync && { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; }
if drop_caches; then DROP=1; DROP_FLAG=--drop-caches; else DROP=0; DROP_FLAG=; fi

# ---- disk, the same way: 64 MiB blocks, GIB in all, fsync before dd reports; once before and once after ampdist
COUNT=$(awk "BEGIN { c = int($GIB * 16 + 0.5); print (c < 1 ? 1 : c) }")
dd_rate() {  # prints GiB/s from dd's final line: "<bytes> bytes (...) copied, <s> s, <rate>"
  sed -n 's/^\([0-9][0-9]*\) bytes.* copied, \([0-9.][0-9.]*\) s,.*/\1 \2/p' | tail -1 |
    awk '{ printf "%.4f", $1 / $2 / 1073741824 }'
}
DD_WRITES=() DD_READS=()
measure_disk() {
  local out w rd
  say "+ dd if=/dev/zero of=$DD_FILE bs=64M count=$COUNT conv=fsync"
  out=$(dd if=/dev/zero of="$DD_FILE" bs=64M count="$COUNT" conv=fsync 2>&1) || die "dd write failed: $out"
  w=$(dd_rate <<<"$out")
  if [[ $DROP == 1 ]]; then drop_caches || DROP=0; fi
  say "+ dd if=$DD_FILE of=/dev/null bs=64M   (page cache $([[ $DROP == 1 ]] && echo dropped || echo NOT dropped))"
  out=$(dd if="$DD_FILE" of=/dev/null bs=64M 2>&1) || die "dd read failed: $out"
  rd=$(dd_rate <<<"$out")
  [[ -n $w && -n $rd ]] || die "cannot parse dd's output: $out"
  say "  dd: write $w GiB/s, read $rd GiB/s"
  DD_WRITES+=("$w") DD_READS+=("$rd")
  # The same with O_DIRECT, as ampdist writes and reads shards where the file system takes it: the disk's rate is
  # the better of the two ways (a file system that refuses O_DIRECT is measured the buffered way only).
  rm -f "$DD_FILE"
  say "+ dd if=/dev/zero of=$DD_FILE bs=64M count=$COUNT oflag=direct conv=fsync"
  if out=$(dd if=/dev/zero of="$DD_FILE" bs=64M count="$COUNT" oflag=direct conv=fsync 2>&1); then
    w=$(dd_rate <<<"$out")
    say "+ dd if=$DD_FILE of=/dev/null bs=64M iflag=direct"
    out=$(dd if="$DD_FILE" of=/dev/null bs=64M iflag=direct 2>&1) && rd=$(dd_rate <<<"$out") || rd=
    say "  dd (O_DIRECT): write $w GiB/s, read ${rd:-refused} GiB/s"
    [[ -n $w ]] && DD_WRITES+=("$w")
    [[ -n $rd ]] && DD_READS+=("$rd")
  else
    say "  dd (O_DIRECT): refused by this file system"
  fi
  rm -f "$DD_FILE"
}
measure_disk

# ---- ampdist
CMD="mpirun --oversubscribe -np $NP $BIN --gib $GIB --dir $CKPT --repeat $REPEAT $DROP_FLAG --json $BENCH_JSON"
say "+ $CMD"
$CMD >&2 || die "ampdist_bench_checkpoint failed"
say ""
field() { awk -v k="\"$1\"" -F': *' '$1 ~ k { gsub(/[,]/, "", $2); print $2 }' "$BENCH_JSON"; }
SAVE_BEST=$(field save_gib_s_best); SAVE_MED=$(field save_gib_s_median)
LOAD_BEST=$(field load_state_gib_s_best); LOAD_MED=$(field load_state_gib_s_median)
READ_BEST=$(field load_read_gib_s_best); READ_MED=$(field load_read_gib_s_median)

measure_disk
# The disk's rate: the best dd run, buffered or O_DIRECT, before or after (like ampdist's "best").
DISK_WRITE=$(printf '%s\n' "${DD_WRITES[@]}" | sort -g | tail -1)
DISK_READ=$(printf '%s\n' "${DD_READS[@]}" | sort -g | tail -1)

# ---- table
CACHE_NOTE=$([[ $DROP == 1 ]] && echo "page cache dropped before every load and before the dd read" ||
  echo "page cache NOT dropped (not root): load and dd read numbers are from the page cache")
r() { calc "$1 / $2"; }
{
  printf '\nCheckpoint save/load, %s GiB of FP32 AdamW state (master, exp_avg, exp_avg_sq), %s ranks, %s repeats\n' \
    "$(field state_gib | awk '{ printf "%.2f", $1 }')" "$NP" "$REPEAT"
  printf '%s: %s (%s), nproc %s; %s\n\n' "$(hostname)" "$DF_LINE" "$FSTYPE" "$(nproc)" "$CACHE_NOTE"
  printf '| %-35s | %-22s | %-15s | %-15s |\n' "" "ampdist best / median" "disk (dd, best)" "ratio b / m"
  printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..37})" "$(printf -- '-%.0s' {1..24})" \
    "$(printf -- '-%.0s' {1..17})" "$(printf -- '-%.0s' {1..17})"
  fmt() { awk -v x="$1" 'BEGIN { printf "%.3f", x }'; }
  row() {  # label best median disk (raw GiB/s; rounded only here)
    printf '| %-35s | %-22s | %-15s | %-15s |\n' "$1" "$(fmt "$2") / $(fmt "$3") GiB/s" "$(fmt "$4") GiB/s" \
      "$(fmt "$(r "$2" "$4")") / $(fmt "$(r "$3" "$4")")"
  }
  row "save (state GiB/s) vs dd write" "$SAVE_BEST" "$SAVE_MED" "$DISK_WRITE"
  row "load (state GiB/s) vs dd read" "$LOAD_BEST" "$LOAD_MED" "$DISK_READ"
  row "load (read() x$NP ranks) vs dd read" "$READ_BEST" "$READ_MED" "$DISK_READ"
  printf '\nMedians (main thread, max over ranks): save %.2f s wall, %.2f s on a CPU, %.2f s waiting for a CPU; ' \
    "$(field save_s_median)" "$(field save_cpu_s_median)" "$(field save_runqueue_wait_s_median)"
  printf 'load %.2f s wall, %.2f s on a CPU, %.2f s waiting for a CPU.\n' \
    "$(field load_s_median)" "$(field load_cpu_s_median)" "$(field load_runqueue_wait_s_median)"
  printf 'Load average (1/5/15 min) %s at start, %s at end; device bytes per load (all ranks) %.2f GiB.\n' \
    "$(field loadavg_start | tr -d '"')" "$(field loadavg_end | tr -d '"')" "$(field device_read_gib_per_load)"
  printf 'dd runs (before: buffered, O_DIRECT; after: buffered, O_DIRECT): write %s GiB/s, read %s GiB/s.\n\n' \
    "${DD_WRITES[*]}" "${DD_READS[*]}"
}

# ---- JSON
mkdir -p "$RESULTS"
OUT=$RESULTS/checkpoint-$(date +%F).json
{
  printf '{\n'
  printf '  "date": "%s",\n' "$(date -Iseconds)"
  printf '  "command": "bench/run_checkpoint_bench.sh",\n'
  printf '  "bench_command": "%s",\n' "$CMD"
  printf '  "machine": {"host": "%s", "nproc": %s, "mem_total_kib": %s, "df": "%s", "fstype": "%s"},\n' \
    "$(hostname)" "$(nproc)" "$(awk '/MemTotal/ { print $2 }' /proc/meminfo)" "$DF_LINE" "$FSTYPE"
  printf '  "git": {"commit": "%s", "checkpoint_sources_modified": %s},\n' \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$(git -C "$ROOT" diff --quiet HEAD -- runtime/checkpoint proto 2>/dev/null && echo false || echo true)"
  printf '  "page_cache_dropped": %s,\n' "$([[ $DROP == 1 ]] && echo true || echo false)"
  printf '  "ampdist": %s,\n' "$(sed 's/^/  /' "$BENCH_JSON" | sed '1s/^  //')"
  printf '  "disk": {"dd_bs": "64M", "dd_count": %s, "write_gib_s": %s, "read_gib_s": %s, ' \
    "$COUNT" "$DISK_WRITE" "$DISK_READ"
  printf '"write_gib_s_runs": [%s], "read_gib_s_runs": [%s]},\n' \
    "$(IFS=,; echo "${DD_WRITES[*]}")" "$(IFS=,; echo "${DD_READS[*]}")"
  printf '  "ratios": {"save_best_vs_dd_write": %s, "save_median_vs_dd_write": %s, ' \
    "$(r "$SAVE_BEST" "$DISK_WRITE")" "$(r "$SAVE_MED" "$DISK_WRITE")"
  printf '"load_state_best_vs_dd_read": %s, "load_state_median_vs_dd_read": %s, ' \
    "$(r "$LOAD_BEST" "$DISK_READ")" "$(r "$LOAD_MED" "$DISK_READ")"
  printf '"load_read_best_vs_dd_read": %s, "load_read_median_vs_dd_read": %s}\n' \
    "$(r "$READ_BEST" "$DISK_READ")" "$(r "$READ_MED" "$DISK_READ")"
  printf '}\n'
} >"$OUT"
say "wrote ${OUT#"$ROOT"/}"
