#!/usr/bin/env python3
"""Crash loops, as containers with a restart policy run them: a head and K providers on loopback
(CURVE keys), each in a loop that restarts it a second (--restart-delay) after it dies, and SIGKILLs at random instants.

Two scenarios (issue 15):

  kills   --kills N: N SIGKILLs at random instants in the first half of the run (--head-kills
          of them the head's, the rest a random provider's), then the run goes to its end. The
          same run without kills (--kills 0) is the reference: compare the final eval loss.
  ckpt    --head-loop N: only the head is killed, N times, each at a random instant after one
          more checkpoint was written (outer.checkpoint_every); every restart must resume from
          a complete checkpoint and head.jsonl's rounds must never go back past the newest
          checkpoint that was complete when it died.

    python3 experiments/restart_loops.py --out /tmp/rl --kills 8 --head-kills 2 [--set k=v ...]
    python3 experiments/restart_loops.py --out /tmp/rl --head-loop 20

Prints one JSON line (final eval loss, rounds, restarts, the checks' findings) and exits non-zero
when a check fails. Every process it starts is its own process group and is killed at the end,
whatever happens; it never signals anything it did not start.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg):
    print(f"restart_loops: {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jsonl(path):
    out = []
    try:
        for line in Path(path).read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    except FileNotFoundError:
        pass
    return out


class Loop:
    """One process under a restart policy: restarted 1 s after it exits, unless it exited 0 or
    the loop was stopped."""

    def __init__(self, name, argv, logdir, env, delay, wipe=None):
        self.name, self.argv, self.logdir, self.env, self.delay = name, argv, Path(logdir), env, delay
        self.wipe = wipe  # a directory removed before each restart (a lost volume)
        self.proc = None
        self.starts = 0
        self.exit_codes = []
        self.done = threading.Event()
        self.stopped = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def _run(self):
        while not self.stopped:
            with self.lock:
                if self.stopped:
                    break
                logf = open(self.logdir / f"{self.name}.{self.starts}.log", "w")
                self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True)
                self.starts += 1
            rc = self.proc.wait()
            logf.close()
            self.exit_codes.append(rc)
            if rc == 0:
                break
            time.sleep(self.delay)
            if self.wipe is not None:
                shutil.rmtree(self.wipe, ignore_errors=True)
        self.done.set()

    def kill(self, wait=False):
        """SIGKILL the current life's process group; with wait, return once the process is gone."""
        with self.lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return False
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if wait:
            proc.wait()
        return True

    def stop(self):
        self.stopped = True
        self.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xloco", default=os.environ.get("XLOCO_BIN", str(ROOT / "build/src/cli/xloco")))
    ap.add_argument("--config", default=str(ROOT / "configs/kjv-tiny-4p.json"))
    ap.add_argument("--set", action="append", default=[], help="config override k=v (head and providers)")
    ap.add_argument("--out", required=True, help="scratch directory: keys, logs and the run")
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--head-kills", type=int, default=2)
    ap.add_argument("--head-loop", type=int, default=0, help="kill only the head, after each of N checkpoints")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wipe-provider-state", action="store_true",
                    help="remove a provider's saved state before restarting it (a container without "
                         "its volume): the reference for what the saved state is worth")
    ap.add_argument("--restart-delay", type=float, default=1.0, help="seconds before a dead process is restarted")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys, logs = out / "keys", out / "logs"
    (keys / "allow").mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    cfg = json.loads(subprocess.run([args.xloco, "config", "--config", args.config] +
                                    [a for s in args.set for a in ("--set", s)],
                                    check=True, capture_output=True, text=True).stdout)
    K = cfg["outer"]["providers"]
    rounds = -(-cfg["inner"]["steps"] // cfg["outer"]["inner_steps"])
    names = [f"p{i}" for i in range(K)]
    for n in ["head"] + names:
        subprocess.run([args.xloco, "keygen", str(keys / n)], check=True, capture_output=True)
        if n != "head":
            os.replace(keys / f"{n}.pub", keys / "allow" / f"{n}.pub")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    common = ["--config", args.config, "--set", f"run.dir={out}", "--set", "run.name=run"]
    for s in args.set:
        common += ["--set", s]
    run = out / "run"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    head = Loop("head", [args.xloco, "head"] + common +
                ["--bind", endpoint, "--key", str(keys / "head.key"), "--allow", str(keys / "allow"),
                 "--http", "127.0.0.1:0", "--auto-resume"], logs, env, args.restart_delay)
    providers = [Loop(n, [args.xloco, "worker"] + common +
                      ["--head", endpoint, "--head-pub", str(keys / "head.pub"),
                       "--key", str(keys / f"{n}.key"), "--shard", str(i)], logs, env, args.restart_delay,
                      run / "providers" / n / "state" if args.wipe_provider_state else None)
                 for i, n in enumerate(names)]
    loops = [head] + providers
    problems = []
    kills = []  # (time, target, rounds done then)
    ckpt_seen = []  # for --head-loop: (newest complete checkpoint round when killed)
    t0 = time.time()

    def done_rounds():
        return max([r.get("round", 0) for r in jsonl(run / "metrics/head.jsonl")] or [0])

    def latest_ckpt_round():
        try:
            name = (run / "ckpt/latest").read_text().strip()
            return json.loads((run / "ckpt" / name / "state.json").read_text())["round"]
        except (OSError, ValueError, KeyError):
            return 0

    try:
        for loop in loops:
            loop.start()
        if args.kills > 0:
            # Random instants in the first half, by round: wait for a random round in
            # [1, rounds/2), then a random part of a round's time, then kill.
            targets = ["head"] * args.head_kills + [rng.choice(names) for _ in range(args.kills - args.head_kills)]
            rng.shuffle(targets)
            marks = sorted(rng.uniform(1, rounds / 2) for _ in targets)
            for target, mark in zip(targets, marks):
                while done_rounds() < int(mark) and time.time() - t0 < args.timeout:
                    time.sleep(0.1)
                # A random instant within that round: the fraction of a round's mean time so far.
                done = max(1, done_rounds())
                time.sleep((mark - int(mark)) * (time.time() - t0) / done)
                loop = head if target == "head" else providers[names.index(target)]
                while not loop.kill() and time.time() - t0 < args.timeout:
                    time.sleep(0.2)  # it is between restarts: kill its next life
                kills.append({"t": round(time.time() - t0, 1), "target": target, "after_round": done_rounds()})
                log(f"SIGKILL {target} at {kills[-1]['t']} s, {kills[-1]['after_round']} rounds done")
        for n in range(args.head_loop):
            # One more checkpoint since the last kill, then a random instant within a round.
            target = latest_ckpt_round() + cfg["outer"]["checkpoint_every"]
            while latest_ckpt_round() < target and not head.done.is_set() and time.time() - t0 < args.timeout:
                time.sleep(0.05)
            if head.done.is_set():
                problems.append(f"the run ended after {n} of {args.head_loop} head kills")
                break
            # Within a round: up to its median wall time so far (at most 1.5 s). A fixed 1.5 s let
            # a fast build (LibTorch 2.11: ~0.15 s rounds) run out of rounds after 19 of 20 kills.
            walls = sorted(r["round_wall_s"] for r in jsonl(run / "metrics/head.jsonl") if "round_wall_s" in r)
            time.sleep(rng.uniform(0, min(1.5, walls[len(walls) // 2] if walls else 1.5)))
            head.kill(wait=True)
            # Read both once the head is dead (its next life starts `delay` later): the newest
            # checkpoint complete at its death, and the records it wrote. Read before the kill,
            # a round record the dying head wrote in between counted as the next life's.
            complete = latest_ckpt_round()
            before = len(jsonl(run / "metrics/head.jsonl"))
            ckpt_seen.append(complete)
            kills.append({"t": round(time.time() - t0, 1), "target": "head", "ckpt": complete, "lines": before})
            log(f"SIGKILL head #{n + 1}: newest checkpoint then round {complete}")
        if not head.done.wait(max(1.0, args.timeout - (time.time() - t0))):
            problems.append(f"the head did not finish within {args.timeout:.0f} s")
        for p in providers:
            p.done.wait(60)
    finally:
        for loop in loops:
            loop.stop()
        for loop in loops:
            loop.thread.join(30)

    summary = {}
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError) as e:
        problems.append(f"no summary.json: {e}")
    records = jsonl(run / "metrics/head.jsonl")
    seq = [r["round"] for r in records if "round" in r and "final" not in r]
    # Rounds never go back past a checkpoint that was complete when the head died: after each
    # restart the first round logged is at most one past it, never below it + 1.
    for k in kills:
        if k.get("target") == "head" and "ckpt" in k:
            after = [r["round"] for r in records[k["lines"]:] if "round" in r and "final" not in r]
            if after and after[0] < k["ckpt"] + 1:
                problems.append(f"after the kill at {k['t']} s the head went back to round {after[0]}, "
                                f"before checkpoint {k['ckpt']}")
    head_logs = sorted(logs.glob("head.*.log"), key=lambda p: int(p.name.split(".")[1]))
    resumes = []
    for p in head_logs[1:]:
        # A life killed while it was still starting has not decided yet; one that got as far
        # as serving /status must say what it resumed from.
        text = p.read_text(errors="replace")
        line = next((l for l in text.splitlines() if "resumed from" in l or "auto-resume: no checkpoint" in l), "")
        if line:
            resumes.append(line.split(" info ")[-1][:160])
        elif "status: http" in text:
            problems.append(f"{p.name} did not resume from a checkpoint")
    state_resumes = sum(p.read_text(errors="replace").count("resumed its AdamW state")
                        for p in logs.glob("p*.log"))
    discarded = [l.split("] ")[-1][:200] for p in logs.glob("p*.log")
                 for l in p.read_text(errors="replace").splitlines() if "saved state" in l and "discarded" in l]
    result = {
        "final_eval_loss": summary.get("final_eval_loss"),
        "rounds": summary.get("rounds"),
        "expected_rounds": rounds,
        "kills": kills,
        "starts": {l.name: l.starts for l in loops},
        "head_resumes": resumes,
        "provider_state_resumes": state_resumes,
        "provider_state_discarded": discarded,
        "round_sequence": seq,
        "wall_s": round(time.time() - t0, 1),
        "problems": problems,
    }
    if summary.get("rounds") != rounds:
        problems.append(f"the run ended after {summary.get('rounds')} rounds, not {rounds}")
    print(json.dumps(result), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
