#!/usr/bin/env bash
# `make demo`: train the tiny GPT on the King James Bible with 2 ranks (one provider, Gloo data
# parallel), then print the final eval loss and a generated sample.
set -euo pipefail
XLOCO=${1:-build/src/cli/xloco}
RUN=runs/kjv-tiny-demo
if [ -d "$RUN" ]; then
  echo "demo: removing the previous demo run $RUN"
  rm -rf "$RUN"
fi
"$XLOCO" train --config configs/kjv-tiny.json --nproc 2 --set run.name=kjv-tiny-demo
CKPT="$RUN/ckpt/$(cat "$RUN/ckpt/latest")"
"$XLOCO" eval --checkpoint "$CKPT"
echo "--- sample ---"
"$XLOCO" sample --checkpoint "$CKPT" --prompt "And God said" --tokens 300
