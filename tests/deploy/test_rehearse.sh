#!/usr/bin/env bash
# ctest deploy.rehearse (label netns): deploy/rehearse.sh runs a short job with the head and 3
# providers each in its own network namespace, over 100 Mbit/s links, configured only through
# XLOCO_* variables; the head's status, read over a provider's link, must list all 3 providers
# as active from their own namespace addresses (32-token windows keep it short). Where a writable
# cgroup cpu controller is there, the providers run under --cpus 0.3 and each must have been held
# at that cap. Skipped (77) when not root or without ip netns.
set -euo pipefail
SRC=${XLOCO_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
XLOCO=${XLOCO_BIN:-$SRC/build/src/cli/xloco}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cpus=()
if { [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && [ -w /sys/fs/cgroup/cpu ]; } ||
   { grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null && [ -w /sys/fs/cgroup ]; }; then
  cpus=(--cpus 0.3)
fi
set +e
bash "$SRC/deploy/rehearse.sh" --xloco "$XLOCO" --config "$SRC/configs/kjv-tiny.json" --providers 3 \
  "${cpus[@]}" --rate 100mbit --name ctest-rehearsal --timeout 300 \
  --set inner.steps=40 --set inner.warmup_steps=5 --set outer.inner_steps=10 --set inner.log_every=10 \
  --set inner.eval_batches=2 --set outer.eval_every=2 --set outer.checkpoint_every=2 --set model.seq_len=32
rc=$?
set -e
[ $rc -ne 77 ] || exit 77
[ $rc -eq 0 ] || { echo "FAIL: rehearse.sh exited with $rc"; exit 1; }
python3 - runs/ctest-rehearsal/rehearsal.json <<'PY'
import ipaddress, json, sys
r = json.load(open(sys.argv[1]))
s = r["status"]
assert s is not None, "no status was read from the head"
ps = s["providers"]
names = sorted(p["name"] for p in ps)
assert names == ["provider-0", "provider-1", "provider-2"], names
head = ipaddress.ip_address(r["head_address"])
addrs = [ipaddress.ip_address(p["address"]) for p in ps]
assert len(set(addrs)) == 3, f"each provider has its own address: {addrs}"
for p, a in zip(ps, addrs):
    assert a != head and not a.is_loopback, f"{p['name']} seen from {a}"
    assert ipaddress.ip_network(f"{head}/24", strict=False).supernet_of(ipaddress.ip_network(f"{a}/32")), a
    assert p["state"] == "active", f"{p['name']} is {p['state']}"
assert s["round"] >= 1, f"rounds done when last read: {s['round']}"
if r["cpus"]:
    t = r["cpu_throttled_periods"]
    assert len(t) == 3 and all(isinstance(n, int) and n > 0 for n in t), \
        f"each provider's cgroup must have held it at {r['cpus']} CPUs: throttled periods {t}"
    print(f"ok: each provider capped at {r['cpus']} CPUs, throttled periods {t}")
print("ok: the head saw", ", ".join(f"{p['name']} from {p['address']}" for p in ps))
PY
