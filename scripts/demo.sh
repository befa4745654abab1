#!/usr/bin/env bash
# THE main job: `bash scripts/demo.sh`, as root, on a fresh Debian machine.
# Installs the packages tern needs, builds the binaries, and runs `ternctl lab demo`: a three-node
# lab cluster built inside network namespaces (the machine's own network is never changed), real
# pods on every node wired by the real CNI plugin and agent, routes between the nodes' blocks
# learned over BGP, real packets between pods on different nodes, `ipam show --show-blocks` and
# `node status`, then a full teardown. Arguments go to `ternctl lab demo` (e.g. `--encap vxlan`;
# `--kubernetes` for the same on a real Kubernetes cluster, after scripts/k8s-components.sh).
# Exits non-zero when any check fails.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
exec </dev/null
if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh: must run as root (the lab creates network namespaces)" >&2
  exit 1
fi
bash scripts/deps.sh
# Only the binaries the demo runs (the CNI plugins, the agent, the CLI): not tern-bench, nor the
# tests. docs/benchmarks.md ("The demo's first run") has where a fresh machine's minutes go.
cargo build --release -p tern-plugin -p tern-agent -p tern-ctl --bins
exec target/release/ternctl lab demo "$@"
