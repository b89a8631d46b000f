#!/usr/bin/env bash
# End-to-end: every kind of bad input (config file, config field, --set, --precision, command line, IDX dataset)
# makes `ampdist train` print exactly one line "ampdist: error: ..." naming the file or field, and exit 2 on every
# rank, alone and under mpirun, without a crash, a hang or a leftover process. Plus one positive control.
#
#   bash tests/e2e/test_bad_input.sh <path-to-ampdist> <source-dir>
# VERBOSE=1 also shows the error line of every passing case.
source "$(dirname "$0")/lib.sh" bad_input "$@"

REAL_DATA=/usr/share/datasets/fashion-mnist
MPIRUN=(mpirun -q --oversubscribe -np 2)

for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  if [ ! -e "$REAL_DATA/$f.gz" ] && [ ! -e "$REAL_DATA/$f" ]; then
    echo "not ok - setup: $REAL_DATA/$f(.gz) is missing (install dataset-fashion-mnist)"
    exit 1
  fi
done

# check_error CASE OUT RC NEEDLE...: the assertions for one bad-input run.
check_error() {
  local name=$1 out=$2 rc=$3
  shift 3
  local why=""
  if [ "$rc" -eq 124 ]; then
    why="HANG (killed by timeout 120)"
  elif [ "$rc" -gt 128 ]; then
    why="crashed: killed by signal $((rc - 128)) (exit $rc)"
  elif grep -Eq 'core dumped|Segmentation|terminate called|Aborted' "$out"; then
    why="crashed (exit $rc)"
  elif [ "$rc" -ne 2 ]; then
    why="exit code $rc, expected 2"
  else
    local n line
    n=$(grep -c . "$out")
    line=$(grep -m1 . "$out")
    if [ "$n" -ne 1 ]; then
      why="$n non-empty output lines, expected exactly 1"
    elif [[ "$line" != "ampdist: error:"* ]]; then
      why="line does not start with 'ampdist: error:'"
    else
      local needle
      for needle in "$@"; do
        if [[ "$needle" == re:* ]]; then
          grep -Eq -- "${needle#re:}" <<<"$line" || why="line does not match /${needle#re:}/"
        else
          grep -Fq -- "$needle" <<<"$line" || why="line does not name '$needle'"
        fi
        [ -n "$why" ] && break
      done
    fi
  fi
  if [ -z "$why" ]; then
    # Nothing of this run may be left behind (every rank and launcher names the temp dir on its command line).
    local _ left=""
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      left=$(pgrep -f "$TMP" || true)
      [ -z "$left" ] && break
      sleep 0.2
    done
    [ -n "$left" ] && why="processes left running: ${left//$'\n'/ }"
  fi
  if [ -z "$why" ]; then
    ok "$name"
    [ -n "${VERBOSE:-}" ] && show "$out"
  else
    not_ok "$name" "$why"
    show "$out"
  fi
}

N=0
# expect_error CASE MODE NEEDLES... -- ARGS...: runs `ampdist ARGS` alone (MODE single) or under mpirun -np 2
# (MODE mpi) and checks it fails as bad input. A needle "re:REGEX" is an extended regex, any other a fixed string.
expect_error() {
  local name=$1 mode=$2
  shift 2
  local needles=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    needles+=("$1")
    shift
  done
  shift
  N=$((N + 1))
  local out="$TMP/out.$N" rc
  if [ "$mode" = single ]; then
    timeout 120 "$AMPDIST" "$@" >"$out" 2>&1 </dev/null
    rc=$?
  else
    timeout 120 "${MPIRUN[@]}" "$AMPDIST" "$@" >"$out" 2>&1 </dev/null
    rc=$?
  fi
  check_error "$name [$mode]" "$out" "$rc" "${needles[@]}"
}

# both CASE NEEDLES... -- ARGS...: the case alone and under mpirun -np 2.
both() {
  local name=$1
  shift
  expect_error "$name" single "$@"
  expect_error "$name" mpi "$@"
}

# ---- inputs -----------------------------------------------------------------------------------------------------

