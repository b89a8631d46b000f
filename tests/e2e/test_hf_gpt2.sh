#!/usr/bin/env bash
# GPT-2 weights in the Hugging Face layout, in and out, through a real client: transformers' GPT2LMHeadModel
# (tests/e2e/hf_gpt2.py, build/pyenv from launch/setup/install_deps.sh) builds small random GPT-2s and saves them
# with save_pretrained; ampdist starts from them (model.init_from, 0 steps) and its validation loss must equal
# transformers' on the same windows; `ckpt export --format hf` must give back a directory whose logits equal the
# original's. Both with a vocabulary ampdist pads (1000 -> 1024, untied head, a sharded checkpoint with its index)
# and without (384, tied). Then every refusal of a bad source (one line naming file and tensor, exit 2 on every rank
# of an mpirun -np 2), an fp16 file (widened exactly), ZeRO stage 1, fine-tuning on 2 ranks in fp16 and bf16 with a
# resume, and generate's KV cache against the full-window path.
source "$(dirname "$0")/lib.sh" hf_gpt2 "$@"
PY="$SRC/build/pyenv/bin/python3"
HF="$SRC/tests/e2e/hf_gpt2.py"
if [ ! -x "$PY" ] || ! "$PY" -c "import transformers, safetensors" 2> "$TMP/import.txt"; then
  echo "skip: transformers cannot be imported from $PY (run launch/setup/install_deps.sh): $(tail -1 "$TMP/import.txt" 2>/dev/null)"
  exit 77
fi
export TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
cd "$TMP" || exit 1
run() {  # run NP OUT ARGS...
  local np=$1 out=$2
  shift 2
  timeout 300 mpirun -q --oversubscribe -np "$np" "$AMPDIST" train "$@" > "$out" 2>&1
}
# The validation loss of a run at full precision, from its metrics.jsonl.
val_loss() { sed -n 's/.*"test_loss":\([0-9.e+-]*\).*"type":"eval".*/\1/p' "$1/metrics.jsonl" | tail -1; }
first_val_loss() { sed -n 's/.*"test_loss":\([0-9.e+-]*\).*"type":"eval".*/\1/p' "$1/metrics.jsonl" | head -1; }
# |a - b| <= tol
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }

# Two models: A tied, vocabulary 384 (no padding); B untied, vocabulary 1000 padded to 1024, sharded (5 files + index).
"$PY" "$HF" make A --vocab 384 --layers 2 --heads 2 --embd 32 --positions 32 > make.txt 2>&1 &&
  "$PY" "$HF" make B --vocab 1000 --layers 2 --heads 2 --embd 32 --positions 32 --untied --shard-bytes 40000 \
    >> make.txt 2>&1 &&
  "$PY" "$HF" tokens a.bin --vocab 384 --count 4000 && "$PY" "$HF" tokens b.bin --vocab 1000 --count 4000 ||
  { not_ok "setup" "$(tail -3 make.txt)"; exit 1; }
[ -f B/model.safetensors.index.json ] && [ ! -f B/model.safetensors ] && ok "model B is sharded ($(ls B/*.safetensors | wc -l) files + index)" ||
  not_ok "sharded model" "$(ls B)"

config() {  # config NAME VOCAB EXTRA_GPT INIT TOKENS
  cat <<PB
name: "$1"
model { gpt { n_layer: 2 n_head: 2 n_embd: 32 seq_len: 32 vocab_size: $2 $3 } init_from: "$4" }
data { tokens { train: "$TMP/$5" val: "$TMP/$5" } global_batch_size: 8 eval_batch_size: 64 }
optimizer { adamw {} lr: 0.003 }
train { steps: 0 epochs: 0 }
PB
}
config a 384 "" "$TMP/A" a.bin > a.pbtxt
config b 1000 "padded_vocab_multiple: 64 tie_embeddings: false" "$TMP/B" b.bin > b.pbtxt

