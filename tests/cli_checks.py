"""What the Python ctest scripts share: the xloco binary and source folder from ctest's
environment, a check() that records failures and keeps going, a runner for the binary, and the
interpreter that has torch."""
import os
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
