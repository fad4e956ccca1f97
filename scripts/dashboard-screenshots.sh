#!/usr/bin/env bash
# Screenshots of the dashboard with a degraded set, for docs/dashboard.md:
# runs `keyway demo` on loopback, sends traffic through it, turns one demo
# replica to answering 500 (its /_mode switch), and shoots /ui with
# headless Chromium twice: while that replica is ejected, and once another
# one is recovering (its /_ready switch off). Needs Go, curl and chromium (Debian: apt-get install chromium).
#
#   scripts/dashboard-screenshots.sh [OUTDIR]     # default docs/img
#
# Ports: KEYWAY_SHOT_PORT (proxy, default 18080), +1 admin, +2 gossip.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/img}"
port="${KEYWAY_SHOT_PORT:-18080}"
admin="127.0.0.1:$((port + 1))"
chrome="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$chrome" ] || { echo "no chromium: apt-get install chromium" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $demo_pid 2>/dev/null; wait $demo_pid 2>/dev/null; rm -rf "$work"' EXIT
go build -o "$work/keyway" ./cmd/keyway
"$work/keyway" demo --listen "127.0.0.1:$port" --admin-listen "$admin" --gossip-bind-port "$((port + 2))" >"$work/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 100); do
  kill -0 "$demo_pid" 2>/dev/null || { echo "keyway demo exited (port $port, $((port + 1)) or $((port + 2)) in use?):" >&2; cat "$work/demo.log" >&2; exit 1; }
  [ "$(curl -sf "http://$admin/v1/replica_sets/orders" 2>/dev/null | tr -d " \n" | grep -c '"in_rotation":3')" != 0 ] && break
  sleep 0.3
done
traffic() { # $1 rounds of 40 keyed requests
  for _ in $(seq "$1"); do
    pids=()
    for k in $(seq 40); do curl -s -o /dev/null -H "X-Key: order-$k" -d hello "http://127.0.0.1:$port/ingest" & pids+=($!); done
    wait "${pids[@]}"; sleep 0.5
  done
}
traffic 30
# orders-1 answers 500: the proxy ejects it on the threshold.
addr=$(curl -s "http://$admin/v1/replica_sets/orders" | tr -d " \n" | grep -o '"name":"orders-1","addr":"[^"]*"' | sed 's/.*"addr":"//; s/"$//')
curl -s -X POST "http://$addr/_mode?v=500" >/dev/null
traffic 10
shot() { # $1 file, $2 height
  "$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,"$2" \
    --virtual-time-budget=6000 --screenshot="$out/$1" "http://$admin/ui" >/dev/null 2>&1
  echo "wrote $out/$1"
}
mkdir -p "$out"
shot dashboard-ejected.png 1500
# Then orders-1 answers again, and orders-2 replays a checkpoint (its
# readiness off: its agent says recovering).
curl -s -X POST "http://$addr/_mode?v=ok" >/dev/null
addr2=$(curl -s "http://$admin/v1/replica_sets/orders" | tr -d " \n" | grep -o '"name":"orders-2","addr":"[^"]*"' | sed 's/.*"addr":"//; s/"$//')
curl -s -X POST "http://$addr2/_ready?v=false" >/dev/null
traffic 12
shot dashboard-recovering.png 1500
curl -s -X POST "http://$addr2/_ready?v=true" >/dev/null
