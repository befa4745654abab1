#!/usr/bin/env bash
# Build the tern-node image (localhost/tern/tern-node:<version>) as a docker-archive tarball
# from the release binaries, for `ctr -n k8s.io images import` on every node: no registry.
#
# usage: scripts/k8s/tern-image.sh [--build] [--bin-dir DIR] [--out FILE] [--tag REPO:TAG]
#   --build     run `cargo build --release` of ternd, ternctl, tern and tern-ipam first
#   --bin-dir   where the binaries are (default target/release)
#   --out       the tarball (default target/images/tern-node.tar)
#   --tag       the image name (default localhost/tern/tern-node:<workspace version>, the
#               image `ternctl install manifest` renders)
#
# The image: /usr/local/bin/{ternd,ternctl,tern,tern-ipam}, /usr/sbin/nft, and every shared
# library they need (ldd: the binaries are glibc-linked), /etc/passwd and /etc/group with
# root, an empty /tmp. The CNI plugins are copied to the host by the DaemonSet's init
# container (`ternctl install-cni`), which takes them from ternctl's own directory. The
# reference plugins (bandwidth, portmap) are not shipped: install-cni chains them only when
# the host's CNI bin directory already has them.
# The last line printed is JSON: {"out": ..., "tag": ..., "config_digest": ...}.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
bin_dir="$root/target/release"
out="$root/target/images/tern-node.tar"
tag="localhost/tern/tern-node:$version"
build=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=1; shift ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "tern-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p tern-agent -p tern-ctl -p tern-plugin \
     --bin ternd --bin ternctl --bin tern --bin tern-ipam)
fi
for b in ternd ternctl tern tern-ipam; do
  if [ ! -x "$bin_dir/$b" ]; then
    echo "tern-image.sh: $bin_dir/$b is missing; build it with" >&2
    echo "    cargo build --release -p tern-agent -p tern-ctl -p tern-plugin" >&2
    echo "(or pass --build, or --bin-dir DIR with the four binaries)" >&2
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
exec python3 "$here/oci_image.py" --out "$out" --tag "$tag" --ldd \
  --entrypoint /usr/local/bin/ternd \
  --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --file "$bin_dir/ternd:/usr/local/bin/ternd" \
  --file "$bin_dir/ternctl:/usr/local/bin/ternctl" \
  --file "$bin_dir/tern:/usr/local/bin/tern" \
  --file "$bin_dir/tern-ipam:/usr/local/bin/tern-ipam" \
  --file "$nft:/usr/sbin/nft" \
  --file "$etc/passwd:/etc/passwd" --file "$etc/group:/etc/group" \
  --dir /tmp --dir /run --dir /var/lib/tern --dir /etc/tern ${TERN_IMAGE_LIST:+--list}
