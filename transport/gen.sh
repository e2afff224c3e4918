#!/bin/sh
# Regenerates transport/sluicev1 from transport/proto/sluice/v1/sluice.proto.
# Needs protoc (3.21 works), protoc-gen-go v1.36.10 and protoc-gen-go-grpc
# v1.5.1 on PATH (go install puts them in $(go env GOPATH)/bin).
# The generated files are committed: building needs no protoc.
set -eu
cd "$(dirname "$0")/.."
PATH="$PATH:$(go env GOPATH)/bin"
protoc -I transport/proto \
	--go_out=. --go_opt=module=github.com/sluicehq/sluice \
	--go-grpc_out=. --go-grpc_opt=module=github.com/sluicehq/sluice \
	transport/proto/sluice/v1/sluice.proto
