#!/usr/bin/env bash
# THE test command for tern: `bash scripts/test.sh`, as root, from anywhere. What CI runs
# (.ci/run). Everything it reads is in the repository or built by it; it installs what is
# missing (scripts/deps.sh) and caches what it builds under /var/cache/tern.
#
# The run, in order (docs/benchmarks.md, "CI run time", has the measured time of each step):
#   deps        Debian packages (scripts/deps.sh; seconds when present)
#   components  in the background from here, at the lowest CPU priority: the Kubernetes
#               components (scripts/k8s-components.sh) and the agnhost image, then
#               upstream's e2e binary (scripts/k8s-e2e.sh), built once into the cache
#   fmt         cargo fmt --check
#   build       one compile of the workspace, the binaries and every test target, with
#               clippy's lints (clippy-driver as the workspace's rustc wrapper): clippy, the
#               tests and the labs share one set of artefacts
#   clippy      fails when the build printed a warning (-D warnings, without stopping the tests)
#   upstream    in the background from here, once the components are built: upstream
#               Kubernetes' [sig-network] e2e specs on a lab cluster of their own
#               (scripts/k8s-e2e.sh --run, at nice 10), each spec one check; joined at the end
#   test        the cargo tests that need no Kubernetes components (unit, kernel, store, BGP,
#               namespace labs), then the doc tests; beside them, in a lane of its own, the
#               longest of them (test-netpol: the NetworkPolicy truth tables on a 3-node lab)
#   e2e         tests/e2e/*.sh (containerd, libcni), each with the reference plugins and tern
#   test-kube   once the components and agnhost are built: the cargo test targets named
#               *kube* (real kube-apiserver, kubelet, containerd). When the components were
#               already built as the build step ended (a warm cache), this step runs before
#               test and e2e, beside upstream's specs, and two groups run after it, beside
#               test and e2e, each in a lane (test-kube-wait: lab_kube_netpol; test-kube-more:
#               lab_kube_etcd_tls, lab_kube_backend, lab_kube_demo, lab_kube_dual)
# Every step runs even when an earlier one failed, so one run reports everything; a step that
# needs what a failed step makes is counted failed. A test that cannot run fails saying what is
# missing (tern-testkit's guards); only this kernel's limits (IPIP, dummy, GRE, WireGuard, SCTP)
# skip, logged to TERN_TEST_SKIP_LOG, and they are counted at the end. The last line is exactly
# `e2e: N passed, N failed`; the exit status is non-zero on any failure.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
exec </dev/null
if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: must run as root (kernel tests and e2e create network namespaces)" >&2
  exit 1
fi
# shellcheck source=ci/lib.sh
. "$REPO/scripts/ci/lib.sh"

CACHE=${TERN_K8S_CACHE:-/var/cache/tern}
export CARGO_TERM_COLOR=never
# Every crate is built once per run: incremental state would only cost disk.
export CARGO_INCREMENTAL=0
# clippy-driver compiles the workspace's crates (dependencies get plain rustc), so one build
# serves clippy and the tests. Warnings stay warnings here: the clippy step fails on them
# while the tests still run. cargo replays a fresh crate's cached warnings, so a warm build
# reports them too.
export RUSTC_WORKSPACE_WRAPPER=clippy-driver
export CLIPPY_ARGS=-W__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

# The debug target lives in the cache, so a run from a new clone recompiles only the
# workspace's crates (their sources are newer than the cache), not the ~200 dependencies. One
# run holds it at a time (flock); another run at the same time uses its clone's target/. When
# the cache was last built from another checkout, that checkout's workspace artefacts are
# removed first (they are rebuilt anyway), so the cache does not grow with every clone.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/cargo-target.lock"
  if flock -n 9; then
    export CARGO_TARGET_DIR=$CACHE/cargo-target
    mkdir -p "$CARGO_TARGET_DIR"
    if [ "$(cat "$CARGO_TARGET_DIR/.checkout" 2>/dev/null)" != "$REPO" ]; then
      for p in $(cargo metadata --no-deps --format-version 1 --offline 2>/dev/null |
        python3 -c 'import json,sys; print(" ".join(p["name"] for p in json.load(sys.stdin)["packages"]))'); do
        cargo clean -q -p "$p" 2>/dev/null
      done
      printf '%s' "$REPO" >"$CARGO_TARGET_DIR/.checkout"
    fi
  else
    echo "test.sh: another run holds $CACHE/cargo-target; building in $REPO/target"
  fi
fi
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
BIN_DIR=$TARGET/debug

disk_report "$REPO" "$CACHE" /tmp
free_gb=$(df -Pk "$CACHE" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "${free_gb:-0}" -lt 12 ]; then
  echo "test.sh: warning: only ${free_gb} GB free; a run needs about 12 GB (see the README)"
fi

trap stop_bg EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step deps bash scripts/deps.sh || { echo "e2e: 0 passed, 1 failed"; exit 1; }

