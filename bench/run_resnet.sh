#!/usr/bin/env bash
# The AMP tutorials' benchmark beside PyTorch in one run: ResNet-18 (ImageNet stem), 10 classes, Adam lr 1e-3,
# synthetic 3 x 224 x 224 images, global batch BATCH (default 32; the tutorials use 128), fp32 / fp16 / bf16, on
# 1 rank x nproc threads and 2 ranks x nproc/2 threads. ampdist: `ampdist bench` on bench/configs/resnet18_224.pbtxt;
# PyTorch: bench/torch_resnet.py (torchvision.models.resnet18, CPU autocast for 16-bit; DDP over gloo on 2 ranks),
# the current torch and torchvision from PyPI, installed once into the cached virtual environment TORCH_VENV
# (default ~/.cache/ampdist-bench/venv, as bench/run_all.sh; PYTHON=/usr/bin/python3 uses Debian's 1.13 instead).
# Every row runs REPEAT times (default 3), the rows of one round alternating between ampdist and PyTorch and between
# precisions, and reports the median. Prints images/s per row, the speed-up of each mixed precision over fp32 and
# ampdist / PyTorch per precision, and writes bench/results/resnet18-<date>-np<ranks>.json with the CPU, its bf16
# flags, every run's images/s and the load average before it. Numbers are measurements of this machine at its
# load, never assertions.
# PyTorch's fp16 rows run only where the CPU has AMX-FP16 (or with TORCH_FP16=1): elsewhere its fp16 convolution
# backward takes a slow path. Measured on an Intel Xeon with AVX512-FP16 but no AMX (PyTorch 2.15.0): one
# conv 64->64 3x3 forward + backward on 8 x 64 x 56 x 56 took 4.8 s in fp16 against 0.017 s in fp32, and one
# ResNet-18 row had not finished after 20 minutes. Every PyTorch run ends after TORCH_TIMEOUT s (default 900);
# a run that timed out counts as null.
#   bash bench/run_resnet.sh [BUILD_DIR] [STEPS] [WARMUP]
#     (env: BATCH, NPS="1 2" the rank counts, REPEAT, PYTHON, TORCH_FP16, TORCH_TIMEOUT)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-3}
warmup=${3:-1}
batch=${BATCH:-32}
repeat=${REPEAT:-3}
TORCH_VENV=${TORCH_VENV:-$HOME/.cache/ampdist-bench/venv}
python=${PYTHON:-$TORCH_VENV/bin/python3}
if [[ $python == "$TORCH_VENV/bin/python3" ]] && ! "$python" -c 'import torch, torchvision' 2>/dev/null; then
  echo "run_resnet: installing torch and torchvision from PyPI into $TORCH_VENV (once)" >&2
  /usr/bin/python3 -m venv "$TORCH_VENV" && "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check \
    torch torchvision numpy >&2 || { echo "run_resnet: pip install into $TORCH_VENV failed" >&2; exit 1; }
