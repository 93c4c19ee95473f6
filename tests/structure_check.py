#!/usr/bin/env python3
"""The shape issue 54 gave src/outer, held:
- its four rooms include one another only downward (src/outer/README.md): round and status
  include no other room of outer, provider only round, head round and status;
- provider/provider.cpp has at most 400 lines, and no function in src/outer is longer than 60
  lines (lizard's count, from a function's first line to its last).
Exits 77 (ctest: skipped, with the reason) when lizard is not installed; the include rule is
checked first either way."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTER = ROOT / "src" / "outer"
ALLOWED = {"round": set(), "status": set(), "provider": {"round"}, "head": {"round", "status"}}
MAX_FUNCTION_LINES = 60
MAX_PROVIDER_LINES = 400
INCLUDE = re.compile(r'#include "outer/([a-z_]+)/[a-z_]+\.h"')


def include_failures(files):
    failures = []
    for path in files:
        room = path.relative_to(OUTER).parts[0]
        if room not in ALLOWED:
            failures.append(f"{path.relative_to(ROOT)} is in no room of src/outer ({', '.join(ALLOWED)})")
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith('#include "outer/') and not INCLUDE.match(line):
                failures.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()} names no room")
            m = INCLUDE.match(line)
            if m and m.group(1) != room and m.group(1) not in ALLOWED[room]:
                failures.append(f"{path.relative_to(ROOT)}:{n}: {room} includes {m.group(1)} "
                                f"({room} may include {sorted(ALLOWED[room]) or 'no other room'})")
    return failures


def main() -> int:
    files = sorted(p for p in OUTER.rglob("*") if p.suffix in (".cpp", ".h"))
    if not files:
        print("FAIL: no sources under src/outer")
        return 1
    failures = include_failures(files)
    try:
        import lizard  # PyPI, pinned in deploy/setup.sh
    except ImportError:
        for line in failures:
            print("FAIL:", line)
        if failures:
            return 1
        print("SKIPPED: the include rule holds; lizard is not installed (deploy/setup.sh "
              "installs it from PyPI), so function lengths were not measured")
        return 77
    provider = (OUTER / "provider" / "provider.cpp").read_text().count("\n")
    if provider > MAX_PROVIDER_LINES:
        failures.append(f"src/outer/provider/provider.cpp has {provider} lines, more than "
                        f"{MAX_PROVIDER_LINES}")
    longest = (0, "")
    for path in files:
        for f in lizard.analyze_file(str(path)).function_list:
            where = f"{path.relative_to(ROOT)}:{f.start_line} {f.name}"
            longest = max(longest, (f.length, where))
            if f.length > MAX_FUNCTION_LINES:
                failures.append(f"{where} is {f.length} lines, more than {MAX_FUNCTION_LINES}")
    print(f"{len(files)} files in 4 rooms; provider.cpp {provider} lines; longest function "
          f"{longest[0]} lines ({longest[1]})")
    for line in failures:
        print("FAIL:", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
