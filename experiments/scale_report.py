#!/usr/bin/env python3
"""The report of a scale rehearsal (experiments/rehearse_scale.sh): per round, each provider's
compute, idle time and the time its own link needs for its frames; the head's and providers'
peak RSS against the parameter bytes; /status latency. It checks the goals of issue 14 and
design §9 ("scale") and says which hold, writes RUN/scale_report.md and RUN/scale_report.json,
and exits 0 (the figures are the result; the checks are reported, not enforced).

  python3 experiments/scale_report.py runs/scale
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import read_jsonl  # noqa: E402  (one JSONL reader: a torn last line is skipped)

RUNTIME_BYTES = 164e6  # a LibTorch process before it holds any model (RESULTS.md, issue 5)


jsonl = read_jsonl


def bits_per_s(rate):
    r = rate.lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if r.endswith(unit):
            return float(r[: -len(unit)]) * mult
    raise ValueError(rate)


def main():
    run = Path(sys.argv[1])
    reh = json.loads((run / "rehearsal.json").read_text())
    rates = reh.get("rates") or [reh["rate"]] * reh["providers"]
    rounds = jsonl(run / "metrics" / "head.jsonl")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    param_bytes = summary.get("param_bytes")
    samples = jsonl(run / "status_samples.jsonl")
    providers = {}
    for i, rate in enumerate(rates):
        name = f"provider-{i}"
        rows = jsonl(run / "providers" / name / "metrics" / f"provider-{name}.jsonl")
        providers[name] = {"rate": rate,
                           "rounds": [r for r in rows if "round_done" in r],
                           "final": next((r for r in rows if r.get("final")), None)}

    lines = [f"# Scale rehearsal: {run.name}", "",
             f"{len(rounds)} rounds; links {', '.join(rates)}; late: {reh.get('late') or '-'}; "
             f"killed: {reh.get('kill') or '-'}; parameters {param_bytes / 4 / 1e6:.1f} M" if param_bytes
             else f"{len(rounds)} rounds", ""]
    lines += ["| round | closed because | participants | round s | eval |", "|---|---|---|---|---|"]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['reason'][:70]} | {r['participants']} | {r['round_wall_s']:.1f} | "
                     f"{r.get('eval_loss', r.get('eval_skipped', '-'))} |")
    lines += ["", "Per provider and round: compute, idle (not computing: sending, waiting for the round, "
              "receiving), and the time its own link needs for the bytes it sent and received "
              "(at its tbf rate).", "",
              "| provider | link | round | compute s | idle s | link needs s | idle / (link + 10 %) |",
              "|---|---|---|---|---|---|---|"]
    worst = {}
    for name, p in providers.items():
        bps = bits_per_s(p["rate"])
        for r in p["rounds"]:
            need = (r["up_bytes"] + r["down_bytes"]) * 8 / bps
            ratio = r["idle_s"] / (1.1 * need) if need > 0 else float("inf")
            worst[name] = max(worst.get(name, 0), ratio if r is not p["rounds"][0] else 0)
            lines.append(f"| {name} | {p['rate']} | {r['round_done']} | {r['compute_s']:.1f} | "
                         f"{r['idle_s']:.1f} | {need:.1f} | {ratio:.2f} |")
    # Samples before the head first answered and after it last did are its start and its end.
    ok_at = [i for i, s in enumerate(samples) if s["ok"]]
    up = samples[ok_at[0]:ok_at[-1] + 1] if ok_at else []
    lat = sorted(s["latency_s"] for s in up)
    failed = [s for s in up if not s["ok"]]
    head_rss = summary.get("head_peak_rss_bytes")
    checks = []
    if lat:
        checks.append((f"/status answered within 1 s at every sample while the head was up: {len(lat)} samples, "
                       f"max {lat[-1]:.3f} s, median {lat[len(lat) // 2]:.3f} s, {len(failed)} failed",
                       lat[-1] <= 1.0 and not failed))
    if head_rss and param_bytes:
        x = (head_rss - RUNTIME_BYTES) / param_bytes
        checks.append((f"head peak RSS {head_rss / 2**20:.0f} MiB = {x:.2f}x parameter bytes "
                       f"(+{RUNTIME_BYTES / 1e6:.0f} MB runtime); goal <= 5x", x <= 5))
    for name, p in providers.items():
        if p["final"] and param_bytes:
            x = (p["final"]["peak_rss_bytes"] - RUNTIME_BYTES) / param_bytes
            checks.append((f"{name} peak RSS {p['final']['peak_rss_bytes'] / 2**20:.0f} MiB = {x:.2f}x "
                           f"parameter bytes, activations included; goal <= 7x + activations", x <= 7))
    for name, ratio in worst.items():
        checks.append((f"{name}: idle per round at most {ratio:.2f} x (its own link time + 10 %), "
                       f"after its first round", ratio <= 1.0))
    closed = all("reason" in r for r in rounds)
    checks.append((f"every round closed ({len(rounds)})", closed and bool(rounds)))
    lines += ["", "Checks:", ""] + [f"- {'met' if ok else 'MISSED'}: {text}" for text, ok in checks]
    (run / "scale_report.md").write_text("\n".join(lines) + "\n")
    (run / "scale_report.json").write_text(json.dumps({"checks": [{"check": t, "met": ok} for t, ok in checks],
                                                        "rounds": rounds, "providers": providers,
                                                        "status_latency_s": lat}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
