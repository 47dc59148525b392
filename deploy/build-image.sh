#!/usr/bin/env bash
# build-image.sh builds the freqring binary (static, CGO_ENABLED=0) and the
# container image around it.
#
#   deploy/build-image.sh [TAG]     # TAG defaults to freqring:dev
#
# Run from anywhere inside the repository. It needs Go and a Docker daemon, and
# pulls nothing: the image is FROM scratch. It uses the legacy builder
# (DOCKER_BUILDKIT=0) unless the caller sets DOCKER_BUILDKIT: a Docker CLI
# without the buildx plugin refuses DOCKER_BUILDKIT=1, and builds this
# Dockerfile the same either way. The legacy builder prints a deprecation
# notice on stderr; it is harmless. GOARCH may be set to cross-build (arm64).
set -euo pipefail

tag="${1:-freqring:dev}"
deploy="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$deploy")"

mkdir -p "$deploy/build/data"
(
	cd "$root"
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$deploy/build/freqring" ./cmd/freqring
)
DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}" docker build --quiet --tag "$tag" "$deploy" >/dev/null
echo "$tag"
