#!/usr/bin/env bash
# Build the CNI plugins `tern` and `tern-ipam` (crates/plugin) as static-pie executables, into
# their own output directory, without touching the workspace's normal build.
#
# usage: scripts/static-plugins.sh [--debug]
#   --debug   the dev profile (default: release)
# The last line printed is the output directory (target/<host triple>/release or .../debug),
# which holds `tern` and `tern-ipam`; `tern-bench cni --plugin-dir` and
# `scripts/k8s/tern-image.sh --plugin-dir` take it.
#
# Why static: the plugins run on the HOST (`ternctl install-cni` copies them out of the
# tern-node image into the host's CNI bin directory), whose glibc may be older than the build
# machine's; a static binary needs none of the host's libraries (the reference plugins and
# Calico ship static Go binaries for the same reason). It also starts faster: the runtime
# execs the plugin once per ADD/DEL, and a static-pie skips the dynamic loader's mapping and
# relocation of libc and libgcc_s (~0.25 ms of a ~2.5 ms ADD, docs/benchmarks.md).
#
# Why this way (a script with an explicit --target, not a .cargo/config.toml setting):
# - `crt-static` must reach only the plugins. `RUSTFLAGS=-Ctarget-feature=+crt-static` without
#   `--target` also reaches the proc-macro crates (serde_derive, ...), which cannot be static
#   ("cannot produce proc-macro ... does not support these crate types"). With `--target`,
#   Cargo applies RUSTFLAGS to the target's crates only and builds build scripts and
#   proc-macros for the host without them.
# - `--target` also gives the static build its own output directory (target/<triple>/...), so
#   `cargo build --workspace --bins` stays fresh and keeps its dynamic target/release/tern: no
#   ping-pong rebuild between the two (which `cargo rustc -- -C target-feature=+crt-static`
#   into target/release causes).
# - A `[target.<triple>] rustflags` entry in .cargo/config.toml would apply to every normal
#   build too (host == target without --target), proc-macros included; a build.rs link-arg
#   (`-static`, `-static-pie`) links a binary that segfaults at start: rustc must know the
#   target is static (`crt-static`) to pick the matching start files and libraries.
# Static glibc is fine for these plugins: they use no NSS (getaddrinfo, getpwnam, ...), which
# static glibc would load from the host at run time. The check below fails if the result is
# not static-pie or does not answer a CNI VERSION call.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "static-plugins.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "static-plugins.sh: host $host is not *-linux-gnu; static-pie via crt-static is set up for glibc only" >&2
     exit 1 ;;
esac
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)
# RUSTFLAGS set by the caller are kept (with --target they too reach the target's crates only).
(cd "$root" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build "${cargo_profile[@]}" -p tern-plugin --bins --target "$host" >&2)
out="$root/target/$host/$profile"
[ -n "${CARGO_TARGET_DIR:-}" ] && out="$CARGO_TARGET_DIR/$host/$profile"
for b in tern tern-ipam; do
  # static-pie: a position-independent executable (type DYN) with no PT_INTERP, so the kernel
  # maps no loader and no library (`file` says "static-pie linked"). readelf is binutils,
  # which the Rust toolchain's linker needs anyway.
  h=$(readelf -hlW "$out/$b")
  if grep -q 'INTERP' <<<"$h" || ! grep -Eq '^ *Type: *DYN' <<<"$h"; then
    echo "static-plugins.sh: $out/$b is not static-pie:" >&2
    grep -E '^ *Type:|INTERP|interpreter' <<<"$h" >&2
    exit 1
  fi
  v=$(CNI_COMMAND=VERSION "$out/$b" </dev/null) || {
    echo "static-plugins.sh: $out/$b VERSION failed: $v" >&2
    exit 1
  }
  case "$v" in
    *supportedVersions*) ;;
    *) echo "static-plugins.sh: $out/$b VERSION gave no supportedVersions: $v" >&2; exit 1 ;;
  esac
done
echo "$out"
