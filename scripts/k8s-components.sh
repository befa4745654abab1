#!/usr/bin/env bash
# Build the real Kubernetes components the lab's `--kubernetes` cluster runs, from their Go
# modules with the ordinary `go` client, into a cache outside the clone. Idempotent: a binary is
# rebuilt only when its recipe (version, flags, Go version) changed, so a warm run takes seconds.
# The last line printed is the directory holding the binaries; the images are in ../images.
#
# Versions and why:
# - Kubernetes v1.34.4: 1.34 is the newest release whose kubelet runs on cgroup v1 without
#   `failCgroupV1: false` (1.35+ refuses by default; kubernetes#134298), and this machine is
#   cgroup v1. `go install k8s.io/kubernetes/cmd/...@v1.34.4` refuses the module because of its
#   `replace ./staging/...` directives, so we build from a throwaway module that requires
#   k8s.io/kubernetes and pins every staging module (read from k8s.io/kubernetes's own go.mod) to
#   the matching v0.34.4 (kubernetes#79384).
# - etcd v3.6.x (go.etcd.io/etcd/server/v3): Debian's 3.4.23 is below the apiserver's documented
#   floor (3.4.29+/3.5.11+); 1.34 itself ships etcd 3.6.
# - containerd v2.2.x (github.com/containerd/containerd/v2): kubelet 1.34 needs CRI v1, which
#   Debian's 1.6.20 has, but 1.6 is end of life and containerd lists 1.6.39+ as the floor for
#   Kubernetes 1.34; 1.6.20 does not pin the sandbox image against image GC and never calls
#   CNI STATUS (go-cni 1.1.6), which tern implements and which makes NetworkReady follow ternd.
#   v2.2 is a supported pairing for 1.34 and calls STATUS (v2.0.4+). Debian's runc is used.
# - crictl (sigs.k8s.io/cri-tools v1.34.0): to debug the CRI, and the CRI-path fallback.
# - our own pause image (scripts/k8s/pause.c, static), a probe image (scripts/k8s/probe.c: UDP
#   echo and timed TCP transfers, which busybox's nc cannot do) and a busybox image built from
#   Debian's busybox-static by `scripts/k8s/oci_image.py busybox`: there is no registry.
#
# Environment: TERN_K8S_CACHE (default /var/cache/tern).
set -euo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_TAG=k8s-components
# The pinned versions (K8S_VERSION, ...), the cache's layout and the Go environment.
# shellcheck source=k8s/go-env.sh
. "$REPO_DIR/scripts/k8s/go-env.sh"
IMAGE_TOOL=$REPO_DIR/scripts/k8s/oci_image.py

# gobuild MODDIR NAME PKG LDFLAGS [TAGS]: build PKG into $BIN/NAME unless its recipe is unchanged.
gobuild() {
  local moddir=$1 name=$2 pkg=$3 ldflags=$4 tags=${5:-}
  local recipe="$pkg|$ldflags|$tags|$GO_VERSION|cgo=$CGO_ENABLED|$(sha256sum "$moddir/go.mod" | cut -c1-16)"
  if up_to_date "$name" "$recipe"; then
    log "$name: up to date"
    return
  fi
  log "$name: building $pkg ..."
  local start=$SECONDS
  (cd "$moddir" && nice -n 5 go build -trimpath ${tags:+-tags "$tags"} -ldflags "-s -w $ldflags" \
    -o "$BIN/$name.tmp" "$pkg")
  mv -f "$BIN/$name.tmp" "$BIN/$name"
  mark "$name" "$recipe"
  log "$name: built in $((SECONDS - start)) s ($(du -h "$BIN/$name" | cut -f1))"
}

# module_dir NAME GOMOD TOOLS_IMPORTS: a throwaway module whose go.mod is GOMOD and whose
# tools.go imports the main packages (so `go mod tidy` resolves their whole graph).
module_dir() {
  local dir="$SRC/$1" gomod=$2 imports=$3
  mkdir -p "$dir"
  local want
  want=$(printf '%s\n//tools: %s\n' "$gomod" "$imports" | sha256sum | cut -c1-16)
  if [ -f "$dir/.recipe" ] && [ "$(cat "$dir/.recipe")" = "$want" ] && [ -f "$dir/go.sum" ]; then
    return
  fi
  log "$1: resolving modules (go mod tidy) ..."
  printf '%s\n' "$gomod" >"$dir/go.mod"
  {
    echo '//go:build tools'
    echo
    echo '// Package tools pins the main packages this throwaway module builds.'
    echo 'package tools'
    echo
    echo 'import ('
    for p in $imports; do echo "	_ \"$p\""; done
    echo ')'
  } >"$dir/tools.go"
  rm -f "$dir/go.sum"
  (cd "$dir" && go mod tidy)
  # tidy rewrites go.mod (requires it found): the recipe hash is of our input, not its output.
  printf '%s' "$want" >"$dir/.recipe"
}

