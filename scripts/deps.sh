#!/usr/bin/env bash
# Idempotent installer of the Debian packages tern's build and tests need.
# Checks each package with `dpkg -s` first and only runs apt-get for what is missing, so a
# machine that already has everything never touches the network or the package database.
set -euo pipefail

PACKAGES=(
  nftables iproute2 etcd-server bird2 containerd runc busybox-static
  containernetworking-plugins protobuf-compiler iperf3 golang-1.19-go
  golang-github-appc-cni-dev python3 gcc libc6-dev
  curl netcat-openbsd
  chromium chromium-driver
)

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps.sh: cargo not found in PATH; install the Rust toolchain (rustup, stable 1.95) first" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "deps.sh: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages (${missing[*]}) and not running as root; cannot install" >&2
  exit 1
fi

echo "deps.sh: installing missing packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q </dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
echo "deps.sh: done"
