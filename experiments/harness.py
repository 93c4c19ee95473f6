#!/usr/bin/env python3
"""The convergence harness: runs a plan of xloco runs (experiments/plans/*.json), then writes one
CSV and one markdown table of all runs and gnuplot plots of them.

    python3 experiments/harness.py --plan experiments/plans/quick.json [--rerun NAME|all]
    python3 experiments/harness.py --plan ... --report-only     # tables and plots from results

A run that already has experiments/results/PLAN/runs/NAME.json is not run again unless --rerun
names it (or `all`). The xloco run directories (logs, checkpoints) stay under runs/PLAN-NAME/.
Each run is compared with its plan's `baseline` run: one cluster doing synchronous data parallel
with K x the per-provider batch, the same total tokens and the same schedule shape.

Plan entries (see experiments/plans/quick.json):
  name      unique name of the run
  kind      "train" (xloco train), "local" (xloco local on loopback) or "netns" (deploy/rehearse.sh:
            the head and each provider in its own network namespace with a rate-limited link)
  config    JSON config file; set: {key: value} overrides
  baseline  the run it is compared against (ratio of final eval loss)
  group     runs plotted together (e.g. "kjv", "fmnist")
  init      {"run": NAME, "step": S}: warm start the head from that train run's step-S checkpoint
  kill      {"provider": "provider-1", "after_round": N}: kill -9 that provider after round N
  rate      link rate for kind netns, e.g. "100mbit"
  cpus      kind netns: cap each provider at this many CPUs, each in a cgroup of its own
            (rehearse.sh --cpus), so that providers sharing the cores run at steady, equal
            speeds as on machines of their own (a test device, like XLOCO_THROTTLE)
  env       {NAME: value}: environment of the run's processes (kind local), e.g. the test device
            {"XLOCO_THROTTLE": "provider-3=4"} that makes provider-3 4x slower
  score     image models: {"classifier": RUN, "images": N, "grid": G, "eval_batch_size": B,
            "eval_batches": M}: after the run, `xloco eval` with that batch size and count (every
            run scored on the same images and noise) and `xloco sample` of N images scored by
            RUN's Fashion-MNIST classifier, with a PNG grid of the first G

Plan-level "prepare": [{"run": [argv...], "creates": PATH}] runs each command in the work folder
before the runs when PATH (relative to it) is missing; "{python}" in argv is this interpreter,
"{xloco}" the binary, "{root}" the repository (e.g. scripting a TorchScript model with examples/ddpm.py).
"""
import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg):
    print(f"harness: {msg}", flush=True)


