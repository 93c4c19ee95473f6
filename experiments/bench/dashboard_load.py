#!/usr/bin/env python3
"""How long the head's dashboard takes to load with 8 providers and 500 rounds of history.

    python3 experiments/bench/dashboard_load.py build/src/cli/xloco [--rounds 500] [--loads 7]

Runs `xloco local` with 8 providers, a minute model (d 32, one layer) and one inner step per
round with an evaluation each round, so that every round is a point of every chart, until the
head has recorded --rounds rounds; then opens the dashboard in headless Chromium (the test's
DevTools client, tests/dashboard/cdp.py) --loads times, each from about:blank, and reads the
page's own figure: performance.now() when the page has drawn everything from its first /status,
/history and /run (navigation start to the last chart drawn). The run goes on meanwhile (the
head, 8 providers and the browser share the machine's cores), and is stopped at the end. Prints
each load, the median and the machine (lscpu's model name)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "dashboard"))
from cdp import Browser, stop_group, wait_for_status_url  # noqa: E402


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except (OSError, StopIteration):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("xloco")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--providers", type=int, default=8)
    ap.add_argument("--loads", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xloco-dashload-") as tmp:
        args = [a.xloco, "local", "--providers", str(a.providers), "--insecure",
                "--config", str(ROOT / "configs/kjv-tiny-4p.json"),
                "--set", f"run.dir={tmp}", "--set", "run.name=load", "--set", "model.d_model=32",
                "--set", "model.n_layer=1", "--set", "model.n_head=2", "--set", "model.seq_len=32",
                "--set", "inner.batch_size=4", "--set", "inner.eval_batches=1",
                "--set", "inner.warmup_steps=10", "--set", "inner.log_every=1000",
                "--set", "outer.inner_steps=1", "--set", f"inner.steps={a.rounds * 4}",
                "--set", "outer.eval_every=1", "--set", "outer.checkpoint_every=100",
                "--set", f"outer.min_providers={a.providers}"]
        log = open(Path(tmp) / "local.log", "wb")
        run = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = wait_for_status_url(Path(tmp) / "load" / "status.url", run)
            t0 = time.time()
            while True:
                n = len(json.load(urllib.request.urlopen(url + "/history", timeout=5))["rounds"])
                if n >= a.rounds:
                    break
                if run.poll() is not None:
                    raise RuntimeError(f"the run ended at {n} rounds")
                time.sleep(1)
            print(f"{n} rounds recorded after {time.time() - t0:.0f} s; {a.providers} providers")
            loads = []
            with Browser(width=1360, height=1100) as b:
                for i in range(a.loads):
                    b.navigate("about:blank")
                    b.wait_for("document.readyState === 'complete' && location.href === 'about:blank'")
                    b.navigate(url + "/")
                    ms = float(b.wait_for("document.body && document.body.dataset.readyMs", timeout=30))
                    shown = b.evaluate("[Number(document.body.dataset.historyRounds), "
                                       "document.querySelectorAll('#loss-chart circle.pt').length, "
                                       "document.querySelectorAll('#providers tbody tr').length]")
                    loads.append(ms)
                    print(f"load {i + 1}: {ms:.0f} ms to the last chart drawn "
                          f"({shown[0]} rounds, {shown[1]} loss points, {shown[2]} provider rows)")
            print(f"median {statistics.median(loads):.0f} ms, max {max(loads):.0f} ms over {len(loads)} "
                  f"loads | {cpu_model()}, {os.cpu_count()} cores")
        finally:
            stop_group(run, 60)
            log.close()


if __name__ == "__main__":
    main()
