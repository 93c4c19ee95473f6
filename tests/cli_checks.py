"""What the Python ctest scripts share: the xloco binary and source folder from ctest's
environment, a check() that records failures and keeps going, a runner for the binary, and the
interpreter that has torch."""
import os
import random
import subprocess
import sys
from pathlib import Path

SRC = Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[1]))
XLOCO = os.environ.get("XLOCO_BIN", str(SRC / "build/src/cli/xloco"))

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def xloco(*args, cwd=None):
    res = subprocess.run([XLOCO, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    return res.returncode, res.stdout + res.stderr


def torch_python():
    """An interpreter with torch (python3-torch is Debian's, under /usr/bin/python3)."""
    for exe in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
            return exe
    return None


def corpus_text(seed, lines):
    """Lines of KJV-like words, made-up syllables and a few non-ASCII words (café, über)."""
    rng = random.Random(seed)
    words = ["the", "and", "of", "LORD", "unto", "said", "God", "land", "people", "house", "king",
             "children", "Israel", "earth", "shall", "thee", "thou", "which", "café", "1611", "über"]
    syl = ["ka", "lo", "mi", "tha", "ne", "ru", "sh", "ei", "qu", "on"]
    out = []
    for _ in range(lines):
        ws = [rng.choice(words) if rng.random() < 0.7 else "".join(rng.choice(syl) for _ in range(rng.randint(1, 4)))
              for _ in range(rng.randint(3, 18))]
        out.append(" ".join(ws) + rng.choice([".", ",", ";", ":", ""]) + "\n")
        if rng.random() < 0.1:
            out.append("\n")
    return "".join(out)
