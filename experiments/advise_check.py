#!/usr/bin/env python3
"""Checks `xloco advise`'s predicted utilization against a harness run over rate-limited links
(issue 53). For each run directory (a netns run of experiments/plans/overlap.json, K = 4, H = 50,
int8/int8, no overlap) and its link rate: the providers' step times from their own metrics
(compute_s / H, rounds 2..), the parameters from summary.json, `xloco advise --at-h H` for the
int8/int8 row; the measured utilization as the harness counts it (the slowest provider's compute
over the round's wall time, rounds 2..).

  python3 experiments/harness.py --plan experiments/plans/overlap.json --out /tmp/advise-check \\
      --work /tmp/advise-work --only wan20-none --only wan5-none
  python3 experiments/advise_check.py build/src/cli/xloco \\
      /tmp/advise-work/runs/overlap-wan20-none=20 /tmp/advise-work/runs/overlap-wan5-none=5"""
import glob
import json
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    xloco, worst = sys.argv[1], 0.0
    for arg in sys.argv[2:]:
        run, rate = arg.rsplit("=", 1)
        cfg = json.load(open(f"{run}/config.json"))
        H, K = cfg["outer"]["inner_steps"], cfg["outer"]["providers"]
        rows = [json.loads(l) for l in open(f"{run}/metrics/head.jsonl") if l.strip()]
        rows = [r for r in rows if r.get("round", 0) >= 2 and r.get("round_wall_s", 0) > 0]
        measured = sum(r["compute_s"] for r in rows) / sum(r["round_wall_s"] for r in rows)
        steps = []
        for f in sorted(glob.glob(f"{run}/providers/*/metrics/*.jsonl")):
            recs = [json.loads(l) for l in open(f) if l.strip()]
            cs = [r["compute_s"] / H for r in recs if r.get("round_done", 0) >= 2 and "compute_s" in r]
            if cs:
                steps.append(statistics.mean(cs))
        params = json.load(open(f"{run}/summary.json"))["param_bytes"] / 4
        out = subprocess.run([xloco, "advise", "--params", str(params), "--step-s",
                              ",".join(f"{s:.4f}" for s in steps), "--link-mbit", rate,
                              "--providers", str(K), "--at-h", str(H)],
                             capture_output=True, text=True, check=True).stdout
        row = next(l for l in out.splitlines() if l.startswith("int8/int8 "))
        predicted = float(row.split()[1].rstrip("%")) / 100
        worst = max(worst, abs(predicted - measured))
        print(f"{run} ({rate} Mbit/s): step {', '.join(f'{s:.3f}' for s in steps)} s; "
              f"utilization measured {100 * measured:.2f} %, predicted {100 * predicted:.2f} % "
              f"({100 * (predicted - measured):+.2f} points)")
    print(f"largest difference {100 * worst:.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
