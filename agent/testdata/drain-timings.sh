#!/bin/bash
# Measures SIGTERM -> exit of `keyway agent` beside a real `keyway proxy`
# (gossip on, lan profile, one proxy), with the figures quoted in
# docs/agent.md. Needs bash, curl, bc and python3; uses ports 18080, 19001,
# 19901-19903 on 127.0.0.1. Run from the repository root:
#
#   bash agent/testdata/drain-timings.sh
set -u
D=$(mktemp -d); trap 'kill $PX $PY 2>/dev/null; rm -rf $D' EXIT
go build -o $D/keyway ./cmd/keyway || exit 1
cp agent/testdata/slow_replica.py $D/
cd $D
cat > proxy.yaml <<'YAML'
listen: "127.0.0.1:18080"
admin: {listen: "127.0.0.1:19901"}
log: {level: info, format: json}
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0}
replica_sets:
  - name: orders
    replicas: 1
    key: [{header: X-Key}]
    timeouts: {connect: 500ms, request: 30s, idle: 30s}
YAML
./keyway proxy -c proxy.yaml 2> proxy.log & PX=$!
python3 slow_replica.py 19001 & PY=$!   # GET/POST /slow?s=N answers after N seconds
for i in $(seq 50); do GA=$(grep -o '"msg":"gossip started"[^}]*"addr":"[^"]*"' proxy.log | sed 's/.*"addr":"//;s/"//'); [ -n "$GA" ] && break; sleep 0.1; done
echo "proxy gossip at $GA"
start_agent() { # $1 drain.timeout, $2 log name; returns once the proxy routes to the replica
  ./keyway agent --replica.set orders --replica.name orders-0 --replica.addr 127.0.0.1:19001 \
    --gossip.join $GA --gossip.bind_addr 127.0.0.1 --listen 127.0.0.1:19902 \
    --probe.interval 200ms --drain.timeout $1 2> agent-$2.log & AG=$!
  for i in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Key: k1' http://127.0.0.1:18080/ingest)" = 200 ] && break; sleep 0.1
  done
}
term() { # SIGTERM the agent; print the seconds until it exited and its drain log line
  local t0=$(date +%s.%N); kill -TERM $AG; wait $AG; local rc=$?; local t1=$(date +%s.%N)
  echo "$1: SIGTERM -> exit $(echo "$t1 - $t0" | bc) s (exit code $rc)"
  grep -o '"msg":"\(replica drained\|drain timed out[^"]*\)"[^}]*' agent-$1.log
}
start_agent 30s idle; term idle
start_agent 30s busy   # three 2 s requests in flight, SIGTERM 0.3 s after they start
for i in 1 2 3; do (curl -s -o /dev/null -w "  in-flight request $i: %{http_code} after %{time_total}s\n" -H "X-Key: k$i" "http://127.0.0.1:18080/slow?s=2") & done
sleep 0.3; term busy; sleep 2
start_agent 1s timeout # a 4 s request in flight, drain.timeout 1s
(curl -s -o /dev/null -w "  in-flight request: %{http_code} after %{time_total}s\n" -H "X-Key: k1" "http://127.0.0.1:18080/slow?s=4") &
sleep 0.3; term timeout; sleep 4
# No peer at all: the join address answers nothing (retried with backoff).
./keyway agent --replica.set orders --replica.name orders-9 --replica.addr 127.0.0.1:19001 \
  --gossip.join 127.0.0.1:1 --gossip.bind_addr 127.0.0.1 --listen 127.0.0.1:19903 --probe.interval 200ms 2> agent-nopeer.log & AG=$!
for i in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:19903/readyz)" = 200 ] && break; sleep 0.1; done
term nopeer
