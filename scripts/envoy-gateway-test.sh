#!/usr/bin/env bash
# Builds Envoy Gateway's control plane (envoy-gateway) from the module
# proxy and runs cmd/sluice/egtest against it: the daemon configured over
# Envoy Gateway's rate limit xDS server in standalone mode. Not part of
# .ci/run: the build takes well over 4 minutes on a 2-core machine.
#
#   scripts/envoy-gateway-test.sh
#   SLUICE_ENVOY_GATEWAY=/path/to/envoy-gateway scripts/envoy-gateway-test.sh   # no build
#
# Settings (environment):
#   ENVOY_GATEWAY_VERSION  the module version to build (v1.9.1)
#   SLUICE_ENVOY_GATEWAY   an envoy-gateway binary to use as it is
#   EG_BIN_DIR             where the built binary goes (~/.cache/sluice-envoy-gateway/VERSION)
# Envoy Gateway binds ports 18000-18002, 19000 and 19001: run one at a time.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ENVOY_GATEWAY_VERSION=${ENVOY_GATEWAY_VERSION:-v1.9.1}

if [ -z "${SLUICE_ENVOY_GATEWAY:-}" ]; then
	bindir=${EG_BIN_DIR:-$HOME/.cache/sluice-envoy-gateway/$ENVOY_GATEWAY_VERSION}
	if [ ! -x "$bindir/envoy-gateway" ]; then
		echo "== building envoy-gateway $ENVOY_GATEWAY_VERSION into $bindir"
		mkdir -p "$bindir"
		# -mod=mod: the module has no vendor directory to use; GOFLAGS
		# from the caller would otherwise apply to its build too.
		(cd "$bindir" && time GOFLAGS=-mod=mod GOBIN="$bindir" go install \
			"github.com/envoyproxy/gateway/cmd/envoy-gateway@$ENVOY_GATEWAY_VERSION")
	fi
	export SLUICE_ENVOY_GATEWAY=$bindir/envoy-gateway
fi
"$SLUICE_ENVOY_GATEWAY" version || true

echo "== go test ./cmd/sluice/egtest against $SLUICE_ENVOY_GATEWAY"
cd "$root"
go test -count=1 -timeout 15m ./cmd/sluice/egtest
