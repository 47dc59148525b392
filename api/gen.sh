#!/usr/bin/env bash
# Regenerates the Go code in api/freqringv1 from api/freqring/v1/*.proto.
# Installs protoc (Debian's protobuf-compiler) and the pinned plugins if missing.
set -euo pipefail
cd "$(dirname "$0")"
PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.1
if ! command -v protoc >/dev/null; then
  apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
fi
bin=$(go env GOPATH)/bin
[ -x "$bin/protoc-gen-go" ] && "$bin/protoc-gen-go" --version | grep -q "$PROTOC_GEN_GO" ||
  go install google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO
[ -x "$bin/protoc-gen-go-grpc" ] && "$bin/protoc-gen-go-grpc" --version | grep -q "${PROTOC_GEN_GO_GRPC#v}" ||
  go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC
PATH="$bin:$PATH" protoc -I . \
  --go_out=. --go_opt=module=github.com/freqring/freqring/api \
  --go-grpc_out=. --go-grpc_opt=module=github.com/freqring/freqring/api \
  freqring/v1/*.proto
echo "generated: $(ls freqringv1)"