fi
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
torch_timeout=${TORCH_TIMEOUT:-900}
torch_precs=" fp32 bf16 "
if [[ ${TORCH_FP16:-0} == 1 ]] || grep -qw amx_fp16 /proc/cpuinfo; then torch_precs+="fp16 "; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p')
flags=$(grep -m1 -o -w -E 'avx512_bf16|amx_bf16|avx512_fp16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
nproc=$(nproc)
torch_version=$("$python" -c 'import torch, torchvision; print(torch.__version__, "torchvision", torchvision.__version__)')
echo "CPU: $cpu ($nproc cores; $flags); ResNet-18 224x224, batch $batch, $steps steps after $warmup, median of $repeat"
echo "PyTorch: $torch_version"
printf '%-8s %-6s %-5s %12s %s\n' impl ranks prec 'images/s' 'runs (load)'
rows=()
declare -A ips runs
median() { (($#)) || { echo null; return; }; printf '%s\n' "$@" | { grep -v null || true; } | sort -g | awk '{v[NR]=$1} END {print NR ? v[int((NR + 1) / 2)] : "null"}'; }
for np in ${NPS:-1 2}; do
  threads=$(( nproc / np > 0 ? nproc / np : 1 ))
  for ((round = 1; round <= repeat; ++round)); do
    for prec in fp32 fp16 bf16; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      log="$out/ampdist_${np}_$prec.txt"
      mpirun -q --oversubscribe --bind-to none -np "$np" "$build/ampdist" bench --config bench/configs/resnet18_224.pbtxt \
        --precision "$prec" --set data.global_batch_size="$batch" --set train.threads_per_rank="$threads" \
        --steps "$steps" --warmup "$warmup" >"$log" 2>&1 || { cat "$log"; exit 1; }
      v=$(sed -n 's/^samples\/s: \([0-9.]*\).*/\1/p' "$log")
      runs[ampdist_${np}_$prec]+="$v "
      rows+=("{\"impl\": \"ampdist\", \"ranks\": $np, \"precision\": \"$prec\", \"round\": $round, \"images_per_s\": $v, \"loadavg\": $load}")
      if [[ $torch_precs != *" $prec "* ]]; then
        [[ $round == 1 ]] && echo "PyTorch $prec skipped: no AMX-FP16 on this CPU (TORCH_FP16=1 runs it)"
        continue
      fi
      load=$(cut -d' ' -f1 /proc/loadavg)
      log="$out/torch_${np}_$prec.txt"
      if [ "$np" = 1 ]; then
        rc=0
        timeout -k 10 "$torch_timeout" "$python" bench/torch_resnet.py --precision "$prec" --threads "$threads" \
          --batch "$batch" --steps "$steps" --warmup "$warmup" >"$log" 2>&1 || rc=$?
        if [[ $rc == 124 || $rc == 137 ]]; then echo '{"images_per_s": null, "timed_out": true}' >>"$log";
        elif [[ $rc != 0 ]]; then cat "$log"; exit 1; fi
      else
        for r in 0 1; do
          RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 timeout -k 10 "$torch_timeout" "$python" \
            bench/torch_resnet.py --precision "$prec" --threads "$threads" --batch "$batch" --steps "$steps" \
            --warmup "$warmup" >"$log.$r" 2>&1 &
        done
        wait
        cat "$log.0" >"$log"
      fi
      j=$(tail -1 "$log")
      v=$(printf '%s' "$j" | "$python" -c 'import json,sys
try: v = json.load(sys.stdin).get("images_per_s")
except ValueError: v = None
print("null" if v is None else f"{v:.2f}")')
      [[ $j == "{"* ]] || j='{"images_per_s": null}'
      runs[torch_${np}_$prec]+="$v "
      rows+=("{\"impl\": \"pytorch\", \"ranks\": $np, \"precision\": \"$prec\", \"round\": $round, \"images_per_s\": $v, \"raw\": $j, \"loadavg\": $load}")
    done
  done
  for prec in fp32 fp16 bf16; do
    for impl in ampdist torch; do
      k=${impl}_${np}_$prec
      # shellcheck disable=SC2086
      ips[$k]=$(median ${runs[$k]:-})
      printf '%-8s %-6s %-5s %12s %s\n' "${impl/torch/pytorch}" "$np" "$prec" "${ips[$k]}" "${runs[$k]:-}"
    done
  done
done
echo
ratio() { "$python" -c "import sys; a, b = sys.argv[1:]; print('n/a' if 'null' in (a, b) else f'{float(a) / float(b):.2f}x')" "$1" "$2"; }
for np in ${NPS:-1 2}; do
  for prec in fp16 bf16; do
    echo "ranks $np: ampdist $prec / fp32 $(ratio "${ips[ampdist_${np}_$prec]}" "${ips[ampdist_${np}_fp32]}"), pytorch $prec / fp32 $(ratio "${ips[torch_${np}_$prec]}" "${ips[torch_${np}_fp32]}")"
  done
  for prec in fp32 fp16 bf16; do
    echo "ranks $np $prec: ampdist / pytorch $(ratio "${ips[ampdist_${np}_$prec]}" "${ips[torch_${np}_$prec]}")"
  done
done
mkdir -p bench/results
nps=${NPS:-1 2}
res="bench/results/resnet18-$(date +%F)-np${nps// /_}.json"
{
  echo "{\"cpu\": \"$cpu\", \"flags\": \"$flags\", \"torch\": \"$torch_version\", \"global_batch\": $batch, \"steps\": $steps, \"warmup\": $warmup, \"repeat\": $repeat, \"rows\": ["
  (IFS=,; echo "${rows[*]}")
  echo "]}"
} >"$res"
echo "wrote $res"
