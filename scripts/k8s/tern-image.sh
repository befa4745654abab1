#!/usr/bin/env bash
# Build the tern-node image (localhost/tern/tern-node:<version>) as a docker-archive tarball
# from the release binaries, for `ctr -n k8s.io images import` on every node: no registry.
#
# usage: scripts/k8s/tern-image.sh [--build] [--bin-dir DIR] [--plugin-dir DIR]
#                                  [--require-static-plugins] [--out FILE] [--tag REPO:TAG]
#   --build       run `cargo build --release` of ternd and ternctl, and build the plugins tern
#                 and tern-ipam static (scripts/static-plugins.sh), first; ships those
#   --bin-dir     where the binaries are (default target/release)
#   --plugin-dir  where tern and tern-ipam are (default $TERN_PLUGIN_DIR, else see below)
#   --require-static-plugins  fail unless the plugins shipped are static
#   --out         the tarball (default target/images/tern-node.tar)
#   --tag         the image name (default localhost/tern/tern-node:<workspace version>, the
#                 image `ternctl install manifest` renders)
#
# The image: /usr/local/bin/{ternd,ternctl,tern,tern-ipam}, /usr/sbin/nft, and every shared
# library they need (ldd: ternd, ternctl and nft are glibc-linked), /etc/passwd and
# /etc/group with root, an empty /tmp. The CNI plugins are copied to the host by the
# DaemonSet's init container (`ternctl install-cni`), which takes them from ternctl's own
# directory; they then run on the host, against the host's libraries, so they should be
# static (static-pie): the host's glibc may be older than the build machine's.
# Which plugins are shipped, without --plugin-dir / $TERN_PLUGIN_DIR / --build: the static
# build of the same profile beside the bin dir (scripts/static-plugins.sh's output,
# target/<host triple>/<profile> for a bin dir target/<profile>) when it has both plugins
# and is not older than the bin dir's tern; else the bin dir's own. This script never runs
# cargo unless --build is given (the lab calls it from tests that cargo itself runs), so a
# debug lab keeps its dynamic debug plugins unless `scripts/static-plugins.sh --debug` ran.
# The linkage shipped is printed on stderr.
# The reference plugins (bandwidth, portmap) are not shipped: install-cni chains them only
# when the host's CNI bin directory already has them.
# The last line printed is JSON: {"out": ..., "tag": ..., "config_digest": ...}.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
bin_dir="$root/target/release"
out="$root/target/images/tern-node.tar"
tag="localhost/tern/tern-node:$version"
build=0
plugin_dir=${TERN_PLUGIN_DIR:-}
require_static=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=1; shift ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --plugin-dir) plugin_dir=$2; shift 2 ;;
    --require-static-plugins) require_static=1; shift ;;
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "tern-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p tern-agent -p tern-ctl --bin ternd --bin ternctl)
  if [ -z "$plugin_dir" ]; then
    plugin_dir=$(bash "$root/scripts/static-plugins.sh" | tail -n 1)
    require_static=1
  fi
fi
for b in ternd ternctl; do
  if [ ! -x "$bin_dir/$b" ]; then
    echo "tern-image.sh: $bin_dir/$b is missing; build it with" >&2
    echo "    cargo build --release -p tern-agent -p tern-ctl -p tern-plugin" >&2
    echo "(or pass --build, or --bin-dir DIR with the four binaries)" >&2
    exit 1
  fi
done
# "static" or "dynamic": an ELF without PT_INTERP maps no loader and no library.
# (Not `readelf | grep -q`: with pipefail, grep's early exit can fail readelf with SIGPIPE.)
linkage() {
  local h
  h=$(readelf -lW "$1") || { echo "tern-image.sh: readelf -l $1 failed (binutils)" >&2; exit 1; }
  if grep -q INTERP <<<"$h"; then echo dynamic; else echo static; fi
}
if [ -z "$plugin_dir" ]; then
  plugin_dir=$bin_dir
  host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
  beside="$(dirname "$bin_dir")/${host:-$(uname -m)-unknown-linux-gnu}/$(basename "$bin_dir")"
  # `-nt` is false when the bin dir has no such file: then the static build is taken as is.
  if [ -x "$beside/tern" ] && [ -x "$beside/tern-ipam" ] &&
    ! [ "$bin_dir/tern" -nt "$beside/tern" ] && ! [ "$bin_dir/tern-ipam" -nt "$beside/tern-ipam" ] &&
    [ "$(linkage "$beside/tern")" = static ] && [ "$(linkage "$beside/tern-ipam")" = static ]; then
    plugin_dir=$beside
  fi
fi
for b in tern tern-ipam; do
  if [ ! -x "$plugin_dir/$b" ]; then
    echo "tern-image.sh: $plugin_dir/$b is missing; build it with" >&2
    echo "    scripts/static-plugins.sh   (or cargo build --release -p tern-plugin)" >&2
    exit 1
  fi
  l=$(linkage "$plugin_dir/$b")
  echo "tern-image.sh: shipping $l $plugin_dir/$b" >&2
  if [ "$require_static" = 1 ] && [ "$l" != static ]; then
    echo "tern-image.sh: $plugin_dir/$b is dynamically linked and --require-static-plugins is set;" >&2
    echo "    build static plugins with scripts/static-plugins.sh and pass --plugin-dir DIR" >&2
    exit 1
  fi
done
nft=$(command -v nft || true)
if [ -z "$nft" ]; then
  echo "tern-image.sh: nft not found; install it: apt-get install nftables" >&2
  exit 1
fi
nft=$(readlink -f "$nft")
etc=$(mktemp -d)
trap 'rm -rf "$etc"' EXIT
printf 'root:x:0:0:root:/root:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$etc/group"
mkdir -p "$(dirname "$out")"
exec python3 "$here/oci_image.py" files --out "$out" --tag "$tag" --ldd \
  --entrypoint /usr/local/bin/ternd \
  --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --file "$bin_dir/ternd:/usr/local/bin/ternd" \
  --file "$bin_dir/ternctl:/usr/local/bin/ternctl" \
  --file "$plugin_dir/tern:/usr/local/bin/tern" \
  --file "$plugin_dir/tern-ipam:/usr/local/bin/tern-ipam" \
  --file "$nft:/usr/sbin/nft" \
  --file "$etc/passwd:/etc/passwd" --file "$etc/group:/etc/group" \
  --dir /tmp --dir /run --dir /var/lib/tern --dir /etc/tern ${TERN_IMAGE_LIST:+--list}
