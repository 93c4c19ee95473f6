#!/usr/bin/env bash
# The multi-provider deployment rehearsed on one machine: the head and N providers each in its
# own network namespace with its own address, joined through a bridge by veth links that the
# kernel rate-limits (tc tbf, both directions of every provider link), and configured only
# through the XLOCO_* environment variables that the containers in deploy/akash use.
#
#   sudo deploy/rehearse.sh [--providers 3] [--rate 100mbit] [--config configs/kjv-tiny-4p.json]
#                           [--set KEY=VALUE]... [--name RUN] [--xloco build/src/cli/xloco]
#                           [--rates 100mbit,100mbit,50mbit,10mbit] [--late I:ROUND]
#                           [--kill I:ROUND:SECONDS] [--cpus 0.45]
#
# --rates gives each provider its own link rate; --late starts provider I only once ROUND rounds
# have closed (it joins with the full state over its link); --kill SIGKILLs provider I SECONDS
# after round ROUND closed (mid-transfer of that round's update); --cpus puts each provider in a
# cgroup of its own capped at that many CPUs (cpu.cfs_quota_us, or cpu.max on cgroup v2), so that
# providers sharing this machine's cores run at steady, equal speeds as on machines of their own
# (a test device, like XLOCO_THROTTLE, which is passed on to the providers when set; the head
# stays uncapped). Needs root and `ip netns`;
# exits 77 (ctest's "skipped") with the reason when either is missing. Writes runs/RUN/
# rehearsal.json: the head's last /status (read from provider 0's namespace over its rate-limited
# link), the addresses and rates used (and with --cpus each provider cgroup's throttled periods),
# and runs/RUN/status_samples.jsonl: /status asked once a second from there, with how long each
# answer took. Exit code: the head's.
set -euo pipefail

PROVIDERS=3
RATE=100mbit
CONFIG=configs/kjv-tiny-4p.json
XLOCO=build/src/cli/xloco
NAME=rehearsal
TIMEOUT=1800
SETS=()
RATES=""
LATE=""
KILL=""
CPUS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --providers) PROVIDERS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --set) SETS+=("$2"); shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --xloco) XLOCO=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --late) LATE=$2; shift 2 ;;
    --kill) KILL=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "rehearse: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

