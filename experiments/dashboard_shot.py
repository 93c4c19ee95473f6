#!/usr/bin/env python3
"""The README's screenshot of the dashboard during the demo.

    python3 experiments/dashboard_shot.py build/src/cli/xloco OUT.png [--baseline FILE] [--rounds 5]

Runs the demo's job (`xloco local --config configs/kjv-tiny-4p.json`, 4 providers, CURVE keys)
as runs/kjv-tiny-4p-dashboard, with --baseline when given (the metrics JSONL of the
single-cluster run: the harness's data-parallel baseline, or `make demo-train`'s), opens the
dashboard in headless Chromium (tests/dashboard/cdp.py) once the head has recorded --rounds
rounds, saves the screenshot, and stops the run (its own process group only)."""
import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "dashboard"))
from cdp import Browser, stop_group, wait_for_status_url  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("xloco")
ap.add_argument("out")
ap.add_argument("--baseline")
ap.add_argument("--rounds", type=int, default=5)
a = ap.parse_args()
name = "kjv-tiny-4p-dashboard"
args = [a.xloco, "local", "--config", str(ROOT / "configs/kjv-tiny-4p.json"), "--set", f"run.name={name}"]
if a.baseline:
    args += ["--baseline", a.baseline]
url_file = ROOT / "runs" / name / "status.url"
if url_file.exists():
    url_file.unlink()
log = open(ROOT / "runs" / f"{name}.log", "wb")
run = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
try:
    url = wait_for_status_url(url_file, run)
    while len(json.load(urllib.request.urlopen(url + "/history", timeout=5))["rounds"]) < a.rounds:
        if run.poll() is not None:
            sys.exit("the run ended early")
        time.sleep(1)
    with Browser(width=1360, height=1150) as b:
        b.navigate(url + "/")
        b.wait_for("Number(document.body.dataset.polls || 0) >= 2", timeout=30)
        b.screenshot(a.out)
    print(f"screenshot of {url}/ at round {a.rounds}: {a.out}")
finally:
    stop_group(run, 60)
    log.close()
