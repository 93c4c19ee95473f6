#!/usr/bin/env bash
# Bring-your-own-text measurements (issue 16), in one run on this machine:
#   1. `xloco prepare` on KJV (vocabulary 4096) and on GCIDE (Debian's dict-gcide, 8192): time,
#      MB/s against SentencePiece's own spm_encode on the same file with the same tokenizer, and
#      a plain-Python llm.c reader checking the files against spm_encode (tests/llmc_reader.py);
#   2. DiLoCo K=4 (configs/kjv-tiny-4p.json) on the KJV token files against the byte-level run of
#      the same config: eval loss in nats per byte, and a sample;
#   3. gpt2-small (model.vocab_size 50257, so GPT-2's exact size) trains 3 steps on CPU, and its
#      export loads into an independent GPT-2 whose logits match xloco's.
# Usage: experiments/byo_text.sh [XLOCO] (root for apt; about 40 minutes on 2 cores).
set -euo pipefail
XLOCO=$(realpath "${1:-build/src/cli/xloco}")
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$SRC/runs/byo}
PY=/usr/bin/python3  # Debian's, with python3-torch
mkdir -p "$OUT"
cd "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)"
dpkg-query -W -f='${Status}' dict-gcide 2>/dev/null | grep -q "install ok installed" ||
  apt-get install -y -qq --no-install-recommends dict-gcide

# The texts: KJV as xloco strips it (verse references off), GCIDE as the package ships it.
[ -s kjv.txt ] || bible -f "Gen1:1-Rev22:21" | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > kjv.txt
[ -s gcide.txt ] || zcat /usr/share/dictd/gcide.dict.dz > gcide.txt

secs() { "$PY" -c "import sys,time; print(f'{time.time():.3f}')"; }
for spec in "kjv 4096" "gcide 8192"; do
  set -- $spec
  name=$1 vocab=$2 text=$1.txt
  mb=$("$PY" -c "import os; print(os.path.getsize('$text') / 1e6)")
  rm -rf "$name-tok" "$name-tok1"
  t0=$(secs); "$XLOCO" prepare --input "$text" --out "$name-tok" --vocab-size "$vocab" | tail -2; t1=$(secs)
  "$XLOCO" prepare --input "$text" --out "$name-tok1" --tokenizer "$name-tok/tokenizer.model" --threads 1 > "$name-1t.log"
  t2=$(secs)
  spm_encode --model="$name-tok/tokenizer.model" --output_format=id < "$text" > /dev/null
  t3=$(secs)
  cmp -s "$name-tok/train_000000.bin" "$name-tok1/train_000000.bin" && same=yes || same=NO
  "$PY" - "$name" "$mb" "$t0" "$t1" "$t2" "$t3" "$same" <<'EOF'
import sys
name, mb, t0, t1, t2, t3, same = sys.argv[1], float(sys.argv[2]), *map(float, sys.argv[3:7]), sys.argv[7]
print(f"{name}: {mb:.2f} MB | prepare (train tokenizer + encode, 2 threads) {t1 - t0:.1f}s | "
      f"prepare with the tokenizer, 1 thread {mb / (t2 - t1):.2f} MB/s | spm_encode {mb / (t3 - t2):.2f} MB/s "
      f"(ratio {(t3 - t2) / (t2 - t1):.2f}) | same files from 1 and 2 threads: {same}")
EOF
  grep -h "prepared" "$name-1t.log"
  "$PY" "$SRC/tests/llmc_reader.py" "$name-tok" "$text"
done

# DiLoCo K=4 on tokens vs bytes: the same config, steps, batch and windows.
for kind in bytes tokens; do
  rm -rf "runs/byo-$kind"
  extra=()
  [ "$kind" = tokens ] && extra=(--set data.dataset=tokens --set "data.path=$OUT/kjv-tok")
  t0=$(secs)
  "$XLOCO" local --config "$SRC/configs/kjv-tiny-4p.json" --set "run.name=byo-$kind" "${extra[@]}" \
    > "byo-$kind.log" 2>&1
  t1=$(secs)
  ckpt="runs/byo-$kind/ckpt/$(cat "runs/byo-$kind/ckpt/latest")"
  echo "$kind: $("$PY" -c "print(f'{$t1 - $t0:.0f}s')") | $("$XLOCO" eval --checkpoint "$ckpt")"
done
"$XLOCO" sample --checkpoint "runs/byo-tokens/ckpt/$(cat runs/byo-tokens/ckpt/latest)" \
  --prompt "And God said" --tokens 60

# gpt2-small on CPU: 3 steps of 2 x 1024 tokens, then export and the independent reader.
rm -rf runs/byo-gpt2
"$XLOCO" train --config "$SRC/configs/tokens-gpt2-small.json" --set "data.path=$OUT/kjv-tok" \
  --set model.vocab_size=50257 --set run.name=byo-gpt2 --set run.device=cpu --set inner.steps=3 \
  --set inner.batch_size=2 --set inner.warmup_steps=1 --set inner.eval_every=0 \
  --set inner.eval_batches=1 --set inner.log_every=1 2>&1 | grep -E "params|step|final"
ckpt="runs/byo-gpt2/ckpt/$(cat runs/byo-gpt2/ckpt/latest)"
"$XLOCO" eval --checkpoint "$ckpt" --logits-out gpt2-logits.safetensors
rm -rf gpt2-hf
"$XLOCO" export --checkpoint "$ckpt" --format hf --out gpt2-hf
"$PY" "$SRC/tests/hf_gpt2_reader.py" gpt2-hf gpt2-logits.safetensors --tol 1e-4
