#!/usr/bin/env bash
# Builds cmd/sluice, starts three daemons on loopback that form one cluster,
# sends JSON checks of one limit to all three with curl to show that they
# share it, checks requests described by descriptors against the rules of
# rules.yaml, asks one over gRPC with `sluice check`, and stops them.
#
#   examples/daemon/run.sh            # ports 18081-18083 (HTTP), 17081-17083
#   PORT_OFFSET=100 examples/daemon/run.sh   # (gRPC), 16081-16083 (gossip), +100
set -euo pipefail

cd "$(dirname "$0")/../.."
off=${PORT_OFFSET:-0}
work=$(mktemp -d)
pids=()

cleanup() {
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

http_port() { echo $((18080 + off + $1)); }
grpc_port() { echo $((17080 + off + $1)); }
gossip_port() { echo $((16080 + off + $1)); }
peer_port() { echo $((19080 + off + $1)); }

echo "building cmd/sluice"
go build -o "$work/sluice" ./cmd/sluice

# Node 1 starts the cluster; nodes 2 and 3 join it. Settings come from
# sluice.yaml, the environment and flags, in increasing precedence.
for i in 1 2 3; do
	join=""
	if [ "$i" -gt 1 ]; then join="127.0.0.1:$(gossip_port 1)"; fi
	SLUICE_NODE_NAME="node-$i" SLUICE_JOIN="$join" SLUICE_CONFIG=examples/daemon/sluice.yaml \
		SLUICE_RULES_FILE=examples/daemon/rules.yaml \
		"$work/sluice" serve \
		--http-addr "127.0.0.1:$(http_port "$i")" \
		--grpc-addr "127.0.0.1:$(grpc_port "$i")" \
		--peer-addr "127.0.0.1:$(peer_port "$i")" \
		--gossip-addr "127.0.0.1:$(gossip_port "$i")" \
		>"$work/node-$i.log" 2>&1 &
	pids+=($!)
	echo "started node-$i (pid $!): http :$(http_port "$i"), grpc :$(grpc_port "$i"), peer :$(peer_port "$i"), gossip :$(gossip_port "$i")"
done

# Wait until every node is ready and routes to all three members.
for i in 1 2 3; do
	for _ in $(seq 1 100); do
		if curl -fsS "http://127.0.0.1:$(http_port "$i")/readyz" 2>/dev/null | grep -q '"members":3'; then
			continue 2
		fi
		sleep 0.1
	done
	echo "node-$i did not become ready; its log:" >&2
	cat "$work/node-$i.log" >&2
	exit 1
done
echo "all three nodes ready: $(curl -fsS "http://127.0.0.1:$(http_port 1)/readyz")"
echo

echo "limit 5 per minute for user:42, 9 checks spread over the three nodes:"
allowed=0
for n in $(seq 1 9); do
	i=$(((n - 1) % 3 + 1))
	resp=$(curl -fsS -X POST "http://127.0.0.1:$(http_port "$i")/v1/check" \
		-H 'Content-Type: application/json' \
		-d '{"name":"demo","key":"user:42","limit":5,"period":"1m","algorithm":"sliding_window_log"}')
	echo "  check $n via node-$i: $resp"
	if echo "$resp" | grep -q '"allowed":true'; then allowed=$((allowed + 1)); fi
done
echo "admitted $allowed of 9 (the limit is 5, shared by the cluster)"
echo

echo "rules.yaml's per_user (3 a minute on the free plan), 4 requests of user 42 described by descriptors:"
for n in $(seq 1 4); do
	i=$(((n - 1) % 3 + 1))
	resp=$(curl -fsS -X POST "http://127.0.0.1:$(http_port "$i")/v1/rules/check" \
		-H 'Content-Type: application/json' \
		-d '{"route":"/api/export","user":"42","descriptors":{"plan":"free","org":"acme"}}')
	echo "  request $n via node-$i: $resp"
done
echo

echo "a batch, with a mistake in its second item:"
curl -sS -X POST "http://127.0.0.1:$(http_port 2)/v1/check/batch" \
	-d '{"requests":[{"name":"demo","key":"user:7","limit":2,"period":"10s","algorithm":"gcra"},{"name":"demo","key":"user:8","limit":2,"period":"10s","algorithm":"leaky"}]}'
echo

echo "a malformed body gets a problem document:"
curl -sS -X POST "http://127.0.0.1:$(http_port 3)/v1/check" -d '{"name":"demo","key":"k","limit":"five"}'
echo

echo "the same limit over gRPC with sluice check (exit status 0 allowed, 1 limited):"
set +e
"$work/sluice" check --addr "127.0.0.1:$(grpc_port 3)" --name demo --key user:42 --limit 5 --period 1m --algorithm sliding_window_log
echo "  exit status $?"
set -e
echo

echo "node-1's HTTP metrics:"
curl -fsS "http://127.0.0.1:$(http_port 1)/metrics" | grep -E '^sluice_(http_requests_total|checks_total)' | sed 's/^/  /'
echo

echo "stopping the nodes (SIGTERM: each leaves the cluster gracefully)"
for pid in "${pids[@]}"; do kill -TERM "$pid"; done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
pids=()
if [ "$status" -ne 0 ]; then
	echo "a node exited with status $status; logs:" >&2
	cat "$work"/node-*.log >&2
	exit 1
fi
echo "done"