skip() { echo "rehearse: SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (run it with sudo)"
command -v ip >/dev/null || skip "the ip command is missing (Debian package iproute2)"
command -v tc >/dev/null || skip "the tc command is missing (Debian package iproute2)"
probe="xr-probe-$$"
ip netns add "$probe" 2>/dev/null || skip "ip netns add failed: this kernel or container does not allow network namespaces"
ip netns del "$probe"
# --cpus: one cgroup per provider under CG_BASE, cgroup v1's cpu hierarchy or v2's root.
CG_BASE=""
CG_QUOTA=""
if [ -n "$CPUS" ]; then
  [[ "$CPUS" =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "rehearse: --cpus '$CPUS' must be a positive number of CPUs, e.g. 0.45" >&2; exit 2; }
  CG_QUOTA=$(awk -v c="$CPUS" 'BEGIN { printf "%d", c * 100000 }')
  [ "$CG_QUOTA" -ge 1000 ] || { echo "rehearse: --cpus '$CPUS' is below 0.01 CPU" >&2; exit 2; }
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    CG_BASE=/sys/fs/cgroup/cpu
  elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    CG_BASE=/sys/fs/cgroup
    grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control \
      || skip "--cpus: cannot enable the cpu controller in /sys/fs/cgroup/cgroup.subtree_control"
  else
    skip "--cpus needs the cgroup cpu controller (cgroup v1 /sys/fs/cgroup/cpu, or v2's cpu.max)"
  fi
fi
[ -x "$XLOCO" ] || { echo "rehearse: no xloco binary at $XLOCO (build first, or pass --xloco)" >&2; exit 2; }
XLOCO=$(realpath "$XLOCO")
CONFIG=$(realpath "$CONFIG")

# Names are unique per invocation so that rehearsals (and a crashed one's leftovers) never clash.
P="xr$$"
SW="$P-sw"
HEAD_NS="$P-h"
NET=10.213.$(($$ % 200)).
HEAD_ADDR=${NET}1
ZMQ_PORT=7700
HTTP_PORT=8080
RUN_DIR=runs/$NAME
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do ip netns del "$ns" || true; done
  if [ -n "$CG_BASE" ]; then
    for cg in "$CG_BASE/$P"-p*; do [ -d "$cg" ] && { rmdir "$cg" 2>/dev/null || { sleep 1; rmdir "$cg" || true; }; }; done
  fi
  # Files a sudo user's rehearsal wrote stay theirs.
  if [ -n "${SUDO_USER:-}" ] && [ -d "$RUN_DIR" ]; then chown -R "$SUDO_USER" "$RUN_DIR" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# tbf needs a bucket of at least one timer tick of traffic; 10 ms of the rate, never under 64 KiB
# (the largest segment veth hands over).
rate_bits() {
  local r=${1,,}
  case "$r" in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *) echo "rehearse: --rate '$1' must end in kbit, mbit or gbit" >&2; exit 2 ;;
  esac
}
# One rate per provider: --rates, or --rate for all.
IFS=, read -r -a PROVIDER_RATES <<< "${RATES:-}"
for i in $(seq 0 $((PROVIDERS - 1))); do
  r=${PROVIDER_RATES[$i]:-$RATE}
  [[ "${r,,}" =~ ^[0-9]+(k|m|g)bit$ ]] || { echo "rehearse: rate '$r' must be a number ending in kbit, mbit or gbit" >&2; exit 2; }
  PROVIDER_RATES[$i]=$r
done
shape() {  # namespace, device, rate
  local burst=$(( $(rate_bits "$3") / 8 / 100 ))
  [ "$burst" -ge 65536 ] || burst=65536
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$3" burst "$burst" latency 200ms
}

ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
# connect NAMESPACE ADDRESS LINK RATE: a veth from the namespace to the bridge, shaped unless
# RATE is "full"
connect() {
  ip netns add "$1"
  ip link add "$3" netns "$1" type veth peer name "s$3" netns "$SW"
  ip -n "$1" addr add "$2/24" dev "$3"
  ip -n "$1" link set lo up
  ip -n "$1" link set "$3" up
  ip -n "$SW" link set "s$3" master br0 up
  if [ "$4" != full ]; then
    shape "$1" "$3" "$4"        # uplink: provider -> head
    shape "$SW" "s$3" "$4"      # downlink: head -> provider
  fi
}
# The head's own link is left at full speed: it stands for a data-centre host, and each provider's
# link is the slow one (per-link rate, as the experiments report it).
connect "$HEAD_NS" "$HEAD_ADDR" vh full
for i in $(seq 0 $((PROVIDERS - 1))); do
  connect "$P-p$i" "${NET}$((11 + i))" "vp$i" "${PROVIDER_RATES[$i]}"
done

# Keys exactly as an operator makes them (deploy/README.md), handed over as Z85 text in env.
mkdir -p "$RUN_DIR/rehearsal-keys"
chmod 700 "$RUN_DIR/rehearsal-keys"
keys=$RUN_DIR/rehearsal-keys
"$XLOCO" keygen "$keys/head" >/dev/null
allow=()
for i in $(seq 0 $((PROVIDERS - 1))); do
  "$XLOCO" keygen "$keys/provider-$i" >/dev/null
  allow+=("provider-$i=$(cat "$keys/provider-$i.pub")")
done
SET_CSV=$(IFS=,; echo "run.name=$NAME,outer.providers=$PROVIDERS,outer.min_providers=$PROVIDERS${SETS[*]:+,${SETS[*]}}")

http_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')  # the status port is beyond loopback
common_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}"
            XLOCO_CONFIG="$CONFIG" XLOCO_SET="$SET_CSV"
            ${XLOCO_THROTTLE:+XLOCO_THROTTLE="$XLOCO_THROTTLE"})  # the test device, when set
echo "rehearse: head $HEAD_ADDR, $PROVIDERS providers at ${NET}11.., links $(IFS=,; echo "${PROVIDER_RATES[*]}") each way${CPUS:+, $CPUS CPUs each}, run $RUN_DIR"
ip netns exec "$HEAD_NS" "${common_env[@]}" \
  XLOCO_BIND="tcp://0.0.0.0:$ZMQ_PORT" XLOCO_ADVERTISE="tcp://$HEAD_ADDR:$ZMQ_PORT" \
  XLOCO_HTTP="0.0.0.0:$HTTP_PORT" XLOCO_HTTP_TOKEN="$http_token" XLOCO_KEY="$(cat "$keys/head.key")" \
  XLOCO_ALLOW="$(IFS=,; echo "${allow[*]}")" XLOCO_RANKS_ON_HOST=$((PROVIDERS + 1)) \
  "$XLOCO" head > >(sed -u 's/^/[head] /') 2>&1 &
