#!/usr/bin/env bash
# `make rehearse-scale`: the scale rehearsal of issue 14. The head and 4 providers in network
# namespaces (deploy/rehearse.sh) over tbf-limited links of 100, 100, 50 and 10 Mbit/s; a GPT of
# 101 M parameters (d_model 1024, 8 layers, byte vocabulary), int8 both ways, batch 1 and H = 25
# so that a round's compute is about a minute on 2 cores; provider-1 joins after round 2 (its
# full state over its own link), provider-2 is killed 5 s after round 4 closed (mid-transfer of
# that update). Then experiments/scale_report.py: per-round compute / idle / link time per
# provider, peak RSS, /status latency. Needs root; about 15 minutes and 14 GB of memory.
# Further arguments go to deploy/rehearse.sh after these, so a later --set overrides one here:
#   NAME=scale-topk experiments/rehearse_scale.sh build/src/cli/xloco --set outer.codec_up=topk ...
set -euo pipefail
XLOCO=${1:-build/src/cli/xloco}
shift || true
NAME=${NAME:-scale}
rm -rf "runs/$NAME"
set +e
bash "$(dirname "$0")/../deploy/rehearse.sh" --xloco "$XLOCO" --config configs/kjv-tiny-4p.json \
  --name "$NAME" --providers 4 --rates 100mbit,100mbit,50mbit,10mbit --late 1:2 --kill 2:4:5 \
  --timeout 5400 \
  --set model.d_model=1024 --set model.n_layer=8 --set model.n_head=16 --set model.seq_len=128 \
  --set inner.batch_size=1 --set inner.steps=200 --set inner.warmup_steps=20 \
  --set outer.inner_steps=25 --set inner.eval_batches=4 --set outer.eval_every=2 \
  --set outer.checkpoint_every=4 --set outer.min_providers=2 --set outer.start_grace_s=60 \
  --set outer.deadline_multiple=1.5 --set outer.deadline_min_s=30 --set inner.log_every=5 "$@"
rc=$?
set -e
[ "$rc" -ne 77 ] || exit 77
python3 "$(dirname "$0")/scale_report.py" "runs/$NAME"
exit "$rc"