# base_config FILE DATA_DIR [OPTIMIZER_EXTRA]: a tiny valid run (2 steps) so that a case that wrongly succeeds
# still ends quickly; OPTIMIZER_EXTRA goes inside the optimizer { } block.
base_config() {
  cat >"$1" <<EOF
model { mlp { hidden: [16] } }
data { idx { dir: "$2" } global_batch_size: 128 }
optimizer { sgd { momentum: 0.9 } lr: 0.05 ${3:-}}
train { steps: 2 }
log { dir: "$TMP/runs" every_steps: 1 }
EOF
}

BASE="$TMP/base.pbtxt"
base_config "$BASE" "$REAL_DATA"

# A dataset dir: copies of the real files except `skip` (the one a case replaces).
make_data_dir() {
  local dir=$1 skip=$2 f
  mkdir -p "$dir"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ "$f" = "$skip" ] && continue
    cp "$REAL_DATA/$f"* "$dir/"
  done
}

RAW_IMAGES="$TMP/train-images.raw"
RAW_LABELS="$TMP/train-labels.raw"
if [ -e "$REAL_DATA/train-images-idx3-ubyte.gz" ]; then
  gzip -dc "$REAL_DATA/train-images-idx3-ubyte.gz" >"$RAW_IMAGES"
else
  cp "$REAL_DATA/train-images-idx3-ubyte" "$RAW_IMAGES"
fi
if [ -e "$REAL_DATA/train-labels-idx1-ubyte.gz" ]; then
  gzip -dc "$REAL_DATA/train-labels-idx1-ubyte.gz" >"$RAW_LABELS"
else
  cp "$REAL_DATA/train-labels-idx1-ubyte" "$RAW_LABELS"
fi

# 7: images with magic 0x00000804 instead of 0x00000803.
D_MAGIC="$TMP/data_magic"
make_data_dir "$D_MAGIC" train-images-idx3-ubyte
{ printf '\x00\x00\x08\x04'; tail -c +5 "$RAW_IMAGES"; } | gzip -1 >"$D_MAGIC/train-images-idx3-ubyte.gz"
# 8: images cut after 10000 bytes (a valid header that promises 60000 images).
D_TRUNC="$TMP/data_trunc"
make_data_dir "$D_TRUNC" train-images-idx3-ubyte
head -c 10000 "$RAW_IMAGES" | gzip -1 >"$D_TRUNC/train-images-idx3-ubyte.gz"
# 9: images of 6 bytes, a plain file (not gzip): the magic and half a dimension.
D_HDR="$TMP/data_header"
make_data_dir "$D_HDR" train-images-idx3-ubyte
head -c 6 "$RAW_IMAGES" >"$D_HDR/train-images-idx3-ubyte"
# 10: label 11 for the first training sample (classes are 0..9).
D_LABEL="$TMP/data_label"
make_data_dir "$D_LABEL" train-labels-idx1-ubyte
cp "$RAW_LABELS" "$TMP/labels.bad"
printf '\x0b' | dd of="$TMP/labels.bad" bs=1 seek=8 conv=notrunc status=none
gzip -1 -c "$TMP/labels.bad" >"$D_LABEL/train-labels-idx1-ubyte.gz"