for m in a b; do
  M=$(echo "$m" | tr a-z A-Z)
  run 1 "$m.txt" --config "$m.pbtxt" --run-dir "r$m" || not_ok "$m: 0-step run from $M" "exit $?: $(tail -3 "$m.txt")"
  # steps 0 and epochs 0 without a checkpoint: one true line, not a warning about a checkpoint at step 0.
  grep -q '^train.steps and train.epochs are 0: nothing to train; evaluating the weights of model.init_from$' "$m.txt" &&
    ! grep -q 'the checkpoint is at step' "$m.txt" && ok "$m: the 0-step run says it evaluates model.init_from's weights" ||
    not_ok "$m: 0-step message" "$(grep -i 'nothing to train' "$m.txt")"
  ours=$(val_loss "r$m")
  theirs=$("$PY" "$HF" loss "$M" "$m.bin" --seq-len 32 2> "$m.py.txt" | cut -d' ' -f1)
  # Tolerance 1e-4 (the issue's): both sides are FP32 forwards of the same weights; they differ only in the order
  # of FP32 sums (GEMMs, attention, the loss), ~1e-7 relative per op on ~6-nat losses.
  close "$ours" "$theirs" 1e-4 && ok "$m: ampdist's validation loss from init_from $M equals transformers' ($ours vs $theirs)" ||
    not_ok "$m: loss from init_from" "ampdist '$ours', transformers '$theirs' $(tail -2 "$m.py.txt")"
  "$AMPDIST" ckpt export "r$m/checkpoints" --format hf -o "x$m" > "x$m.txt" 2>&1 || not_ok "$m: export --format hf" "$(cat "x$m.txt")"
  # A disk that fills during the export (a 64 KiB file-size limit; SIGXFSZ ignored, so the write fails with EFBIG):
  # one error line, non-zero, and neither the directory nor its .tmp is left behind.
  (trap '' XFSZ; exec prlimit --fsize=65536 "$AMPDIST" ckpt export "r$m/checkpoints" --format hf -o "full$m") \
    > "full$m.txt" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$(grep -c '^ampdist: error: ' "full$m.txt")" -eq 1 ] && [ ! -e "full$m" ] &&
     [ ! -e "full$m.tmp" ]; then
    ok "$m: export --format hf to a full disk: exit $rc, one line, nothing left ($(cut -c1-90 "full$m.txt"))"
  else
    not_ok "$m: export to a full disk" "exit $rc, left: $(ls -d "full$m" "full$m.tmp" 2>/dev/null | tr '\n' ' ') $(head -3 "full$m.txt")"
  fi
  diff=$("$PY" "$HF" compare "$M" "x$m" 2> "c$m.txt")
  # Tolerance 1e-5 (the issue's): the exported tensors are the same FP32 values, so the logits are bitwise equal.
  close "${diff%% *}" 0 1e-5 && ok "$m: transformers' logits of the export equal the original's (max diff ${diff})" ||
    not_ok "$m: exported logits" "'$diff' $(tail -2 "c$m.txt")"
done
grep -q '"vocab_size": 1000' xb/config.json && "$PY" -c "
from safetensors import safe_open
f = safe_open('xb/model.safetensors', 'np')
assert f.get_tensor('transformer.wte.weight').shape == (1000, 32), 'wte'
assert f.get_tensor('lm_head.weight').shape == (1000, 32), 'lm_head'
" 2> xb.check && ok "b: the export has the unpadded vocabulary (wte and lm_head [1000, 32])" ||
  not_ok "b: export vocabulary" "$(cat xb.check)"

# The same model from a single safetensors file (the export's), under ZeRO stage 1 on 2 ranks: the same weights.
sed -e "s#init_from: \"$TMP/A\"#init_from: \"$TMP/xa/model.safetensors\"#" a.pbtxt > a1.pbtxt
run 2 a1.txt --config a1.pbtxt --run-dir ra1 --set optimizer.zero_stage=1 --precision fp16 ||
  not_ok "init_from a file under ZeRO 1" "$(tail -3 a1.txt)"
[ -n "$(hash_of a.txt)" ] && [ "$(hash_of a.txt)" = "$(hash_of a1.txt)" ] &&
  ok "init_from a .safetensors file on 2 ranks with ZeRO stage 1 (fp16) gives the same master weights ($(hash_of a1.txt))" ||
  not_ok "ZeRO 1 init_from" "$(hash_of a.txt) vs $(hash_of a1.txt)"

# fp16 weights are widened exactly: ampdist's loss equals transformers' on the fp16 model's FP32 widening.
"$PY" "$HF" make A16 --vocab 384 --layers 2 --heads 2 --embd 32 --positions 32 --fp16 >> make.txt 2>&1
sed -e "s#$TMP/A\"#$TMP/A16\"#" a.pbtxt > a16.pbtxt
run 1 a16.txt --config a16.pbtxt --run-dir ra16 || not_ok "fp16 source" "$(tail -3 a16.txt)"
ours=$(val_loss ra16)
theirs=$("$PY" "$HF" loss A16 a.bin --seq-len 32 2>/dev/null | cut -d' ' -f1)
close "$ours" "$theirs" 1e-4 && ok "an fp16 safetensors source: loss $ours equals transformers' (FP32) $theirs" ||
  not_ok "fp16 source" "ampdist '$ours', transformers '$theirs'"

