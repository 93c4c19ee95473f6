#!/usr/bin/env bash
# Scoring's cost at 101 M parameters (issue 52): `xloco local` with the scale rehearsal's model
# (101.2 M parameters, batch 1, sequence 128), K = 2, H = 5, 20 inner steps (4 rounds), with
# outer.score off and on, interleaved twice (off, on, off, on) on the same machine. Prints, per
# run, the head's share of each round (head.jsonl comm_s), the round wall time and the providers'
# compute over rounds 2..4, the head's peak RSS against the parameter bytes, and the final loss.
#
#   bash experiments/score_cost_101m.sh [XLOCO] [OUT]     (about 8 minutes on 2 cores, 10 GB)
set -euo pipefail
XLOCO=${1:-build/src/cli/xloco}
OUT=${2:-runs/score-cost-101m}
cd "$(dirname "$0")/.."
SETS=(--set model.d_model=1024 --set model.n_layer=8 --set model.n_head=16 --set model.seq_len=128
      --set inner.batch_size=1 --set inner.steps=20 --set inner.warmup_steps=2
      --set outer.inner_steps=5 --set inner.eval_batches=2 --set outer.eval_every=0
      --set outer.providers=2 --set outer.min_providers=2 --set inner.log_every=5
      --set "run.dir=$OUT")
for rep in 1 2; do
  for score in false true; do
    echo "run: score $score, repetition $rep" >&2
    "$XLOCO" local --config configs/kjv-tiny-4p.json "${SETS[@]}" --set "outer.score=$score" \
      --set "run.name=score-$score-$rep" > "$OUT-score-$score-$rep.log" 2>&1 ||
      { echo "run score-$score-$rep failed: see $OUT-score-$score-$rep.log" >&2; exit 1; }
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print("| run | head's share of a round (comm_s) | round wall | providers' compute | head peak RSS | final eval loss |")
print("|---|---|---|---|---|---|")
for rep in (1, 2):
    for score in ("false", "true"):
        d = f"{out}/score-{score}-{rep}"
        rows = [json.loads(l) for l in open(f"{d}/metrics/head.jsonl") if l.strip()]
        later = [r for r in rows if r.get("round", 0) >= 2 and "comm_s" in r]
        s = json.load(open(f"{d}/summary.json"))
        mean = lambda k: statistics.mean(r.get(k, 0) for r in later)
        print(f"| score {score}, rep {rep} | {mean('comm_s'):.2f} s | {mean('round_wall_s'):.2f} s | "
              f"{mean('compute_s'):.2f} s | {s['head_peak_rss_bytes'] / 2**20:.0f} MiB "
              f"({s['head_peak_rss_bytes'] / s['param_bytes']:.2f}x) | {s['final_eval_loss']:.4f} |")
PY
