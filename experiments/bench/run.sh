#!/usr/bin/env bash
# `make bench`: every benchmark of design §9 that exists, each against its reference in the
# same run. Results go to stdout; copy the figures into experiments/RESULTS.md with this command.
set -euo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
echo "== inner step throughput: xloco vs PyTorch"
/usr/bin/python3 "$HERE/throughput.py" "$BUILD/src/cli/xloco"
TORCH2_PY=${TORCH2_PY:-$HERE/../../.venv-torch2/bin/python}
if [ -x "$TORCH2_PY" ]; then
  echo "== inner step throughput: xloco vs PyTorch 2.x (eager, SDPA, torch.compile) and 1.13"
  /usr/bin/python3 "$HERE/throughput.py" "$BUILD/src/cli/xloco" --torch2 "$TORCH2_PY" --repeats 2
else
  echo "== (no PyTorch 2.x environment at $TORCH2_PY: bash deploy/setup_torch2.sh makes it)"
fi
echo "== inner step throughput: built-in tiny GPT vs its TorchScript twin"
/usr/bin/python3 "$HERE/throughput.py" "$BUILD/src/cli/xloco" --torchscript
mm=$(find "$BUILD/experiments/bench" -name bench_matmul -type f -executable 2>/dev/null | head -1)
if [ -n "$mm" ]; then
  echo "== model FLOPs utilisation (1 intra-op x 1 OpenBLAS thread)"
  /usr/bin/python3 "$HERE/throughput.py" "$BUILD/src/cli/xloco" --mfu "$mm"
fi
for b in bench_attention bench_codec bench_net bench_relay; do
  exe=$(find "$BUILD/experiments/bench" -name "$b" -type f -executable 2>/dev/null | head -1)
  if [ -n "$exe" ]; then
    echo "== $b"
    "$exe"
  fi
done
