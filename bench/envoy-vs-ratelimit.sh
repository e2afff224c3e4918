#!/usr/bin/env bash
# Envoy's rate limit service, side by side on one machine: sluice daemons
# against envoyproxy/ratelimit (built from its source) with a local
# redis-server, on the same domain file (one descriptor key, `user`, at a
# million per second), driven in turns by cmd/sluice-bench -scenario rls:
# CALLERS callers of unary ShouldRateLimit with KEYS values, for DURATION a
# run, ROUNDS runs of each, the same load generator for both. It prints
# checks/s, latencies, the server CPU per check (utime+stime from /proc of
# the daemon, or of ratelimit plus redis-server) of each, and the load
# generator's own CPU per check (getrusage of sluice-bench).
#
#   bench/envoy-vs-ratelimit.sh
#   SLUICE_BASE=/tmp/sluice-main bench/envoy-vs-ratelimit.sh   # also a second sluice binary
#
# Settings (environment):
#   RATELIMIT_SRC   a source tree of envoyproxy/ratelimit to build; without
#                   it, `go install` through the module proxy at
#                   RATELIMIT_VERSION (commit f2fb157, if the proxy serves it)
#   RATELIMIT_BIN   a ratelimit binary to use as it is
#   SLUICE_BASE     a second sluice binary, measured as "base" beside this
#                   tree's ("sluice")
#   SKIP_RATELIMIT  set to 1: sluice binaries only (a before/after of sluice)
#   API             envoy (ShouldRateLimit), or sluice's own grpc (Check) or
#                   http (POST /v1/check, keep-alive connections) with the
#                   domain file's limit; with grpc or http, sluice binaries
#                   only
#   LOADGEN         the load generator of API=envoy: h2 (the default:
#                   sluice-bench's own gRPC on HTTP/2 frames, which takes
#                   a fraction of grpc-go's CPU per call and so leaves
#                   the servers more of the machine) or grpc (grpc-go's
#                   client with go-control-plane's stubs)
#   CALLERS (64) KEYS (10000) DURATION (10s) ROUNDS (2) CONNS (1)
#   BENCH_FLAGS     more flags of sluice-bench (e.g. -cpuprofile FILE)
# Every process it starts listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
CALLERS=${CALLERS:-64}
KEYS=${KEYS:-10000}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-1}
API=${API:-envoy}
LOADGEN=${LOADGEN:-h2}
if [[ $API != envoy ]]; then SKIP_RATELIMIT=1; fi
RATELIMIT_VERSION=${RATELIMIT_VERSION:-v0.0.0-20260706065234-f2fb15770f7f}
REDIS_SERVER=${REDIS_SERVER:-redis-server}

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

freeport() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# waitport PORT PID: until something listens on PORT, or PID exits, at most 30 s.
waitport() {
	for _ in $(seq 300); do
		if ! kill -0 "$2" 2>/dev/null; then
			echo "process $2 exited before listening on $1" >&2
			return 1
		fi
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "nothing listens on $1 after 30 s" >&2
	return 1
}

echo "building sluice and sluice-bench" >&2
(cd "$root" && go build -o "$work/sluice" ./cmd/sluice && go build -o "$work/sluice-bench" ./cmd/sluice-bench)

ratelimit=${RATELIMIT_BIN:-}
if [[ ${SKIP_RATELIMIT:-} == 1 ]]; then
	:
elif [[ -z $ratelimit ]]; then
	ratelimit=$work/ratelimit
	if [[ -n ${RATELIMIT_SRC:-} ]]; then
		echo "building envoyproxy/ratelimit from $RATELIMIT_SRC" >&2
		(cd "$RATELIMIT_SRC" && go build -o "$ratelimit" ./src/service_cmd)
	else
		echo "building envoyproxy/ratelimit@$RATELIMIT_VERSION from the module proxy" >&2
		GOBIN=$work GOFLAGS=-mod=mod go install "github.com/envoyproxy/ratelimit/src/service_cmd@$RATELIMIT_VERSION"
		mv "$work/service_cmd" "$ratelimit"
	fi
fi

# The domain file both serve.
mkdir -p "$work/envoy" "$work/runtime/ratelimit/config"
cat >"$work/envoy/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000
EOF
cp "$work/envoy/bench.yaml" "$work/runtime/ratelimit/config/bench.yaml"

if [[ ${SKIP_RATELIMIT:-} != 1 ]]; then
redis_port=$(freeport)
"$REDIS_SERVER" --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
waitport "$redis_port" "$redis_pid"

rl_grpc=$(freeport)
env -i PATH="$PATH" HOME="$work" \
	HOST=127.0.0.1 PORT="$(freeport)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(freeport)" \
	GRPC_HOST=127.0.0.1 GRPC_PORT="$rl_grpc" \
	USE_STATSD=false LOG_LEVEL=warn \
	REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" \
	RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
	"$ratelimit" >"$work/ratelimit.log" 2>&1 &
rl_pid=$!
pids+=("$rl_pid")
waitport "$rl_grpc" "$rl_pid"
fi

# startsluice NAME BINARY: a one-node daemon with the domain file; sets
# sluice_addr (its gRPC address, or its HTTP address with API=http) and
# sluice_pid.
startsluice() {
	local grpc http gossip
	grpc=$(freeport) http=$(freeport) gossip=$(freeport)
	cat >"$work/$1.yaml" <<EOF
node_name: $1
gossip_addr: 127.0.0.1:$gossip
grpc_addr: 127.0.0.1:$grpc
http_addr: 127.0.0.1:$http
gossip_profile: fast
bootstrap_expect: 1
envoy_config_dir: $work/envoy
log_level: warn
EOF
	"$2" serve --config "$work/$1.yaml" >"$work/$1.log" 2>&1 &
	sluice_pid=$!
	pids+=("$sluice_pid")
	waitport "$grpc" "$sluice_pid"
	waitport "$http" "$sluice_pid"
	sluice_addr=127.0.0.1:$grpc
	if [[ $API == http ]]; then sluice_addr=127.0.0.1:$http; fi
}

targets=()
startsluice sluice "$work/sluice"
targets+=("sluice=$sluice_addr@$sluice_pid")
if [[ -n ${SLUICE_BASE:-} ]]; then
	startsluice base "$SLUICE_BASE"
	targets=("base=$sluice_addr@$sluice_pid" "${targets[@]}")
fi
if [[ ${SKIP_RATELIMIT:-} != 1 ]]; then
	targets+=("ratelimit=127.0.0.1:$rl_grpc@$rl_pid+$redis_pid")
fi

echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$REDIS_SERVER" --version | cut -d' ' -f1-3); LOADGEN=$LOADGEN"
read -r -a extra <<<"${BENCH_FLAGS:-}"
IFS=,
"$work/sluice-bench" -scenario rls -api "$API" -client "$LOADGEN" -targets "${targets[*]}" -callers "$CALLERS" -keys "$KEYS" \
	-duration "$DURATION" -rounds "$ROUNDS" -conns "$CONNS" "${extra[@]}"