# The components build runs beside the compile and the tests that need none of it, at nice
# 19: it takes the CPU they leave idle, and they keep their timing. It marks what it has made
# ($CI_LOGS/NAME.rc, see `mark` and `wait_mark`): first the components and the agnhost image
# (what the Kubernetes lab tests need), then upstream's e2e binary, which only the upstream
# step needs and which builds while the lab tests run.
mark() { echo "$2" >"$CI_LOGS/$1.rc"; }
wait_mark() {
  while [ ! -f "$CI_LOGS/$1.rc" ]; do
    # The components step ended without marking (killed): what it makes will not come.
    kill -0 "${bg_pid[components]}" 2>/dev/null || [ -f "$CI_LOGS/$1.rc" ] || return 1
    sleep 5
  done
  return "$(cat "$CI_LOGS/$1.rc")"
}
components() {
  local rc=0
  nice -n 19 bash scripts/k8s-components.sh >"$CI_LOGS/k8s-bin" &&
    nice -n 19 bash scripts/k8s-e2e.sh --agnhost >/dev/null || rc=1
  mark components "$rc"
  [ "$rc" = 0 ] && { nice -n 19 bash scripts/k8s-e2e.sh >/dev/null || rc=1; }
  mark e2e-binary "$rc"
  # Go's build cache (about 4 GB after a cold build) serves only a rebuild after a version
  # bump; the disk is worth more to the labs. Go recreates it.
  echo "removing Go's build cache ($(du -sh "$CACHE/go/cache" 2>/dev/null | cut -f1))"
  rm -rf "$CACHE/go/cache"
  return "$rc"
}
bg_step components components

step fmt cargo fmt --all --check
build_ok=1
build() {
  cargo build --workspace --bins && cargo test --workspace --no-run
}
step build build || build_ok=0
clippy_warnings() {
  local n
  n=$(grep -c '^warning' "$CI_LOGS/build.log")
  [ "$n" = 0 ] && echo "no warnings" && return 0
  grep -A6 '^warning' "$CI_LOGS/build.log" | head -n 80
  echo "$n warnings (clippy -D warnings)"
  return 1
}
step clippy clippy_warnings

# Upstream's [sig-network] specs on a dual-stack lab cluster of their own, in the background
# from here (they need the binaries and, first, the components): most of the Kubernetes labs
# below wait on their clusters more than they compute, and the two overlap.
up_dir=$(mktemp -d /tmp/tern-ci-upstream-e2e.XXXXXX)
upstream() {
  local rc=0 t0=$SECONDS
  if ! wait_mark e2e-binary; then
    echo "not ok - upstream e2e: not run, the components failed"
    rc=1
  else
    echo "components and e2e.test ready after $((SECONDS - t0))s of waiting"
    # At nice 10, the cluster and its pods too: the Kubernetes lab tests beside it keep the
    # cores first and end sooner; the specs take what they leave, and after them the idle
    # time of the plain tests (docs/benchmarks.md, "CI run time").
    # On a dual-stack cluster (issue 22): the NetworkPolicy and Networking specs with every
    # pod holding both families, and upstream's dual-stack specs ([Feature:IPv6DualStack]).
    E2E_OUT=$up_dir E2E_PROCS=4 E2E_TIMEOUT=45m TERN_BIN_DIR=$BIN_DIR E2E_IP_FAMILY=dual \
      E2E_FOCUS='\[sig-network\].*(NetworkPolicy|Networking|Feature:IPv6DualStack).*' \
      nice -n 10 bash scripts/k8s-e2e.sh --run || rc=$?
  fi
  echo "$rc" >"$CI_LOGS/upstream.rc"
  return "$rc"
}
[ "$build_ok" = 1 ] && bg_step upstream upstream

test_skip_log=$(mktemp)
export TERN_TEST_SKIP_LOG=$test_skip_log
# The test targets that need the Kubernetes components: every one named *kube* (a test in
# crates/testkit checks that no other target reaches for them). On a warm run they go first,
# beside upstream's specs, and the two cores are busy all along (measured: under 5 % idle);
# the plain tests after them wait on timeouts and leave about 40 % of the cores idle for
# their 300 s. So two groups run beside the plain tests instead, each in a lane of its own:
# $beside_netpol (lab_kube_netpol, 190-290 s, which mostly waits on the probes a policy must
# drop) and $beside_more (lab_kube_etcd_tls, lab_kube_backend, lab_kube_demo: about 180 s
# alone; lab_kube_dual, a dual-stack and an IPv6-only cluster, about 110 s more, still
# within the plain tests' 300 s). Measured in docs/benchmarks.md ("CI run time").
beside_netpol=" lab_kube_netpol "
# The plain target that takes longest (netpol, the 3-node lab's truth tables: about 200 s of
# the plain tests' 300, mostly waiting on the probes a policy drops) runs in a lane of its own
# beside the others (test-netpol).
plain_lane=" netpol "
beside_more=" lab_kube_etcd_tls lab_kube_backend lab_kube_demo lab_kube_dual "
other_targets=() plain_beside=() kube_targets=() kube_beside=() kube_more=()
while read -r t; do
  if [[ $plain_lane == *" $t "* ]]; then
    plain_beside+=("--test=$t")
  elif [[ $t != *kube* ]]; then
    other_targets+=("--test=$t")
  elif [[ $beside_netpol == *" $t "* ]]; then
    kube_beside+=("--test=$t")
  elif [[ $beside_more == *" $t "* ]]; then
    kube_more+=("--test=$t")
  else
    kube_targets+=("--test=$t")
  fi
done < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
for t in sorted({t["name"] for p in m["packages"] for t in p["targets"] if t["kind"] == ["test"]}):
    print(t)')
cargo_tests() {
  cargo test --workspace --no-fail-fast "$@"
}
rust_tests() {
  local rc=0
  cargo_tests --lib --bins "${other_targets[@]}" || rc=1
  cargo_tests --doc || rc=1
  return "$rc"
}

e2e_run() {
  local s mode name log rc=0
  for s in tests/e2e/*.sh; do
    for mode in ref tern; do
      name="$(basename "$s" .sh)[$mode]"
      echo "=== e2e: $name"
      log=$(mktemp)
      TERN_BIN=$BIN_DIR PLUGIN=$mode bash "$s" 2>&1 | tee "$log"
      count_result "$name" "${PIPESTATUS[0]}" "$log" || rc=1
      rm -f "$log"
    done
  done
  echo "$e2e_pass $e2e_fail $e2e_skip" >"$CI_LOGS/e2e.counts"
  return "$rc"
}
# The tests that need no components: the cargo tests (test-netpol in a lane beside the
# others), then the e2e scripts.
plain_tests() {
  if [ "$build_ok" = 1 ]; then
    bg_step test-netpol cargo_tests "${plain_beside[@]}"
    step test rust_tests
    step e2e e2e_run
    read -r e2e_pass e2e_fail e2e_skip <"$CI_LOGS/e2e.counts"
    join_step test-netpol
  else
    step_done test 1 0
    echo "not ok - tests/e2e: not run, the build failed"
    e2e_fail=$((e2e_fail + 1))
  fi
}
# kube_ready: waits for the components and the agnhost image; true when they are there.
kube_ready() {
  local t0=$SECONDS
  wait_mark components || return 1
  echo "=== components ready ($((SECONDS - t0))s waited)"
  TERN_K8S_BIN=$(tail -n 1 "$CI_LOGS/k8s-bin")
  export TERN_K8S_BIN
}
# kube_tests TARGET...: those *kube* targets, once the components are there.
kube_tests() {
  if [ "$build_ok" = 1 ] && kube_ready; then
    cargo_tests "$@"
  else
    echo "not ok - the Kubernetes tests: not run (the build or the components failed)"
    return 1
  fi
}
# Components already built (a warm cache): the Kubernetes tests first, beside upstream's
# specs, which they overlap best (both mostly wait on their clusters); then the plain tests,
# with the waiting Kubernetes targets beside them. Otherwise the plain tests first, while the
# components build, then every Kubernetes target.
if [ -f "$CI_LOGS/components.rc" ]; then
  echo "=== the components are built: the Kubernetes tests first"
  step test-kube kube_tests "${kube_targets[@]}"
  bg_step test-kube-wait kube_tests "${kube_beside[@]}"
  bg_step test-kube-more kube_tests "${kube_more[@]}"
  plain_tests
  join_step test-kube-wait
  join_step test-kube-more
else
  plain_tests
  step test-kube kube_tests "${kube_targets[@]}" "${kube_beside[@]}" "${kube_more[@]}"
fi

join_step components
# Upstream's specs: a line per spec (the failures with their messages), each one check.
if [ "$build_ok" = 1 ]; then
  join_step upstream
  count_result "k8s-upstream-e2e[sig-network]" "$(cat "$CI_LOGS/upstream.rc" 2>/dev/null || echo 1)" \
    "$CI_LOGS/upstream.log"
  # Kept for inspection (report.json, e2e.log, the lab's logs) only when something failed.
  if grep -qE '^# result: passed=[1-9][0-9]* failed=0 ' "$CI_LOGS/upstream.log"; then
    rm -rf "$up_dir"
  else
    echo "upstream e2e results kept in $up_dir"
  fi
else
  echo "not ok - upstream e2e: not run (the build failed)"
  e2e_fail=$((e2e_fail + 1))
fi

summary
disk_report "$REPO" "$CACHE" /tmp
[ "${#failed_steps[@]}" -eq 0 ] && rm -rf "$CI_LOGS"
echo "skipped e2e checks: $e2e_skip"
kernel_skips=$(grep -c '^SKIP (kernel limit) ' "$test_skip_log" || true)
echo "skipped tests (kernel limits): ${kernel_skips:-0}"
grep '^SKIP (kernel limit) ' "$test_skip_log" | sed 's/^/  /'
rm -f "$test_skip_log"
echo "e2e: $e2e_pass passed, $e2e_fail failed"
[ "${#failed_steps[@]}" -eq 0 ] && [ "$e2e_fail" -eq 0 ]
