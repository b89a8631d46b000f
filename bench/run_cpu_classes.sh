#!/usr/bin/env bash
# bf16 and fp16 against fp32 on each CPU class this machine can act as, in one run: the machine as it is, and under
# AMPDIST_MAX_CPU_ISA=<class> for every smaller class (avx512_core_bf16, avx512_core, avx2; see
# runtime/kernels/cpu/isa.h). Rows: the main job (configs/fashion_mnist_mlp.pbtxt) and the GPT-2-small-shaped model
# (bench/configs/gpt2_small_shaped.pbtxt), fp32 / fp16 / bf16, on 1 rank x nproc threads and nproc ranks x 1 thread,
# through ampdist_bench_train (the same trainer as `ampdist train`). Each row runs REPEAT times (default 3), every
# round alternating over classes and precisions so that a change in the machine's load touches all rows alike;
# the table gives medians of samples/s, bf16/fp32 and fp16/fp32 per class and layout, the GPT's peak RSS per rank and
# its ratio to fp32, and which GEMM path each dtype took (oneDNN's implementation string). Writes
# OUT (default bench/results/cpu-classes-<date>.json) with `lscpu`'s model and flags and every run. Numbers are measurements of this
# machine at its load, never assertions.
#   bash bench/run_cpu_classes.sh [BUILD_DIR]     (env: REPEAT, MODELS="mlp gpt2s", LAYOUTS="1 2" rank counts,
#                                                  CLASSES: default every class up to the machine's, OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeat=${REPEAT:-3}
models=${MODELS:-mlp gpt2s}
nproc=$(nproc)
layouts=${LAYOUTS:-1 $nproc}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
cmake --build "$build" --target ampdist_bench_train -j"$nproc" >/dev/null
bin=$build/bench/ampdist_bench_train
if [[ -z ${CLASSES:-} ]]; then
  CLASSES=all
  for c in avx512_core_bf16 avx512_core avx2; do
    flag=$(case $c in avx512_core_bf16) echo avx512_bf16 ;; avx512_core) echo avx512f ;; avx2) echo avx2 ;; esac)
    grep -qw "$flag" /proc/cpuinfo && CLASSES+=" $c"
  done
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$repeat"); do
  for model in $models; do
    case $model in
      mlp) cfg=configs/fashion_mnist_mlp.pbtxt; sizes=(--warmup 20 --steps 60 --repeat 5 --mp-iters 1 --sgemm-n 512) ;;
      gpt2s) cfg=bench/configs/gpt2_small_shaped.pbtxt; sizes=(--warmup 1 --steps 2 --repeat 3 --mp-iters 1 --sgemm-n 512) ;;
      *) echo "run_cpu_classes: unknown model $model" >&2; exit 2 ;;
    esac
    for np in $layouts; do
      threads=$((nproc / np > 0 ? nproc / np : 1))
      for class in $CLASSES; do
        for p in fp32 bf16 fp16; do
          name="$model-$class-$p-np$np-r$r"
          echo "run_cpu_classes: $name" >&2
          AMPDIST_MAX_CPU_ISA=$class mpirun -q --oversubscribe --bind-to none -np "$np" "$bin" --config "$cfg" \
            --precision "$p" --set train.threads_per_rank="$threads" "${sizes[@]}" --json "$out/$name.json" \
            >/dev/null 2>"$out/$name.err" || { cat "$out/$name.err" >&2; exit 1; }
          printf '{"load": %s}\n' "$(cut -d' ' -f1 /proc/loadavg)" >"$out/$name.load"
        done
      done
    done
  done
done
mkdir -p bench/results
python3 - "$out" "${OUT:-bench/results/cpu-classes-$(date +%F).json}" "$nproc" <<'PY'
import glob, json, os, statistics, subprocess, sys
out, dest, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3])
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
flags = next((l.split(":", 1)[1].split() for l in lscpu.splitlines() if l.startswith("Flags")), [])
runs = []
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(f)[:-5]
    m, cls, p, np_, r = name.rsplit("-", 4)
    d = json.load(open(f))
    load = json.load(open(f[:-5] + ".load"))["load"]
    runs.append({"model": m, "class": cls, "precision": p, "ranks": int(np_[2:]), "round": int(r[1:]),
                 "samples_per_s": d["samples_per_s_median"], "peak_rss_bytes": d["memory"]["peak_rss_bytes_max_over_ranks"],
                 "gemm_impl": d["engine"]["gemm_impl"], "load": load})
rows = {}
for x in runs:
    rows.setdefault((x["model"], x["class"], x["ranks"]), {}).setdefault(x["precision"], []).append(x)
print(f"CPU: {model}; flags: {' '.join(f for f in flags if f in ('avx2', 'fma', 'f16c', 'avx512f', 'avx512_bf16', 'avx512_fp16', 'amx_bf16'))}")
print(f"{'model':6} {'class':17} {'layout':6} {'fp32 /s':>9} {'bf16 /s':>9} {'fp16 /s':>9} {'bf16/fp32':>9} {'fp16/fp32':>9} {'bf16 RSS':>9} {'/fp32':>6}  bf16 GEMM path")
summary = []
for (m, cls, np_), by in sorted(rows.items()):
    med = {p: statistics.median(x["samples_per_s"] for x in v) for p, v in by.items()}
    rss = {p: max(x["peak_rss_bytes"] for x in v) for p, v in by.items()}
    layout = f"{np_}x{max(1, nproc // np_)}"
    row = {"model": m, "class": cls, "layout": layout, "samples_per_s": med, "peak_rss_bytes": rss,
           "bf16_over_fp32": med["bf16"] / med["fp32"], "fp16_over_fp32": med["fp16"] / med["fp32"],
           "bf16_rss_over_fp32": rss["bf16"] / rss["fp32"], "bf16_gemm": by["bf16"][0]["gemm_impl"]}
    summary.append(row)
    print(f"{m:6} {cls:17} {layout:6} {med['fp32']:9.1f} {med['bf16']:9.1f} {med['fp16']:9.1f} "
          f"{row['bf16_over_fp32']:9.2f} {row['fp16_over_fp32']:9.2f} {rss['bf16'] / 2**20:8.0f}M {row['bf16_rss_over_fp32']:6.3f}  {row['bf16_gemm']}")
json.dump({"cpu": model, "flags": flags, "rows": summary, "runs": runs}, open(dest, "w"), indent=1)
print(f"wrote {dest}")
PY
