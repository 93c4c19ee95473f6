#!/usr/bin/env bash
# `make demo`: one DiLoCo run on this machine — a head and 4 providers on loopback with CURVE
# keys (configs/kjv-tiny-4p.json: tiny GPT on the King James Bible, H=50, int8 both ways) —
# then the summary (eval loss, bytes against fp32 data parallel) and a generated sample.
# `make demo-train` runs the single-cluster baseline instead (one provider, 2 Gloo ranks).
set -euo pipefail
XLOCO=${1:-build/src/cli/xloco}
MODE=${2:-local}
if [ "$MODE" = train ]; then
  NAME=kjv-tiny-demo
  rm -rf "runs/$NAME"
  "$XLOCO" train --config configs/kjv-tiny.json --nproc 2 --set run.name=$NAME
else
  NAME=kjv-tiny-4p-demo
  if [ -d "runs/$NAME" ]; then
    echo "demo: removing the previous demo run runs/$NAME"
    rm -rf "runs/$NAME"
  fi
  "$XLOCO" local --config configs/kjv-tiny-4p.json --set run.name=$NAME
fi
CKPT="runs/$NAME/ckpt/$(cat "runs/$NAME/ckpt/latest")"
"$XLOCO" eval --checkpoint "$CKPT"
echo "--- sample ---"
"$XLOCO" sample --checkpoint "$CKPT" --prompt "And God said" --tokens 300