def resolved_config(xloco, path, overrides):
    """The config a run with these overrides uses, every default filled in, from xloco itself
    (`xloco config`): the same document the head and `xloco train` write to runs/NAME/config.json."""
    out = subprocess.run([xloco, "config", "--config", str(ROOT / path)] + set_args(overrides),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"xloco config {path}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def run_config(run_dir):
    """The config a finished run used, as its head (or `xloco train`) wrote it."""
    return json.loads((run_dir / "config.json").read_text())


def get(cfg, key):
    node = cfg
    for p in key.split("."):
        node = node[p]
    return node


def set_args(overrides):
    args = []
    for k, v in overrides.items():
        args += ["--set", f"{k}={json.dumps(v) if isinstance(v, bool) else v}"]
    return args


def read_jsonl(path):
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a crash
    return rows


def provider_pids(run_name, provider, session):
    """Processes of one provider of one run (the worker and its rank children), among those of
    `session`: the harness signals only processes it started itself."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getsid(int(d.name)) != session:
                continue
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "worker" in args and provider in args and f"run.name={run_name}" in args:
            pids.append(int(d.name))
    return pids


class Runner:
    def __init__(self, plan, xloco, out, work):
        self.work = work
        self.plan = plan
        self.xloco = xloco
        self.out = out
        (out / "runs").mkdir(parents=True, exist_ok=True)

    def run_name(self, entry):
        return f"{self.plan['name']}-{entry['name']}"

    def entry(self, name):
        for e in self.plan["runs"]:
            if e["name"] == name:
                return e
        raise SystemExit(f"harness: the plan has no run named '{name}'")

    def command(self, e, cfg_overrides):
        name = self.run_name(e)
        kind = e["kind"]
        if kind == "train":
            return [self.xloco, "train", "--config", str(ROOT / e["config"]), "--nproc",
                    str(e.get("nproc", 1))] + set_args(cfg_overrides)
        if kind == "local":
            cmd = [self.xloco, "local", "--config", str(ROOT / e["config"])] + set_args(cfg_overrides)
            if "init" in e:
                src = self.run_name(self.entry(e["init"]["run"]))
                ckpt = self.kept_checkpoint(src, e["init"]["step"])
                if not ckpt.is_dir():
                    raise RuntimeError(f"warm start needs {ckpt}: run '{e['init']['run']}' first "
                                       f"(with inner.checkpoint_every dividing {e['init']['step']})")
                cmd += ["--init", str(ckpt)]
            return cmd
        if kind == "netns":
            cmd = ["bash", str(ROOT / "deploy/rehearse.sh"), "--xloco", self.xloco, "--config",
                   str(ROOT / e["config"]), "--name", name, "--rate", e["rate"], "--providers",
                   str(get(resolved_config(self.xloco, e["config"], e.get("set", {})), "outer.providers"))]
            if "cpus" in e:
                cmd += ["--cpus", str(e["cpus"])]
            for k, v in cfg_overrides.items():
                if k not in ("run.name", "outer.providers"):
                    cmd += ["--set", f"{k}={v}"]
            return cmd
        raise RuntimeError(f"run {e['name']}: unknown kind '{kind}' (train, local or netns)")

    def execute(self, e):
        name = self.run_name(e)
        overrides = dict(e.get("set", {}))
        overrides["run.name"] = name
        run_dir = self.work / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = self.command(e, overrides)
        logfile = self.work / "runs" / f"{name}.log"
        logfile.parent.mkdir(exist_ok=True)
        log(f"run {e['name']}: {' '.join(cmd[1:] if cmd[0] == 'bash' else cmd)}")
        log(f"run {e['name']}: log in {logfile}")
        t0 = time.time()
        with open(logfile, "w") as lf:
            # Its own session: the kill watcher signals only processes of this run.
            proc = subprocess.Popen(cmd, cwd=self.work, stdout=lf, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **e.get("env", {})})
            watchers = []
            if "kill" in e:
                watchers.append(threading.Thread(target=self.kill_later, args=(e, proc), daemon=True))
            if any(x.get("init", {}).get("run") == e["name"] for x in self.plan["runs"]):
                watchers.append(threading.Thread(target=self.keep_checkpoints, args=(e, proc), daemon=True))
            for w in watchers:
                w.start()
            rc = proc.wait()
            for w in watchers:
                w.join(timeout=60)
        wall = time.time() - t0
        if rc == 77 and e["kind"] == "netns":
            reason = [l for l in logfile.read_text().splitlines() if "SKIPPED" in l]
            return {"skipped": reason[-1] if reason else "skipped by rehearse.sh"}
        if rc != 0:
            tail = "\n".join(logfile.read_text().splitlines()[-15:])
            raise RuntimeError(f"run {e['name']} exited with {rc}; last lines of {logfile}:\n{tail}")
        return {"wall_s": wall}

    def prepare(self):
        for p in self.plan.get("prepare", []):
            if (self.work / p["creates"]).exists():
                continue
            argv = [a.replace("{xloco}", self.xloco).replace("{python}", sys.executable)
                    .replace("{root}", str(ROOT)) for a in p["run"]]
            log(f"prepare: {' '.join(argv)}")
            (self.work / p["creates"]).parent.mkdir(parents=True, exist_ok=True)
            res = subprocess.run(argv, cwd=self.work, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"prepare {' '.join(argv)} failed:\n{res.stdout}{res.stderr}")

    def latest_checkpoint(self, e):
        ckpts = sorted(p for p in (self.work / "runs" / self.run_name(e) / "ckpt").glob("*-*")
                       if (p / "state.json").exists())
        if not ckpts:
            raise RuntimeError(f"run {e['name']}: no checkpoint to score")
        return ckpts[-1]

    def score(self, e):
        """Held-out loss on a common eval set and a classifier score of samples (image runs)."""
        sc = e["score"]
        ckpt = self.latest_checkpoint(e)
        classifier = self.latest_checkpoint(self.entry(sc["classifier"]))
        res = subprocess.run([self.xloco, "eval", "--checkpoint", str(ckpt), "--batch-size",
                              str(sc["eval_batch_size"]), "--batches", str(sc["eval_batches"])],
                             capture_output=True, text=True)
        if res.returncode != 0 or "eval loss " not in res.stdout:
            raise RuntimeError(f"xloco eval {ckpt} failed: {res.stdout}{res.stderr}")
        held_out = float(res.stdout.split("eval loss ")[1].split()[0])
        grid = self.out / f"samples-{e['name']}.png"
        score_file = self.out / "runs" / f"{e['name']}.score.json"
        t0 = time.time()
        res = subprocess.run([self.xloco, "sample", "--checkpoint", str(ckpt), "--images",
                              str(sc["images"]), "--grid-images", str(sc.get("grid", 64)),
                              "--out", str(grid), "--classifier", str(classifier),
                              "--score-out", str(score_file)], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"xloco sample {ckpt} failed: {res.stdout}{res.stderr}")
        out = json.loads(score_file.read_text())
        out.update({"held_out_loss": held_out, "grid": grid.name, "sample_s": time.time() - t0,
                    "eval_images": sc["eval_batch_size"] * sc["eval_batches"]})
        log(f"run {e['name']}: held-out loss {held_out:.4f}, inception score "
            f"{out['inception_score']:.3f}, classes {out['class_histogram']}")
        return out

    def kept_checkpoint(self, run_name, step):
        return self.work / "runs" / run_name / "warm-start" / f"step-{step:07d}"

    def keep_checkpoints(self, e, proc):
        """Copies the checkpoints that warm starts need as soon as they are written (xloco
        train keeps only its newest three)."""
        name = self.run_name(e)
        steps = {x["init"]["step"] for x in self.plan["runs"]
                 if x.get("init", {}).get("run") == e["name"]}
        while steps:
            for step in sorted(steps):
                src = self.work / "runs" / name / "ckpt" / f"step-{step:07d}"
                if (src / "state.json").exists():
                    dst = self.kept_checkpoint(name, step)
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(src, dst)
                    log(f"run {e['name']}: kept checkpoint step {step} for warm starts")
                    steps.discard(step)
            if proc.poll() is not None:
                return
            time.sleep(0.5)

    def kill_later(self, e, proc):
        k = e["kill"]
        head = self.work / "runs" / self.run_name(e) / "metrics" / "head.jsonl"
        while proc.poll() is None:
            if len(read_jsonl(head)) >= k["after_round"]:
                pids = provider_pids(self.run_name(e), k["provider"], proc.pid)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                log(f"run {e['name']}: killed {k['provider']} (pids {pids}) after round "
                    f"{k['after_round']}")
                return
            time.sleep(0.5)


def collect(runner, e, extra):
    """Reads a finished run's metrics into one result record with its eval curve."""
    name = runner.run_name(e)
    run_dir = runner.work / "runs" / name
    cfg = run_config(run_dir)
    batch = get(cfg, "inner.batch_size")
    seq = get(cfg, "model.seq_len") if get(cfg, "model.kind") == "gpt" else 1
    steps = get(cfg, "inner.steps")
    r = {"name": e["name"], "kind": e["kind"], "group": e.get("group", ""),
         "baseline": e.get("baseline", ""), "label": e.get("label", e["name"]),
         "wall_s": extra.get("wall_s"), "curve": []}
    offset_tokens = 0
    if "init" in e:
        src = runner.entry(e["init"]["run"])
        scfg = run_config(runner.work / "runs" / runner.run_name(src))
        offset_tokens = e["init"]["step"] * get(scfg, "inner.batch_size") * seq
        r["warm_start_step"] = e["init"]["step"]
    if e["kind"] == "train":
        rows = read_jsonl(run_dir / "metrics" / "provider-0.jsonl")
        evals = [x for x in rows if "eval_loss" in x]
        if not evals:
            raise RuntimeError(f"{name}: no eval records in metrics/provider-0.jsonl")
        for x in evals:
            r["curve"].append({"step": x["step"], "tokens": x["step"] * batch * seq,
                               "eval_loss": x["eval_loss"], "eval_accuracy": x.get("eval_accuracy"),
                               "bytes": None})
        last = evals[-1]
        r.update({"providers": 1, "H": 1, "codec": "fp32 allreduce", "steps": steps,
                  "K_ref": e.get("dp_providers", 4), "sharding": get(cfg, "data.sharding"),
                  "tokens": steps * batch * seq, "final_eval_loss": last["eval_loss"],
                  "final_accuracy": last.get("eval_accuracy"), "bytes": None,
                  "bytes_vs_dp": 1.0, "utilization": None})
        return r
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = read_jsonl(run_dir / "metrics" / "head.jsonl")
    H = get(cfg, "outer.inner_steps")
    tokens = offset_tokens
    for x in rounds:
        in_round = min(H, steps - (x["round"] - 1) * H)
        # The head records each round's tokens (time-budgeted rounds vary them); older runs
        # did not, and every contribution then was H steps.
        tokens += x["tokens"] if x.get("tokens") else x["participants"] * in_round * batch * seq
        if "eval_loss" in x:
            r["curve"].append({"tokens": tokens, "eval_loss": x["eval_loss"],
                               "eval_accuracy": x.get("eval_accuracy"),
                               "bytes": x["bytes_up"] + x["bytes_down"]})
    steady = rounds[1:] if len(rounds) > 1 else rounds
    comp = sum(x["compute_s"] for x in steady)
    wall = sum(x["round_wall_s"] for x in steady)
    acc = [x["eval_accuracy"] for x in rounds if "eval_accuracy" in x]
    r.update({"providers": get(cfg, "outer.providers"), "H": H,
              # outer.downlink "relay" was outer.codec_down "relay" before issue 54
              "codec": f"{get(cfg, 'outer.codec_up')}/" + (
                  "relay" if cfg["outer"].get("downlink") == "relay" else get(cfg, "outer.codec_down")),
              "sharding": get(cfg, "data.sharding") + (
                  f"({get(cfg, 'data.dirichlet_alpha')})" if get(cfg, "data.sharding") == "dirichlet" else ""),
              "tokens": tokens, "final_eval_loss": summary["final_eval_loss"],
              "final_accuracy": acc[-1] if acc else None,
              "bytes": summary["bytes_up"] + summary["bytes_down"],
              "bytes_vs_dp": (summary["bytes_up"] + summary["bytes_down"]) / summary["fp32_dp_bytes"],
              "param_bytes": summary["param_bytes"], "rounds": summary["rounds"],
              "utilization": comp / wall if wall > 0 else None,
              "min_participants": min(x["participants"] for x in rounds)})
    r.update(provider_busy(run_dir))
    if e["kind"] == "netns":
        r["rate"] = e["rate"]
        if "cpus" in e:
            r["cpus"] = e["cpus"]
        reh = json.loads((run_dir / "rehearsal.json").read_text())
        r["addresses"] = sorted(p.get("address", "") for p in (reh.get("status") or {}).get("providers", []))
    return r


def provider_busy(run_dir):
    """Each provider's busy share from its own metrics, rounds 2 on: inner compute over compute
    plus the time it did not compute before each round (sending, waiting for the round to close
    and for the update, receiving it), and the steps it ran per round."""
    busy, steps = {}, {}
    for f in sorted(run_dir.glob("providers/*/metrics/provider-*.jsonl")):
        rows = [x for x in read_jsonl(f) if "round_done" in x]
        steady = [x for x in rows if x["round_done"] > 1]
        comp = sum(x["compute_s"] for x in steady)
        idle = sum(x["idle_s"] for x in steady)
        name = f.stem[len("provider-"):]
        if comp + idle > 0:
            busy[name] = comp / (comp + idle)
        if rows and "steps" in rows[0]:
            steps[name] = sum(x["steps"] for x in rows) / len(rows)
    if not busy:
        return {}
    return {"provider_busy": busy, "provider_busy_min": min(busy.values()),
            "provider_steps_per_round": steps}


def fmt_bytes(b):
    if b is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(b) < 1000 or unit == "TB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{b:.0f} B"
        b /= 1000


def report(runner, results):
    out = runner.out
    by_name = {r["name"]: r for r in results}
    # The baseline's bytes: what fp32 data parallel over K providers sends for its steps (the
    # parameter count comes from the group's DiLoCo runs).
    param_bytes = {r["group"]: r["param_bytes"] for r in results if r.get("param_bytes")}
    for r in results:
        if r["kind"] == "train" and r["group"] in param_bytes:
            per_step = 2.0 * param_bytes[r["group"]] * r["K_ref"]
            r["bytes"] = per_step * r["steps"]
            for p in r["curve"]:
                p["bytes"] = per_step * p["step"]
    for r in results:
        base = by_name.get(r.get("baseline"))
        r["loss_ratio"] = (r["final_eval_loss"] / base["final_eval_loss"]
                           if base and r.get("final_eval_loss") else None)
        r["acc_gap"] = (r["final_accuracy"] - base["final_accuracy"]
                        if base and r.get("final_accuracy") is not None
                        and base.get("final_accuracy") is not None else None)
    cols = ["name", "kind", "providers", "H", "codec", "sharding", "tokens", "final_eval_loss",
            "loss_ratio", "final_accuracy", "bytes", "bytes_vs_dp", "wall_s", "utilization",
            "provider_busy_min"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in results:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])

    def cell(r, c):
        v = r.get(c)
        if v is None:
            return "-"
        if c == "final_eval_loss":
            return f"{v:.4f}"
        if c == "loss_ratio":
            return f"{v:.3f}"
        if c == "final_accuracy":
            return f"{100 * v:.2f} %"
        if c == "bytes":
            return fmt_bytes(v)
        if c == "bytes_vs_dp":
            return "1 (reference)" if v == 1.0 else f"{v:.5f} ({1 / v:.0f}x fewer)"
        if c == "wall_s":
            return f"{v / 60:.1f} min"
        if c in ("utilization", "provider_busy_min"):
            return f"{100 * v:.2f} %"
        if c == "tokens":
            return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"
        return str(v)

    heads = ["run", "kind", "K", "H", "codec up/down", "sharding", "tokens", "final eval loss",
             "ratio to baseline", "accuracy", "bytes sent", "vs data parallel", "wall", "utilization",
             "least busy provider"]
    lines = [f"# Plan `{runner.plan['name']}` — {len(results)} runs", "",
             runner.plan.get("description", ""), "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in results:
        if r.get("skipped"):
            lines.append(f"| {r['name']} | {r['kind']} | skipped: {r['skipped']} |" + " |" * (len(heads) - 3))
            continue
        lines.append("| " + " | ".join(cell(r, c) for c in cols) + " |")
    lines += ["", "Baselines: " + ", ".join(sorted({r['baseline'] for r in results if r.get('baseline')})),
              "Utilization: inner compute / round wall time over rounds 2.. (the slowest provider's "
              "compute each round). Least busy provider: its inner compute / (compute + the time it "
              "did not compute before each round), rounds 2.., from its own metrics. Bytes: up + down, all providers; data parallel = fp32 gradients "
              "both ways every step over the same K providers.", ""]
    scored = [r for r in results if r.get("score")]
    if scored:
        lines += ["## Image samples", "",
                  "Held-out loss: `xloco eval` of each final checkpoint on the same test images "
                  "with the same noise. Score: samples drawn with `xloco sample`, classified by "
                  "the plan's own Fashion-MNIST cnn; Inception-score analogue "
                  "exp(E KL(p(y|x) || p(y))) (10 at best) and the class histogram.", "",
                  "| run | held-out loss | images scored | inception score | mean max prob | "
                  "class histogram | grid |", "|---|---|---|---|---|---|---|"]
        for r in scored:
            s = r["score"]
            lines.append(f"| {r['name']} | {s['held_out_loss']:.4f} ({s['eval_images']} images) | "
                         f"{s['samples']} | {s['inception_score']:.3f} | {s['mean_max_prob']:.3f} | "
                         f"{' '.join(map(str, s['class_histogram']))} | ![{r['name']}]({s['grid']}) |")
        lines.append("")
    (out / "results.md").write_text("\n".join(lines))
    plots(runner, results)
    log(f"wrote {out / 'results.md'}, results.csv and plots")


def gp_quote(text):
    """A gnuplot single-quoted string: inside one, a quote is written twice."""
    return "'" + str(text).replace("'", "''") + "'"


def plots(runner, results):
    out = runner.out
    if subprocess.run(["sh", "-c", "command -v gnuplot"], capture_output=True).returncode != 0:
        log("gnuplot is not installed (Debian package gnuplot-nox): no plots")
        return
    dat = out / "plot-data"
    dat.mkdir(exist_ok=True)
    groups = {}
    for r in results:
        if r.get("skipped") or not r.get("curve"):
            continue
        groups.setdefault(r["group"], []).append(r)
        with open(dat / f"{r['name']}.dat", "w") as f:
            f.write("# tokens eval_loss bytes eval_accuracy\n")
            for p in r["curve"]:
                acc = p.get("eval_accuracy")
                f.write(f"{p['tokens']} {p['eval_loss']} {p['bytes'] or 'NaN'} {acc if acc is not None else 'NaN'}\n")
    script = ["set terminal pngcairo noenhanced size 900,600 font 'sans,10'", "set grid", "set key top right"]
    for group, rs in groups.items():
        plot_runs = [r for r in rs if r["kind"] != "netns"]
        if not plot_runs:
            continue
        curves = ", ".join(
            f"'plot-data/{r['name']}.dat' using ($1/1e6):2 with linespoints title {gp_quote(r['label'])}"
            + (" lw 3 lc rgb 'black'" if r["kind"] == "train" else "") for r in plot_runs)
        script += [f"set output 'loss-vs-tokens-{group}.png'",
                   "set title " + gp_quote(f"Eval loss vs tokens ({group}, plan {runner.plan['name']})"),
                   "set xlabel 'tokens (millions)'" if not group.startswith("fmnist") else "set xlabel 'images (millions)'",
                   "set ylabel 'eval loss'", "unset logscale x", f"plot {curves}"]
        curves = ", ".join(
            f"'plot-data/{r['name']}.dat' using 3:2 with linespoints title {gp_quote(r['label'])}"
            + (" lw 3 lc rgb 'black'" if r["kind"] == "train" else "")
            for r in plot_runs if r["curve"][-1].get("bytes"))
        if not curves:
            continue
        script += [f"set output 'loss-vs-bytes-{group}.png'",
                   "set title " + gp_quote(f"Eval loss vs bytes communicated ({group})"),
                   "set xlabel 'bytes sent, up + down, all providers (log)'", "set logscale x",
                   f"plot {curves}", "unset logscale x"]
    wan = sorted((r for r in results if r["kind"] == "netns" and not r.get("skipped")),
                 key=lambda r: rate_mbit(r["rate"]))
    if wan:
        # One line per setting: runs whose labels differ only in the link rate and in what
        # they say in parentheses. The least busy provider's share where the run measured it
        # (the head's utilization exceeds 100 % when rounds overlap), else the head's.
        series = {}
        for r in wan:
            key = re.sub(r"\s*\([^)]*\)", "", re.sub(r"\d+(\.\d+)?[kmg]bit links,\s*", "", r["label"]))
            series.setdefault(key, []).append(r)
        curves = []
        for i, (key, runs) in enumerate(series.items()):
            with open(dat / f"utilization-{i}.dat", "w") as f:
                f.write("# mbit busy_percent\n")
                for r in runs:
                    busy = r.get("provider_busy_min") or r["utilization"]
                    f.write(f"{rate_mbit(r['rate'])} {100 * busy}\n")
            curves.append(f"'plot-data/utilization-{i}.dat' using 1:2 with linespoints lw 2 pt 7 title {gp_quote(key)}")
        script += ["set output 'utilization-vs-bandwidth.png'",
                   "set title 'Least busy provider vs link bandwidth'",
                   "set xlabel 'per-provider link rate, Mbit/s (log)'", "set logscale x",
                   "set ylabel 'inner compute / (compute + waiting) (%)'", "set yrange [*:100.5]",
                   "set key bottom right",
                   f"plot {', '.join(curves)}, 97 dt 2 lc rgb 'red' title '97 %'"]
    gp = out / "plots.gp"
    gp.write_text("\n".join(script) + "\n")
    res = subprocess.run(["gnuplot", gp.name], cwd=out, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"gnuplot failed: {res.stderr}")


def rate_mbit(rate):
    r = rate.lower()
    for unit, f in (("gbit", 1000.0), ("mbit", 1.0), ("kbit", 0.001)):
        if r.endswith(unit):
            return float(r[: -len(unit)]) * f
    raise ValueError(f"rate '{rate}' must end in kbit, mbit or gbit")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True, help="experiments/plans/NAME.json")
    ap.add_argument("--xloco", default=str(ROOT / "build/src/cli/xloco"))
    ap.add_argument("--out", help="results folder (default experiments/results/PLAN)")
    ap.add_argument("--work", default=str(ROOT), help="runs go to WORK/runs/PLAN-NAME (default: the repository)")
    ap.add_argument("--rerun", action="append", default=[], help="run NAME again (or 'all')")
    ap.add_argument("--only", action="append", default=[], help="run only these (and report all)")
    ap.add_argument("--report-only", action="store_true", help="no runs: tables and plots only")
    a = ap.parse_args()
    try:
        plan = json.loads(Path(a.plan).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"harness: cannot read plan {a.plan}: {err}")
    names = [e["name"] for e in plan["runs"]]
    if len(set(names)) != len(names):
        raise SystemExit("harness: run names in the plan must be unique")
    for n in a.rerun + a.only:
        if n != "all" and n not in names:
            raise SystemExit(f"harness: the plan has no run named '{n}'")
    out = Path(a.out) if a.out else ROOT / "experiments" / "results" / plan["name"]
    runner = Runner(plan, os.path.abspath(a.xloco), out, Path(a.work).resolve())
    if not a.report_only and not os.access(a.xloco, os.X_OK):
        raise SystemExit(f"harness: no xloco binary at {a.xloco} (make build, or pass --xloco)")
    t0 = time.time()
    if not a.report_only:
        runner.prepare()
    results = []
    for e in plan["runs"]:
        rfile = out / "runs" / f"{e['name']}.json"
        want = not a.only or e["name"] in a.only
        fresh = "all" in a.rerun or e["name"] in a.rerun
        if want and not a.report_only and (fresh or not rfile.exists()):
            extra = runner.execute(e)
            if "skipped" in extra:
                log(f"run {e['name']}: {extra['skipped']}")
                rec = {"name": e["name"], "kind": e["kind"], "group": e.get("group", ""),
                       "skipped": extra["skipped"]}
            else:
                rec = collect(runner, e, extra)
                if "score" in e:
                    rec["score"] = runner.score(e)
                log(f"run {e['name']}: final eval loss {rec['final_eval_loss']:.4f} in "
                    f"{rec['wall_s'] / 60:.1f} min")
            tmp = rfile.with_suffix(".tmp")
            tmp.write_text(json.dumps(rec, indent=1))
            tmp.replace(rfile)
        if rfile.exists():
            results.append(json.loads(rfile.read_text()))
        else:
            log(f"run {e['name']}: no result yet (not run)")
    report(runner, results)
    log(f"done in {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as err:
        print(f"harness: error: {err}", file=sys.stderr)
        sys.exit(1)
