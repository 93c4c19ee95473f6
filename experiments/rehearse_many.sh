#!/usr/bin/env bash
# `make rehearse-many` (issue 54): a real head (`xloco head`, CURVE on loopback) with K simulated
# providers (experiments/bench/outer/rehearse_many.cpp: the provider's link code replaying
# pre-encoded uplink frames, no inner steps), for each K in $KS and each downlink in $DOWNS. The
# model is the scale rehearsal's GPT of 101 M parameters (d_model 1024, 8 layers, byte
# vocabulary); the uplink is topk 176 of 4096 at 2 bits (recipe wan-sparse's). Per run: the
# head's round close (wall and CPU time of its loop thread, rounds 2..R), its peak RSS against
# 5 × fp32 parameters + K frames, and the bytes each provider receives a round. Writes
# $OUT/table.md and prints it.
set -euo pipefail
XLOCO=${1:-build/src/cli/xloco}
SIM=${2:-build/experiments/bench/outer/rehearse_many}
KS=${KS:-"4 16 64"}
DOWNS=${DOWNS:-"int8 relay"}
ROUNDS=${ROUNDS:-4}
OUT=${OUT:-runs/rehearse-many}
for exe in "$XLOCO" "$SIM"; do
  [ -x "$exe" ] || { echo "rehearse_many: $exe is not built (make rehearse-many builds both)" >&2; exit 1; }
done
rm -rf "$OUT"
mkdir -p "$OUT"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for k in $KS; do
  for down in $DOWNS; do
    d="$OUT/k$k-$down"
    mkdir -p "$d"
    "$SIM" keys "$d/keys" "$k" > /dev/null
    sets=(--set run.dir="$d" --set run.name=run --set model.d_model=1024 --set model.n_layer=8
          --set model.n_head=16 --set model.seq_len=128 --set inner.batch_size=1
          --set outer.inner_steps=10 --set inner.steps=$((ROUNDS * 10)) --set inner.warmup_steps=0
          --set outer.eval_every=0 --set outer.checkpoint_every=0 --set outer.providers="$k"
          --set outer.min_providers="$k" --set outer.codec_up=topk --set outer.block_size=4096
          --set outer.topk=176 --set outer.heartbeat_s=1 --set outer.dead_after_s=300
          --set outer.head_timeout_s=900 --set outer.round_timeout_s=900
          --set outer.deadline_min_s=600 --set outer.start_grace_s=600)
    if [ "$down" = relay ]; then
      sets+=(--set outer.downlink=relay --set outer.momentum=0 --set outer.relay_mean=clipped)
    else
      sets+=(--set outer.codec_down="$down")
    fi
    echo "== K = $k, downlink $down"
    "$XLOCO" head --config configs/kjv-tiny-4p.json "${sets[@]}" --key "$d/keys/head.key" \
      --allow "$d/keys/providers" --bind tcp://127.0.0.1:0 --endpoint-file "$d/endpoint" \
      > "$d/head.log" 2>&1 &
    head_pid=$!
    pids+=("$head_pid")
    for _ in $(seq 600); do [ -s "$d/endpoint" ] && break; sleep 0.2; done
    [ -s "$d/endpoint" ] || { echo "the head did not start: $d/head.log" >&2; tail "$d/head.log" >&2; exit 1; }
    # Freed updates go back to the OS at once (glibc otherwise keeps them in its arenas): the
    # K providers share one process here, where on a real run each is its own machine.
    if ! MALLOC_MMAP_THRESHOLD_=1048576 "$SIM" run --config configs/kjv-tiny-4p.json "${sets[@]}" --keys "$d/keys" \
        --endpoint "$(cat "$d/endpoint")" --providers "$k" --out "$d/providers.json" > "$d/providers.log" 2>&1; then
      echo "the simulated providers failed: $d/providers.log" >&2
      tail "$d/providers.log" >&2
      exit 1
    fi
    wait "$head_pid" || { echo "the head failed: $d/head.log" >&2; tail "$d/head.log" >&2; exit 1; }
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = ["| K | downlink | round close, wall (s) | round close, head CPU (s) | head peak RSS (GB) | "
        "bound 5 × fp32 + K frames (GB) | frame (MB) | per provider a round: up / down (MB) |",
        "|---|---|---|---|---|---|---|---|"]
for d in sorted(out.iterdir(), key=lambda p: (int(p.name[1:].split("-")[0]), p.name)):
    if not d.is_dir():
        continue
    summary = json.loads((d / "run" / "summary.json").read_text())
    rounds = [json.loads(l) for l in (d / "run" / "metrics" / "head.jsonl").read_text().splitlines() if l.strip()]
    rounds = [r for r in rounds if "close_cpu_s" in r]
    steady = rounds[1:] if len(rounds) > 1 else rounds
    prov = json.loads((d / "providers.json").read_text())
    k, frame = prov["providers"], prov["frame_bytes"]
    down = statistics.mean(p["update_bytes"] / max(1, p["rounds"]) for p in prov["received"])
    bound = 5 * summary["param_bytes"] + k * frame
    rss = summary["head_peak_rss_bytes"]
    rows.append(f"| {k} | {d.name.split('-', 1)[1]} | {statistics.median(r['close_s'] for r in steady):.2f} "
                f"(max {max(r['close_s'] for r in steady):.2f}) | "
                f"{statistics.median(r['close_cpu_s'] for r in steady):.2f} "
                f"(max {max(r['close_cpu_s'] for r in steady):.2f}) | {rss / 1e9:.2f} | {bound / 1e9:.2f}"
                f"{'' if rss <= bound else ' **over**'} | {frame / 1e6:.2f} | {frame / 1e6:.1f} / {down / 1e6:.1f} |")
text = "\n".join(rows) + "\n"
(out / "table.md").write_text(text)
print(text)
PY