# 2: malformed configs.
BAD_BRACE="$TMP/bad_brace.pbtxt"
cat >"$BAD_BRACE" <<EOF
model { mlp { hidden: [8] }
data { idx { dir: "$REAL_DATA" } global_batch_size: 128 }
train { steps: 2 }
EOF
BAD_LR="$TMP/bad_lr.pbtxt"
cat >"$BAD_LR" <<EOF
model { mlp { hidden: [16] } }
data { idx { dir: "$REAL_DATA" } global_batch_size: 128 }
optimizer { lr: "abc" }
train { steps: 2 }
EOF
# 3: an unknown field in an otherwise valid config.
UNKNOWN="$TMP/unknown_field.pbtxt"
base_config "$UNKNOWN" "$REAL_DATA" "lrr: 0.1 "

# ---- cases ------------------------------------------------------------------------------------------------------

both "1 missing config file" "$TMP/does_not_exist.pbtxt" -- \
  train --config "$TMP/does_not_exist.pbtxt"
both "2a malformed config (missing brace)" "re:^ampdist: error: .*${BAD_BRACE}:[0-9]+:[0-9]+" -- \
  train --config "$BAD_BRACE"
both "2b malformed config (lr: \"abc\")" "re:^ampdist: error: .*${BAD_LR}:[0-9]+:[0-9]+" -- \
  train --config "$BAD_LR"
both "3 unknown config field" "$UNKNOWN" "lrr" -- \
  train --config "$UNKNOWN"
both "4a --set optimizer.lr=-1" "optimizer.lr" -- \
  train --config "$BASE" --set optimizer.lr=-1
both "4b --set precision.dynamic.backoff_factor=2" "backoff_factor" -- \
  train --config "$BASE" --set precision.dynamic.backoff_factor=2
both "4c --precision fp8" "--precision" -- \
  train --config "$BASE" --precision fp8
both "5 unknown --set field" "nope" -- \
  train --config "$BASE" --set optimizer.nope=1
both "6 missing dataset directory" "$TMP/nope" "data.idx.dir" -- \
  train --config "$BASE" --set "data.idx.dir=$TMP/nope"
both "7 IDX file with a wrong magic number" "$D_MAGIC/train-images-idx3-ubyte" "magic" -- \
  train --config "$BASE" --set "data.idx.dir=$D_MAGIC"
both "8 truncated IDX file" "$D_TRUNC/train-images-idx3-ubyte" "truncated" -- \
  train --config "$BASE" --set "data.idx.dir=$D_TRUNC"
both "9 truncated IDX header" "$D_HDR/train-images-idx3-ubyte" "truncated" -- \
  train --config "$BASE" --set "data.idx.dir=$D_HDR"
both "10 label out of range" "$D_LABEL/train-labels-idx1-ubyte" -- \
  train --config "$BASE" --set "data.idx.dir=$D_LABEL"
both "11 config is a directory" "$TMP" "directory" -- \
  train --config "$TMP"
# With one process 3 is a valid global batch; with two it does not divide.
expect_error "12 global batch not divisible by world size" mpi "data.global_batch_size" -- \
  train --config "$BASE" --set data.global_batch_size=3
both "13 no --config on the command line" "--config" -- \
  train

# ---- loss scales the arithmetic cannot honour: zero, subnormal, non-finite (1/S must be finite too) ------------------
both "14a subnormal init_scale" "precision.dynamic.init_scale" "finite, normal" -- \
  train --config "$BASE" --precision fp16 --set precision.dynamic.init_scale=1e-40 \
  --set precision.dynamic.min_scale=1e-45 --set precision.max_consecutive_skips=0
both "14b zero min_scale" "precision.dynamic.min_scale" "finite, normal" -- \
  train --config "$BASE" --precision fp16 --set precision.dynamic.min_scale=0
both "14c infinite init_scale" "precision.dynamic.init_scale" -- \
  train --config "$BASE" --precision fp16 --set precision.dynamic.init_scale=inf
both "14d subnormal static scale" "precision.static_scale.scale" "finite, normal" -- \
  train --config "$BASE" --precision fp16 --set precision.static_scale.scale=1e-39

# ---- strings that reach metrics.jsonl, TensorBoard or a path: valid UTF-8, no NUL, named by file and field -------
NON_UTF8="$TMP/non_utf8.pbtxt"
{ printf 'name: "mod\xe8le"\n'; sed "s|$TMP/runs|$TMP/runs15|" "$BASE"; } >"$NON_UTF8"
both "15a a non-UTF-8 byte in name" "$NON_UTF8: name: not valid UTF-8" "0xe8" -- \
  train --config "$NON_UTF8"
NON_UTF8_LAYER="$TMP/non_utf8_layer.pbtxt"
{ sed "s|$TMP/runs|$TMP/runs15|" "$BASE"; printf 'precision { fp32_layers: "fc\xff" }\n'; } >"$NON_UTF8_LAYER"
both "15b a non-UTF-8 byte in a repeated nested string" "precision.fp32_layers[0]: not valid UTF-8" -- \
  train --config "$NON_UTF8_LAYER"
both "15c a non-UTF-8 --run-dir" "--run-dir: not valid UTF-8" -- \
  train --config "$BASE" --run-dir "$TMP/run_$(printf '\xe9')"
for f in "$TMP/runs15" "$TMP/run_$(printf '\xe9')"; do
  if [ -e "$f" ]; then not_ok "15 nothing created by a refused config" "$f exists"; else ok "15 nothing created: $f"; fi
done

# ---- error lines that name what they are about ---------------------------------------------------------------------
both "16a misspelt subcommand" "unknown command 'trian'" "train" -- \
  trian --config "$BASE"
both "16b misspelt ckpt subcommand" "unknown command 'inspet'" "inspect" -- \
  ckpt inspet "$TMP"
expect_error "16c batch not a multiple of world size names the config file" mpi \
  "re:^ampdist: error: $BASE \(with command-line overrides\): data.global_batch_size = 3 is not a multiple" -- \
  train --config "$BASE" --set data.global_batch_size=3
both "16d batch larger than the dataset names the config file" \
  "re:^ampdist: error: $BASE \(with command-line overrides\): data.global_batch_size = 1000000 is larger" -- \
  train --config "$BASE" --set data.global_batch_size=1000000
# An environment switch with a value it does not know (here the checkpoint I/O switch) is bad input too, before any
# rank trains or touches a checkpoint; mpirun passes it to every rank.
AMPDIST_CKPT_DIRECT_IO=maybe both "16e unknown AMPDIST_CKPT_DIRECT_IO value names the variable" \
  "re:^ampdist: error: AMPDIST_CKPT_DIRECT_IO: is 'maybe': expected" -- \
  train --config "$BASE" --set checkpoint.every_steps=1 --run-dir "$TMP/env16e"

# ---- positive control -------------------------------------------------------------------------------------------

out="$TMP/out.ok"
timeout 120 "${MPIRUN[@]}" "$AMPDIST" train --config "$BASE" --run-dir "$TMP/run_ok" >"$out" 2>&1 </dev/null
rc=$?
if [ "$rc" -eq 124 ]; then
  not_ok "control: valid base config [mpi]" "HANG (killed by timeout 120)"
  show "$out"
elif [ "$rc" -ne 0 ]; then
  not_ok "control: valid base config [mpi]" "exit code $rc, expected 0"
  show "$out"
elif ! grep -Eq '^master weights hash: [0-9a-f]{16}$' "$out"; then
  not_ok "control: valid base config [mpi]" "no line 'master weights hash: <16 hex digits>'"
  show "$out"
elif grep -q 'ampdist: error:' "$out"; then
  not_ok "control: valid base config [mpi]" "printed an error"
  show "$out"
else
  ok "control: valid base config [mpi]"
fi

# ---- a refusal after set-up leaves no trace ------------------------------------------------------------------------
# no_trace CASE DIR NEEDLE -- ARGS...: the run is refused as bad input under mpirun and its run directory (which it
# created) is gone again, with everything the refused run put in it.
no_trace() {
  local name=$1 dir=$2 needle=$3
  shift 4
  expect_error "$name" mpi "$needle" -- "$@" --run-dir "$dir"
  if [ -e "$dir" ]; then not_ok "$name: no run directory left" "$(find "$dir" | head -5 | tr '\n' ' ')"
  else ok "$name: no run directory left"; fi
}
no_trace "17a no_decay pattern that matches nothing (build phase)" "$TMP/refused/a/run" "matches no tensor" -- \
  train --config "$BASE" --set 'optimizer.no_decay=["nomatch*"]'
no_trace "17b another model's checkpoint (resume phase)" "$TMP/refused/b" "checkpoint of another model" -- \
  train --config "$BASE" --set 'model.mlp.hidden=[24]' --resume "$TMP/run_ok/checkpoints/step_00000002"
[ -e "$TMP/refused" ] && not_ok "17: the created parent directory is gone too" "$TMP/refused exists" ||
  ok "17: the created parent directory is gone too"
# A refused resume into an existing run directory changes nothing in it.
before=$(cd "$TMP/run_ok" && find . | sort | md5sum)
expect_error "17c another model's checkpoint into an existing run" mpi "checkpoint of another model" -- \
  train --config "$BASE" --set 'model.mlp.hidden=[24]' --run-dir "$TMP/run_ok" --resume "$TMP/run_ok/checkpoints/step_00000002"
after=$(cd "$TMP/run_ok" && find . | sort | md5sum)
[ "$before" = "$after" ] && ok "17c: the existing run directory is as it was" ||
  not_ok "17c: the existing run directory changed" "$(cd "$TMP/run_ok" && find . | sort | head -20 | tr '\n' ' ')"

# 18: two settings that contradict each other are refused at set-up, naming both (no run directory created).
no_trace "18 optimizer.zero_stage 0 with comm.mode REDUCE_SCATTER (its deprecated alias)" "$TMP/refused18/run" \
  "contradicts optimizer.zero_stage: 0" -- \
  train --config "$BASE" --set optimizer.zero_stage=0 --set comm.mode=REDUCE_SCATTER

# 19: a run that cannot fit in the memory this rank may use is refused at set-up, in seconds, before anything of
# the model's size is allocated, naming the field to change (the largest part of the estimate), with no run
# directory left. A GPT-2-124M-shaped model (124M parameters, 12 x 1024 x 768) whose activations at 32 windows of
# 1024 tokens per rank (about 20 GiB) exceed an address-space limit of 5.7 GiB, the same at 4096 windows per rank
# (about 2.5 TiB) beyond any machine's physical memory, and an MLP whose weights, gradients and optimizer state
# (9.2 x 10^8 parameters, 12 bytes each with SGD momentum: 10.3 GiB) exceed the address-space limit.
cat >"$TMP/gpt124.pbtxt" <<EOF
model { gpt { n_layer: 12 n_head: 12 n_embd: 768 seq_len: 1024 vocab_size: 50257 padded_vocab_multiple: 128 } }
data { text { paths: "/usr/share/games/fortunes" val_fraction: 0.1 } global_batch_size: 16 }
optimizer { adamw { } lr: 0.0006 }
train { steps: 1 }
EOF
# refused_in_seconds CASE ARGS...: no_trace ARGS..., and the refusal took less than 5 s.
refused_in_seconds() {
  local name=$1 t0 t1
  shift
  t0=$(date +%s%N)
  no_trace "$@"
  t1=$(date +%s%N)
  local ms=$(((t1 - t0) / 1000000))
  [ "$ms" -lt 5000 ] && ok "$name: refused in $ms ms (< 5 s)" || not_ok "$name: refused in $ms ms, expected < 5 s"
}
( ulimit -v 6000000
  refused_in_seconds "19a" "19a GPT activations beyond ulimit -v" "$TMP/refused19/a" \
    "re:needs about [0-9]+[.][0-9]+ GiB per rank .*[(]ulimit -v[)] allows 5[.]72 GiB; change data.global_batch_size" -- \
    train --config "$TMP/gpt124.pbtxt" --set data.global_batch_size=64
  refused_in_seconds "19b" "19b MLP weights beyond ulimit -v" "$TMP/refused19/b" \
    "re:needs about 1[0-9][.][0-9]+ GiB per rank .*[(]ulimit -v[)] allows 5[.]72 GiB; change optimizer.zero_stage: 1" -- \
    train --config "$BASE" --set 'model.mlp.hidden=[30000, 30000]'
  exit "$FAILED" ) || FAILED=1
refused_in_seconds "19c" "19c GPT activations beyond physical memory" "$TMP/refused19/c" \
  "re:needs about [0-9.]+ GiB per rank .* physical memory / 2 ranks on this node allows .*; change data.global_batch_size" -- \
  train --config "$TMP/gpt124.pbtxt" --set data.global_batch_size=8192
# The estimate without running: --dry-run prints it, creates nothing and exits 0 (2 when the run would not fit).
out="$TMP/dry.out"
timeout 120 "$AMPDIST" train --config "$TMP/gpt124.pbtxt" --set data.global_batch_size=2 --run-dir "$TMP/dry/run" \
  --dry-run >"$out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^memory estimate per rank: [0-9.]* GiB (124475904 parameters)" "$out" &&
   grep -q "activations: micro-batch of 2 " "$out" && [ ! -e "$TMP/dry" ]; then
  ok "19d --dry-run prints the estimate (124475904 parameters, micro-batch 2), creates nothing, exit 0"
else
  not_ok "19d --dry-run" "exit $rc"
  show "$out"
fi

exit "$FAILED"
