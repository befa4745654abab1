#!/bin/sh
# Builds rtcni (main.go beside this script) into OUTPUT with Debian's Go 1.19 against Debian's
# libcni 1.1.2 sources (golang-github-appc-cni-dev, /usr/share/gocode), in GOPATH mode: no module
# proxy, nothing written outside a temporary GOPATH and OUTPUT. scripts/deps.sh installs both
# packages.
# usage: build.sh OUTPUT
set -eu
GOROOT_DIR=${GOROOT_DIR:-/usr/lib/go-1.19}
GOCODE=${GOCODE:-/usr/share/gocode}
OUT=$(realpath -m "${1:?usage: build.sh OUTPUT}")
SRC=$(cd "$(dirname "$0")" && pwd)
[ -x "$GOROOT_DIR/bin/go" ] || { echo "build.sh: $GOROOT_DIR/bin/go missing (apt-get install golang-1.19-go, or bash scripts/deps.sh)" >&2; exit 1; }
[ -d "$GOCODE/src/github.com/containernetworking/cni/libcni" ] ||
  { echo "build.sh: libcni sources missing under $GOCODE (apt-get install golang-github-appc-cni-dev)" >&2; exit 1; }
GP=$(mktemp -d /tmp/tern-rtcni.XXXXXX)
trap 'rm -rf "$GP"' EXIT
mkdir -p "$GP/src/rtcni"
cp "$SRC/main.go" "$GP/src/rtcni/"
GO111MODULE=off GOPATH="$GP:$GOCODE" GOCACHE="$GP/cache" GOFLAGS= "$GOROOT_DIR/bin/go" build -o "$OUT" rtcni
echo "built $OUT"