# Refusals: one line naming the file (and tensor), exit 2, from a 2-rank run.
refuse() {  # refuse CASE CONFIG INIT_PATH PATTERN [--set ...]
  local case=$1 cfg=$2 init=$3 pattern=$4
  shift 4
  run 2 "ref.txt" --config "$cfg" --run-dir rref --init-from "$init" "$@"
  local rc=$? errs
  errs=$(grep -c "error" ref.txt)
  if [ "$rc" -eq 2 ] && [ "$errs" -eq 1 ] && grep -q "$pattern" ref.txt; then
    ok "refused, $case: $(grep error ref.txt)"
  else
    not_ok "refusal: $case" "exit $rc, $errs error lines"
    show ref.txt
  fi
}
mkdir -p bad && cp A/config.json bad/
"$PY" "$HF" edit A/model.safetensors bad/missing.safetensors drop transformer.h.1.mlp.c_fc.bias
"$PY" "$HF" edit A/model.safetensors bad/shape.safetensors reshape transformer.h.0.attn.c_proj.weight
"$PY" "$HF" edit A/model.safetensors bad/extra.safetensors add transformer.h.0.attn.rotary
echo "not a model" > bad/text.safetensors
head -c 100000 A/model.safetensors > bad/truncated.safetensors
refuse "missing tensor" a.pbtxt "$TMP/bad/missing.safetensors" "missing.safetensors: has no tensor transformer.h.1.mlp.c_fc.bias"
refuse "wrong shape" a.pbtxt "$TMP/bad/shape.safetensors" "shape.safetensors: tensor transformer.h.0.attn.c_proj.weight has shape \[31, 32\]"
refuse "extra tensor" a.pbtxt "$TMP/bad/extra.safetensors" "extra.safetensors: tensor transformer.h.0.attn.rotary .* is not a parameter"
refuse "not safetensors" a.pbtxt "$TMP/bad/text.safetensors" "text.safetensors: not a safetensors file"
refuse "truncated" a.pbtxt "$TMP/bad/truncated.safetensors" "truncated.safetensors: truncated: tensor "
refuse "wrong n_head" a.pbtxt "$TMP/A" "A/config.json: n_head is 2, model.gpt.n_head is 4" --set model.gpt.n_head=4
refuse "no such path" a.pbtxt "$TMP/nothing" "nothing: no such file or directory"
rm -rf B2 && cp -r B B2 && rm "B2/$(ls B2 | grep -m1 'model-0000')"
refuse "a missing shard" b.pbtxt "$TMP/B2" "model.safetensors.index.json: maps tensor .* which does not exist"
[ ! -d rref/checkpoints/step_00000000 ] && ok "no refused run saved a checkpoint" || not_ok "refusals saved" "$(ls rref/checkpoints)"

# Fine-tuning from B on 2 ranks, fp16 and bf16: the validation loss goes down; a resume continues bitwise.
for p in fp16 bf16; do
  run 2 "ft_$p.txt" --config b.pbtxt --run-dir "ft_$p" --precision "$p" --set train.steps=40 \
    --set train.eval_every_steps=40 --set checkpoint.every_steps=20 --set train.epochs=1 --set data.global_batch_size=16 ||
    not_ok "fine-tune $p" "$(tail -3 "ft_$p.txt")"
  before=$(val_loss rb)
  after=$(val_loss "ft_$p")
  awk -v a="$after" -v b="$before" 'BEGIN { exit !(a != "" && a < b - 0.5) }' &&
    ok "fine-tuning B on 2 ranks in $p lowers the validation loss from $before to $after" ||
    not_ok "fine-tune $p" "before '$before', after '$after'"
done
mkdir -p ft_r/checkpoints && cp -r ft_fp16/checkpoints/step_00000020 ft_r/checkpoints/
run 2 ft_r.txt --config b.pbtxt --run-dir ft_r --precision fp16 --set train.steps=40 --set train.eval_every_steps=40 \
  --set checkpoint.every_steps=20 --set train.epochs=1 --set data.global_batch_size=16 --resume auto ||
  not_ok "fine-tune resume" "$(tail -3 ft_r.txt)"
[ -n "$(hash_of ft_fp16.txt)" ] && [ "$(hash_of ft_fp16.txt)" = "$(hash_of ft_r.txt)" ] &&
  ok "a fine-tuning run resumed at step 20 ends bitwise like the uninterrupted one ($(hash_of ft_r.txt))" ||
  not_ok "fine-tune resume bitwise" "$(hash_of ft_fp16.txt) vs $(hash_of ft_r.txt)"

# generate on the 1000-token model: ids in, ids out; the KV cache gives the same tokens as full windows (greedy and
# sampled), also past the window (48 tokens after a 4-token prompt, seq_len 32).
for mode in "--temperature 0" "--temperature 0.9 --top-k 50 --seed 3"; do
  # shellcheck disable=SC2086  # the mode's words are separate options
  "$AMPDIST" generate --checkpoint ft_fp16/checkpoints --prompt-ids 1,10,37,118 --tokens 48 $mode > g_on.txt 2>&1
  # shellcheck disable=SC2086
  "$AMPDIST" generate --checkpoint ft_fp16/checkpoints --prompt-ids 1,10,37,118 --tokens 48 $mode --kv-cache off \
    > g_off.txt 2>&1
  n=$(wc -w < g_on.txt)
  [ "$n" -eq 52 ] && cmp -s g_on.txt g_off.txt && ok "generate ($mode): 48 ids with the KV cache equal the full-window ones" ||
    not_ok "generate ($mode)" "$n words; on: $(head -c 200 g_on.txt) off: $(head -c 200 g_off.txt)"
done
"$AMPDIST" generate --checkpoint ft_fp16/checkpoints --prompt-ids 1,1000 --tokens 2 > g_bad.txt 2>&1
[ $? -eq 2 ] && grep -q "prompt-ids: \"1000\" is not a token id in \[0, 1000)" g_bad.txt &&
  ok "generate refuses a prompt id outside the vocabulary" || not_ok "generate bad id" "$(cat g_bad.txt)"
exit "$FAILED"