# ---------------------------------------------------------------- images (seconds)
# c_image NAME TAG: scripts/k8s/NAME.c built static, packed as /NAME in image TAG (NAME.tar).
c_image() {
  local name=$1 tag=$2 src="$REPO_DIR/scripts/k8s/$1.c"
  local recipe
  recipe="$(sha256sum "$src" "$IMAGE_TOOL" | cut -c1-16 | tr '\n' ' ')$tag"
  if up_to_date "$name" "$recipe" && [ -f "$IMAGES/$name.tar" ]; then
    log "$name image: up to date"
    return
  fi
  command -v gcc >/dev/null || die "gcc not found (needed for the static $name binary)"
  log "$name: gcc -static -Os $src"
  gcc -static -Os -Wall -Werror -o "$BIN/$name.tmp" "$src"
  strip "$BIN/$name.tmp" 2>/dev/null || true
  mv -f "$BIN/$name.tmp" "$BIN/$name"
  python3 "$IMAGE_TOOL" static "$BIN/$name" "/$name" "$IMAGES/$name.tar.tmp" "$tag" >/dev/null
  mv -f "$IMAGES/$name.tar.tmp" "$IMAGES/$name.tar"
  mark "$name" "$recipe"
  log "$name image: $IMAGES/$name.tar ($tag)"
}

build_images() {
  c_image pause localhost/tern/pause:3.10
  c_image probe localhost/tern/probe:1
  local recipe
  local bb=/bin/busybox
  [ -x "$bb" ] || die "$bb not found (Debian package busybox-static; scripts/deps.sh installs it)"
  recipe="$(sha256sum "$bb" "$IMAGE_TOOL" | cut -c1-16 | tr '\n' ' ')"
  if [ -f "$IMAGES/busybox.tar" ] && [ -f "$IMAGES/.busybox.recipe" ] &&
    [ "$(cat "$IMAGES/.busybox.recipe")" = "$recipe" ]; then
    log "busybox image: up to date"
  else
    python3 "$IMAGE_TOOL" busybox "$bb" "$IMAGES/busybox.tar.tmp" tern-busybox:1 >/dev/null
    mv -f "$IMAGES/busybox.tar.tmp" "$IMAGES/busybox.tar"
    printf '%s' "$recipe" >"$IMAGES/.busybox.recipe"
    log "busybox image: $IMAGES/busybox.tar (docker.io/library/tern-busybox:1)"
  fi
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  module_dir etcd "module tern.local/etcd-build

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION" "go.etcd.io/etcd/server/v3"
  gobuild "$SRC/etcd" etcd go.etcd.io/etcd/server/v3 \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"
}

# ---------------------------------------------------------------- Kubernetes
K8S_BINS="kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler kube-proxy"
build_kubernetes() {
  local kmod="$GOMODCACHE/k8s.io/kubernetes@$K8S_VERSION/go.mod"
  if [ ! -f "$kmod" ]; then
    log "kubernetes: go mod download k8s.io/kubernetes@$K8S_VERSION"
    mkdir -p "$SRC/k8s-dl"
    [ -f "$SRC/k8s-dl/go.mod" ] || printf 'module tern.local/k8s-dl\n\ngo 1.24.0\n' >"$SRC/k8s-dl/go.mod"
    (cd "$SRC/k8s-dl" && go mod download k8s.io/kubernetes@"$K8S_VERSION")
  fi
  # Every staging module k8s.io/kubernetes replaces with ./staging/src/...: pin it to its release.
  local staging
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$kmod")
  [ -n "$staging" ] || die "no staging replace directives found in $kmod"
  local gomod="module tern.local/k8s-components

go 1.24.0

require k8s.io/kubernetes $K8S_VERSION

replace ("
  for m in $staging; do gomod+="
	$m => $m $STAGING_VERSION"; done
  gomod+="
)"
  local imports=""
  for b in $K8S_BINS; do imports+=" k8s.io/kubernetes/cmd/$b"; done
  module_dir kubernetes "$gomod" "$imports"

  local major=${K8S_VERSION#v}; major=${major%%.*}
  local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local ld=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitCommit=module-$K8S_VERSION -X $p.gitTreeState=clean -X $p.buildDate=$K8S_BUILD_DATE"
  done
  for b in $K8S_BINS; do
    gobuild "$SRC/kubernetes" "$b" "k8s.io/kubernetes/cmd/$b" "$ld"
  done
}

# ---------------------------------------------------------------- containerd + crictl
build_containerd() {
  module_dir containerd "module tern.local/containerd-build

go 1.24.0

require github.com/containerd/containerd/v2 $CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr"
  local ld="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  ld+=" -X github.com/containerd/containerd/v2/version.Revision=module-$CONTAINERD_VERSION"
  # No btrfs/devmapper/zfs snapshotters: the lab uses overlayfs (and btrfs needs cgo headers).
  local tags="no_btrfs no_devmapper no_zfs"
  gobuild "$SRC/containerd" containerd github.com/containerd/containerd/v2/cmd/containerd "$ld" "$tags"
  gobuild "$SRC/containerd" containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$ld" "$tags"
  gobuild "$SRC/containerd" ctr github.com/containerd/containerd/v2/cmd/ctr "$ld" "$tags"
}

build_crictl() {
  module_dir cri-tools "module tern.local/cri-tools-build

go 1.24.0

require sigs.k8s.io/cri-tools $CRITOOLS_VERSION" "sigs.k8s.io/cri-tools/cmd/crictl"
  gobuild "$SRC/cri-tools" crictl sigs.k8s.io/cri-tools/cmd/crictl \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRITOOLS_VERSION"
}

start=$SECONDS
log "cache $ROOT (go $GO_VERSION, GOCACHE $GOCACHE)"
build_images
build_etcd
build_kubernetes
build_containerd
build_crictl
log "all components ready in $((SECONDS - start)) s"
echo "$BIN"