head_pid=$!
pids+=("$head_pid")
declare -A provider_pid
start_provider() {
  local i=$1
  local in_cgroup=()
  if [ -n "$CG_BASE" ]; then
    local cg="$CG_BASE/$P-p$i"
    mkdir -p "$cg" || { echo "rehearse: --cpus: cannot create the cgroup $cg" >&2; exit 2; }
    if [ -f "$cg/cpu.max" ]; then
      echo "$CG_QUOTA 100000" > "$cg/cpu.max"
    else
      echo 100000 > "$cg/cpu.cfs_period_us"
      echo "$CG_QUOTA" > "$cg/cpu.cfs_quota_us"
    fi
    # The shell joins the cgroup, then becomes the provider: no thread starts outside it.
    in_cgroup=(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg")
  fi
  "${in_cgroup[@]}" ip netns exec "$P-p$i" "${common_env[@]}" \
    XLOCO_HEAD="tcp://$HEAD_ADDR:$ZMQ_PORT" XLOCO_HEAD_PUB="$(cat "$keys/head.pub")" \
    XLOCO_NAME="provider-$i" XLOCO_SHARD=$i XLOCO_KEY="$(cat "$keys/provider-$i.key")" \
    XLOCO_RANKS_ON_HOST=$((PROVIDERS + 1)) \
    "$XLOCO" worker > >(sed -u "s/^/[provider-$i] /") 2>&1 &
  provider_pid[$i]=$!
  pids+=("$!")
}
late_i=${LATE%%:*}; late_round=${LATE#*:}
kill_i=${KILL%%:*}; kill_rest=${KILL#*:}; kill_round=${kill_rest%%:*}; kill_after=${kill_rest#*:}
for i in $(seq 0 $((PROVIDERS - 1))); do
  [ -n "$LATE" ] && [ "$i" = "$late_i" ] && continue
  start_provider "$i"
done
rounds_done() { [ -f "$RUN_DIR/metrics/head.jsonl" ] && wc -l < "$RUN_DIR/metrics/head.jsonl" || echo 0; }

# Watch the head's status from outside its namespace, over provider 0's rate-limited link, as an
# operator would: once a second, timing each answer; keep the last answer for the report.
status_url="http://$HEAD_ADDR:$HTTP_PORT"
ip netns exec "$P-p0" env XLOCO_HTTP_TOKEN="$http_token" python3 -u - "$status_url/status" "$RUN_DIR/status_samples.jsonl" "$RUN_DIR/last_status.json" <<'PY' &
import json, os, sys, time, urllib.request
url, out, last = sys.argv[1:4]
auth = {"Authorization": "Bearer " + os.environ["XLOCO_HTTP_TOKEN"]}
with open(out, "a") as f:
    while True:
        t0 = time.time()
        try:
            body = urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=10).read()
            ok = True
            open(last, "wb").write(body)
        except Exception as e:
            ok, body = False, str(e).encode()
        f.write(json.dumps({"t": t0, "latency_s": time.time() - t0, "ok": ok}) + "\n")
        f.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - t0)))
PY
pids+=("$!")
start=$(date +%s)
killed=""
while kill -0 "$head_pid" 2>/dev/null; do
  done_rounds=$(rounds_done)
  if [ -n "$LATE" ] && [ -z "${provider_pid[$late_i]:-}" ] && [ "$done_rounds" -ge "$late_round" ]; then
    echo "rehearse: starting provider-$late_i late, after round $done_rounds"
    start_provider "$late_i"
  fi
  if [ -n "$KILL" ] && [ -z "$killed" ] && [ "$done_rounds" -ge "$kill_round" ]; then
    sleep "$kill_after"
    echo "rehearse: kill -9 provider-$kill_i, ${kill_after}s after round $kill_round closed"
    kill -KILL "${provider_pid[$kill_i]}" 2>/dev/null || true
    pkill -KILL -P "${provider_pid[$kill_i]}" 2>/dev/null || true
    killed=yes
  fi
  if [ $(( $(date +%s) - start )) -gt "$TIMEOUT" ]; then
    echo "rehearse: the run did not finish within ${TIMEOUT}s" >&2
    exit 124
  fi
  sleep 1
done
last_status=$(cat "$RUN_DIR/last_status.json" 2>/dev/null || true)
set +e
wait "$head_pid"
rc=$?
set -e
[ -n "$last_status" ] || last_status=null
rates_json=$(printf '"%s",' "${PROVIDER_RATES[@]}")
# With --cpus: how many 100 ms periods each provider's cgroup was held back at its cap.
throttled_json=""
if [ -n "$CG_BASE" ]; then
  for i in $(seq 0 $((PROVIDERS - 1))); do
    n=$(awk '$1 == "nr_throttled" { print $2 }' "$CG_BASE/$P-p$i/cpu.stat" 2>/dev/null || true)
    throttled_json+="${n:-null},"
  done
fi
cat > "$RUN_DIR/rehearsal.json" <<EOF
{"rate": "$RATE", "rates": [${rates_json%,}], "head_address": "$HEAD_ADDR", "providers": $PROVIDERS,
 "head_exit": $rc, "late": "$LATE", "kill": "$KILL", "cpus": "$CPUS", "cpu_throttled_periods": [${throttled_json%,}], "status": $last_status}
EOF
if [ "$last_status" != null ]; then
  echo "rehearse: the head's last status, read from provider-0's namespace:"
  python3 -c 'import json,sys; s=json.load(sys.stdin); [print(" ", p["name"], p.get("address","?"), p["state"], "round", p["last_round"]) for p in s["providers"]]' <<<"$last_status" || true
fi
echo "rehearse: head exited with $rc; report in $RUN_DIR/rehearsal.json"
exit "$rc"
