#!/usr/bin/env python3
"""ctest cli.newcomer: what a new user meets first, through the xloco binary (issue 53).

- The head's "join with" line, pasted into bash as printed (the head's Z85 key holds & < > $ !),
  joins the run: it repeats the head's --set overrides that the config hash covers and names the
  head's own (run.*), so the provider is not refused on the hash; the run finishes.
- A provider whose run.name is not the head's exits naming it (it retried forever before).
- `xloco status --run DIR` on the finished run prints its summary (and --json summary.json)
  instead of failing to connect.
- `xloco local --init FILE.safetensors` takes a file; `xloco local --http-token` reaches the head
  (a token too short is refused by the head itself).
- outer.inner_steps larger than inner.steps is refused for a DiLoCo run, naming both keys.
Needs bible-kjv (the tiny GPT's text); exits 77 (skipped) without it."""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "tests"))
from cli_checks import SRC, XLOCO, check, failures, xloco  # noqa: E402

if not Path("/usr/bin/bible").exists():
    print("skipped: /usr/bin/bible (bible-kjv) missing")
    sys.exit(77)

CONFIG = SRC / "configs/kjv-tiny-4p.json"
SMALL = ["model.d_model=32", "model.n_layer=1", "model.n_head=2", "model.seq_len=32",
         "inner.batch_size=4", "inner.warmup_steps=1", "inner.eval_batches=2", "inner.log_every=2",
         "inner.steps=4", "outer.inner_steps=2", "outer.providers=1", "outer.min_providers=1",
         "run.threads=1"]


def sets(items):
    return [a for s in items for a in ("--set", s)]


def join_run(tmp):
    """A head with keys and overrides; its join line run through bash as printed."""
    rc, out = xloco("keygen", tmp / "keys/head")
    rc2, _ = xloco("keygen", tmp / "keys/allow/p0")
    rc3, _ = xloco("keygen", tmp / "keys/allow/p1")
    check(rc == 0 and rc2 == 0 and rc3 == 0, "keygen head and providers")
    head_pub = (tmp / "keys/head.pub").read_text().strip()
    run_dir = tmp / "runs/join"
    log = open(tmp / "head.log", "w+")
    head = subprocess.Popen(
        [XLOCO, "head", "--config", str(CONFIG), *sets(SMALL), "--set", "outer.lr=0.5",
         "--set", f"run.dir={tmp}/runs", "--set", "run.name=join", "--bind", "tcp://127.0.0.1:0",
         "--http", "127.0.0.1:0", "--key", str(tmp / "keys/head.key"), "--allow", str(tmp / "keys/allow")],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp)
    try:
        join, own = None, None
        deadline = time.time() + 60
        while time.time() < deadline and join is None and head.poll() is None:
            time.sleep(0.2)
            lines = (tmp / "head.log").read_text().splitlines()
            for i, line in enumerate(lines):
                if line.startswith("join with:") and i + 1 < len(lines):
                    join = lines[i + 1].strip()
                    if i + 2 < len(lines) and "not repeated:" in lines[i + 2]:
                        own = lines[i + 2].strip()
        check(join is not None, "the head prints a join line" + ("" if join else ":\n" + (tmp / "head.log").read_text()[-1500:]))
        if join is None:
            return
        words = shlex.split(join)
        check(words[words.index("--head-pub") + 1] == head_pub, "the join line's key, parsed as a shell word, is the head's key")
        check(any(c in head_pub for c in "&<>$!^*?()[]{}#%@") == ("'" in join),
              f"it is quoted exactly when it must be: {join[:120]}")
        agreed = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        check("outer.lr=0.5" in agreed and "model.d_model=32" in agreed and "run.name=join" in agreed
              and not any(a.startswith(("run.dir", "run.threads")) for a in agreed),
              f"the join line repeats the hashed overrides and run.name, not the head's own ({agreed})")
        check(own is not None and "run.threads=1" in own and "run.dir=" in own,
              f"and names the head's own settings: {own}")
        # The line without run.name (a provider that kept the config file's): the head answers
        # for another run; the provider says so and exits instead of retrying forever.
        wrong = join.replace("xloco worker", shlex.quote(XLOCO) + " worker", 1)
        wrong = wrong.replace(" --set run.name=join", "").replace("PROVIDER.key", shlex.quote(str(tmp / "keys/allow/p1.key")))
        res = subprocess.run(["bash", "-c", "exec " + wrong + " --set " + shlex.quote(f"run.dir={tmp}/wrong")],
                             capture_output=True, text=True, cwd=tmp, timeout=120)
        check(res.returncode == 2 and "belongs to another run" in res.stdout + res.stderr
              and "run.name" in res.stdout + res.stderr,
              f"a provider of another run.name exits naming it (rc {res.returncode})" +
              ("" if res.returncode == 2 else ":\n" + (res.stdout + res.stderr)[-800:]))
        cmd = join.replace("xloco worker", shlex.quote(XLOCO) + " worker", 1)
        cmd = cmd.replace("PROVIDER.key", shlex.quote(str(tmp / "keys/allow/p0.key")))
        cmd += " --set " + shlex.quote(f"run.dir={tmp}/worker")
        worker = subprocess.run(["bash", "-c", "exec " + cmd], capture_output=True, text=True, cwd=tmp, timeout=300)
        check(worker.returncode == 0, "the join line, pasted into bash, joins and trains" +
              ("" if worker.returncode == 0 else ":\n" + (worker.stdout + worker.stderr)[-1500:]))
        head.wait(timeout=120)
        check(head.returncode == 0, "the head finishes the run" +
              ("" if head.returncode == 0 else ":\n" + (tmp / "head.log").read_text()[-1500:]))
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()
    if not (run_dir / "summary.json").exists():
        check(False, "the run wrote summary.json")
        return
    rc, out = xloco("status", "--run", run_dir)
    check(rc == 0 and "the run has ended" in out and "final eval loss" in out,
          "xloco status --run on a finished run prints its summary" + ("" if rc == 0 else f":\n{out[-600:]}"))
    rc, out = xloco("status", "--run", run_dir, "--json")
    check(rc == 0 and json.loads(out)["rounds"] == 2, "and --json prints summary.json")
    return sorted((run_dir / "ckpt").glob("round-*"))


def main():
    with tempfile.TemporaryDirectory(prefix="xloco-newcomer-") as tmp:
        tmp = Path(tmp)
        ckpts = join_run(tmp)
        common = [*sets(SMALL), "--set", f"run.dir={tmp}/runs"]
        if ckpts:
            init = ckpts[-1] / "model.safetensors"
            rc, out = xloco("local", "--config", CONFIG, *common, "--set", "run.name=init", "--init", init)
            check(rc == 0 and "final eval loss" in out,
                  "xloco local --init FILE.safetensors" + ("" if rc == 0 else f":\n{out[-1200:]}"))
        rc, out = xloco("local", "--config", CONFIG, *common, "--set", "run.name=tok", "--http-token", "short")
        check(rc != 0 and "too short to guess-proof" in out, "xloco local --http-token reaches the head")
        rc, out = xloco("local", "--config", CONFIG, *common, "--set", "run.name=tok",
                        "--http-token", "0123456789abcdef0123")
        check(rc == 0, "and a good token runs" + ("" if rc == 0 else f":\n{out[-800:]}"))
        rc, out = xloco("local", "--config", CONFIG, *common, "--set", "outer.inner_steps=1000")
        check(rc == 2 and "outer.inner_steps = 1000 exceeds inner.steps = 4" in out,
              "H larger than the run is refused" + ("" if rc == 2 else f" (rc {rc}):\n{out[-600:]}"))
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
