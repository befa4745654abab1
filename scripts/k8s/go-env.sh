# Sourced by scripts/k8s-components.sh and scripts/k8s-e2e.sh (after they set REPO_DIR and
# LOG_TAG): the pinned versions, the cache's layout, the Go environment of the component builds
# (module and build caches under the cache root, no toolchain download, static binaries),
# logging, and the recipe marks that make every build idempotent.

K8S_VERSION=v1.34.4
STAGING_VERSION=v0.34.4
ETCD_VERSION=v3.6.16
CONTAINERD_VERSION=v2.2.9
CRITOOLS_VERSION=v1.34.0
# Release date of k8s.io/kubernetes v1.34.4 (from the module proxy's .info): a fixed buildDate
# keeps builds reproducible and the recipe stamp stable.
K8S_BUILD_DATE=2026-02-10T12:53:36Z

CACHE_ROOT=${TERN_K8S_CACHE:-/var/cache/tern}
ROOT="$CACHE_ROOT/k8s/$K8S_VERSION"
BIN="$ROOT/bin"
IMAGES="$ROOT/images"
SRC="$ROOT/src"

export GOPATH="$CACHE_ROOT/go/path"
export GOMODCACHE="$GOPATH/pkg/mod"
export GOCACHE="$CACHE_ROOT/go/cache"
export GOTOOLCHAIN=local
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

log() { echo "$LOG_TAG: $*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || die "go not found in PATH or /usr/local/go/bin (Go 1.24+ is needed)"
GO_VERSION=$(go env GOVERSION)
mkdir -p "$BIN" "$IMAGES" "$SRC" "$GOPATH" "$GOCACHE"

# up_to_date NAME RECIPE: true when $BIN/NAME exists and was built from exactly RECIPE.
up_to_date() {
  [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.recipe" ] && [ "$(cat "$BIN/.$1.recipe")" = "$2" ]
}
# mark NAME RECIPE: record that $BIN/NAME was built from RECIPE.
mark() { printf '%s' "$2" >"$BIN/.$1.recipe"; }
