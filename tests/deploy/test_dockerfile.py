#!/usr/bin/env python3
"""The container images, the README and the Akash SDL files cannot drift from what `make demo`
and `make test` do: both Dockerfiles run deploy/setup.sh and the same `make build`, the Makefile
routes demo and test through that same build and set-up, every XLOCO_* variable the SDL files
set is one the xloco binary reads, and the config the SDL files point at ships in the image.
Run by ctest (deploy.dockerfile); XLOCO_SOURCE_DIR and XLOCO_BIN come from the environment."""
import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[2]))
XLOCO = os.environ.get("XLOCO_BIN", str(SRC / "build/src/cli/xloco"))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def instructions(dockerfile):
    """(INSTRUCTION, argument) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (SRC / dockerfile).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def make_rules():
    rules = {}
    for m in re.finditer(r"^([a-z-]+):([^\n=]*)\n((?:\t[^\n]*\n)*)", (SRC / "Makefile").read_text(), re.M):
        rules[m.group(1)] = (m.group(2).split(), m.group(3))
    return rules


# The Makefile: demo and test build through `build`, which configures after `setup`, which is
# deploy/setup.sh; configure passes CMAKE_FLAGS (the CUDA image's CMAKE_PREFIX_PATH) to cmake.
rules = make_rules()
for target in ("demo", "test"):
    check("build" in rules.get(target, ([], ""))[0], f"make {target} depends on make build")
check("configure" in rules.get("build", ([], ""))[0], "make build depends on make configure")
check("setup" in rules.get("configure", ([], ""))[0], "make configure depends on make setup")
check("bash deploy/setup.sh" in rules.get("setup", ([], ""))[1], "make setup runs deploy/setup.sh")
check("$(CMAKE_FLAGS)" in rules.get("configure", ([], ""))[1], "make configure passes $(CMAKE_FLAGS) to cmake")

readme = (SRC / "README.md").read_text()
first_block = readme.split("```")[1] if readme.count("```") >= 2 else ""
check(re.search(r"^make demo\b", first_block, re.M) is not None and
      re.search(r"^make test\b", first_block, re.M) is not None,
      "the README opens with `make demo` and `make test`")
check("make test" in (SRC / ".ci/run").read_text(), ".ci/run runs make test")

# The README is a user's guide (issue 53): at most 400 lines, and every measured figure in its
# prose (a ratio "1.035×", a share "98.03 %", a loss "1.9556") is one of the figures that hold
# today, the table at the top of experiments/RESULTS.md. Settings and targets are not figures.
check(readme.count("\n") <= 400, f"the README is at most 400 lines ({readme.count(chr(10))})")
results = (SRC / "experiments/RESULTS.md").read_text()
start, end = results.find("## The figures that hold today"), results.find("History below")
check(0 <= start < end, "experiments/RESULTS.md opens with the figures that hold today")
table = results[start:end] if 0 <= start < end else ""
settings = {"95 %", "3 ×", "10×", "5×"}  # utilization target, deadline multiple, norm bound, memory goal
prose = " ".join(readme.split("```")[0::2])
untraced = []
for m in re.finditer(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?(×|%)|(?<![\w.])(\d\.\d{4})(?!\w)", prose):
    if m.group(0) in settings:
        continue
    if m.group(3):
        found = re.search(r"(?<![\w.])" + re.escape(m.group(3)) + r"(?!\d)", table)
    else:
        found = re.search(r"(?<![\w.])" + re.escape(m.group(1)) + r"(\s?" + m.group(2) + "|–)", table)
    if not found:
        untraced.append(m.group(0))
check(not untraced, f"every figure in the README is in RESULTS' current table (not found: {untraced})")

for dockerfile, extra in (("deploy/Dockerfile", None), ("deploy/Dockerfile.cuda", "CMAKE_PREFIX_PATH=")):
    ins = instructions(dockerfile)
    froms = [a for w, a in ins if w == "FROM"]
    check(bool(froms) and froms[-1] == "debian:bookworm", f"{dockerfile}'s image is built on debian:bookworm (got {froms})")
    check(all(re.search(r"\sAS\s+\w+$", f, re.I) for f in froms[:-1]),
          f"{dockerfile}'s other stages are only named sources of files")
    runs = [a for w, a in ins if w == "RUN"]
    setup_at = next((i for i, a in enumerate(runs) if re.search(r"\bbash deploy/setup\.sh\b", a)), None)
    build_at = next((i for i, a in enumerate(runs) if re.search(r"\bmake build\b", a)), None)
    check(setup_at is not None, f"{dockerfile} runs bash deploy/setup.sh")
    check(build_at is not None and setup_at is not None and setup_at < build_at,
          f"{dockerfile} runs make build after the set-up")
    check(any(w == "COPY" and a.split()[0] == "deploy/setup.sh" for w, a in ins),
          f"{dockerfile} copies deploy/setup.sh")
    own = re.compile(r"(^|&&|;|\|\||\{)\s*(cmake|apt-get|apt|pip3?|curl|wget)\s")
    check(not any(own.search(a) for a in runs),
          f"{dockerfile} installs and builds only through setup.sh and make (no cmake, apt-get install, pip, curl or wget of its own)")
    if build_at is not None:
        check("install -m 755 /opt/xloco/build/src/cli/xloco /usr/local/bin/xloco" in runs[build_at],
              f"{dockerfile} installs the xloco binary that make build built")
        check("cp configs/*.json /opt/xloco/configs/" in runs[build_at], f"{dockerfile} ships configs/")
        check("install -m 644 /opt/xloco/build/src/cli/libxloco_spm.so /usr/local/lib/libxloco_spm.so && ldconfig" in runs[build_at],
              f"{dockerfile} installs the SentencePiece module (xloco prepare, tokens runs) where dlopen finds it")
        if extra:
            check(extra in runs[build_at], f"{dockerfile} builds against the LibTorch in CMAKE_PREFIX_PATH")

# Every XLOCO_* name the SDL files set is read by the command they run.
help_env = {}
for cmd in ("head", "worker"):
    res = subprocess.run([XLOCO, cmd, "--help"], capture_output=True, text=True)
    check(res.returncode == 0, f"xloco {cmd} --help runs")
    help_env[cmd] = set(re.findall(r"Env:(XLOCO_[A-Z_]+)", res.stdout))
for sdl, cmd in (("deploy/akash/head.yaml", "head"), ("deploy/akash/provider.yaml", "worker")):
    text = (SRC / sdl).read_text()
    names = set(re.findall(r"^\s*- (XLOCO_[A-Z_]+)=", text, re.M))
    check(bool(names), f"{sdl} sets XLOCO_* variables")
    unknown = names - help_env[cmd]
    check(not unknown, f"{sdl}: every variable is read by xloco {cmd} (unknown: {sorted(unknown)})")
    check(re.search(rf'args: \["{cmd}"\]', text) is not None, f"{sdl} runs xloco {cmd}")

render = (SRC / "deploy/akash/render.py").read_text()
default_cfg = re.search(r'"--config", default="/opt/xloco/configs/([^"]+)"', render)
check(default_cfg is not None and (SRC / "configs" / default_cfg.group(1)).is_file(),
      "the config render.py points the SDL files at ships in configs/")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("all checks passed")
