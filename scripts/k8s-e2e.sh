#!/usr/bin/env bash
# Build the upstream Kubernetes e2e test binary for the network specs, the ginkgo CLI and the
# agnhost image the specs run, into the same cache as scripts/k8s-components.sh
# (/var/cache/tern/k8s/<version>/). Idempotent: each artefact is rebuilt only when its recipe
# changed, so a warm run takes seconds. The last line printed is the bin directory.
#
# - e2e.test: `go test -c` of a small suite package of ours (written below) that is
#   k8s.io/kubernetes/test/e2e's e2e_test.go with only the network test sources imported
#   (test/e2e/network, which brings test/e2e/network/netpol, and test/e2e/common, which holds
#   "[sig-network] Networking Granular Checks"). It runs upstream's RunE2ETests, framework and
#   specs unchanged; what is left out are the other SIGs' specs (storage, apps, node, ...), which
#   would triple the build on 2 cores and are focused out anyway. The module recipe is
#   k8s-components.sh's: a throwaway module requiring k8s.io/kubernetes with every k8s.io/*
#   staging module (read from k8s.io/kubernetes's own go.mod) pinned to its release.
# - ginkgo: github.com/onsi/ginkgo/v2/ginkgo at the version the suite links (only needed for
#   parallel runs; `e2e.test` alone runs the specs serially).
# - agnhost image: k8s.io/kubernetes/test/images/agnhost (static, CGO_ENABLED=0) packed with
#   Debian's busybox-static (sh, wget, ... that specs run inside agnhost containers; upstream
#   bases it on alpine, which we cannot pull) and the machine's curl and netcat-openbsd (with
#   their shared libraries) as an OCI tarball tagged exactly as
#   test/utils/image/manifest.go names it (registry.k8s.io/e2e-test-images/agnhost:<version>),
#   so the lab imports it and the specs never pull. /agnhost is the entrypoint, `pause` the cmd.
#
# `bash scripts/k8s-e2e.sh --agnhost` builds only the agnhost image (and the module it needs),
# first, so that the Kubernetes lab tests, which run their pods on it, need not wait for
# e2e.test.
#
# `bash scripts/k8s-e2e.sh --run` then also runs the specs on a lab cluster of its own: it
# builds the above, brings up `ternctl lab up --nodes ${E2E_NODES:-2} --kubernetes` under a
# unique name (tern installed as its DaemonSet, agnhost imported on every node), runs
# e2e.test (through ginkgo with E2E_PROCS > 1) with the focus and skip below, prints one line
# per spec that ran (`ok - ...`, `not ok - ...` with the failure's message, `skip - ...` with
# the reason) and then `# result: passed=N failed=N skipped=N` (the format of tests/e2e/, which
# scripts/test.sh counts; specs not focused are not counted), and takes the lab down (also on
# failure, Ctrl-C or SIGTERM). Exit status: e2e.test's. Results: $E2E_OUT (default
# /tmp/tern-e2e-<lab>): report.json (ginkgo), junit, e2e.log, lab-up.log, lab-down.log.
#
# Environment: TERN_K8S_CACHE (default /var/cache/tern); for --run: TERN_BIN_DIR (the
# workspace's binaries, default <repo>/target/debug), E2E_FOCUS, E2E_SKIP, E2E_PROCS
# (default 1), E2E_NODES, E2E_OUT, E2E_TIMEOUT (ginkgo's suite timeout, default 90m),
# E2E_IP_FAMILY (the lab's --ip-family: ipv4, the default, dual or ipv6; the dual-stack specs
# run with E2E_IP_FAMILY=dual E2E_FOCUS='\[Feature:IPv6DualStack\]').
set -euo pipefail
RUN=0
AGNHOST_ONLY=0
case "${1:-}" in
  --run) RUN=1 ;;
  --agnhost) AGNHOST_ONLY=1 ;;
  "") ;;
  *) echo "usage: $0 [--run | --agnhost]" >&2; exit 2 ;;
esac

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

LOG_TAG=k8s-e2e
# shellcheck source=k8s/go-env.sh
. "$REPO_DIR/scripts/k8s/go-env.sh"

KMOD="$GOMODCACHE/k8s.io/kubernetes@$K8S_VERSION"
if [ ! -f "$KMOD/go.mod" ]; then
  log "go mod download k8s.io/kubernetes@$K8S_VERSION"
  mkdir -p "$SRC/k8s-dl"
  [ -f "$SRC/k8s-dl/go.mod" ] || printf 'module tern.local/k8s-dl\n\ngo 1.24.0\n' >"$SRC/k8s-dl/go.mod"
  (cd "$SRC/k8s-dl" && go mod download k8s.io/kubernetes@"$K8S_VERSION")
fi

# The agnhost tag the e2e framework asks for (configs[Agnhost] in manifest.go).
AGNHOST_VERSION=$(sed -n 's/.*configs\[Agnhost\] = Config{list.PromoterE2eRegistry, "agnhost", "\([^"]*\)"}.*/\1/p' \
  "$KMOD/test/utils/image/manifest.go")
[ -n "$AGNHOST_VERSION" ] || die "agnhost version not found in $KMOD/test/utils/image/manifest.go"
AGNHOST_TAG="registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION"
GINKGO_VERSION=$(sed -n 's#^[[:space:]]*github.com/onsi/ginkgo/v2 \(v[^ ]*\)$#\1#p' "$KMOD/go.mod")
[ -n "$GINKGO_VERSION" ] || die "ginkgo version not found in $KMOD/go.mod"

# ---------------------------------------------------------------- the module
DIR="$SRC/e2e"
staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$KMOD/go.mod")
[ -n "$staging" ] || die "no staging replace directives found in $KMOD/go.mod"
GOMOD="module tern.local/k8s-e2e

go 1.24.0

require (
	k8s.io/kubernetes $K8S_VERSION
	github.com/onsi/ginkgo/v2 $GINKGO_VERSION
)

replace ("
for m in $staging; do GOMOD+="
	$m => $m $STAGING_VERSION"; done
GOMOD+="
)"

# The suite: upstream e2e_test.go's TestMain and TestE2E, network sources only.
SUITE='package netsuite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	_ "k8s.io/kubernetes/test/e2e/feature"

	// Test sources: the network SIG only.
	_ "k8s.io/kubernetes/test/e2e/common"
	_ "k8s.io/kubernetes/test/e2e/network"

	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	var versionFlag bool
	flag.CommandLine.BoolVar(&versionFlag, "version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s", flag.CommandLine.Args())
		os.Exit(1)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
'
TOOLS='//go:build tools

// Package tools pins the main packages this throwaway module builds.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
'
want=$(printf '%s\n%s\n%s\n' "$GOMOD" "$SUITE" "$TOOLS" | sha256sum | cut -c1-16)
mkdir -p "$DIR/netsuite"
if ! { [ -f "$DIR/.recipe" ] && [ "$(cat "$DIR/.recipe")" = "$want" ] && [ -f "$DIR/go.sum" ]; }; then
  log "resolving modules (go mod tidy) ..."
  printf '%s\n' "$GOMOD" >"$DIR/go.mod"
  printf '%s' "$SUITE" >"$DIR/netsuite/netsuite_test.go"
  printf '%s' "$TOOLS" >"$DIR/tools.go"
  rm -f "$DIR/go.sum"
  (cd "$DIR" && go mod tidy)
  printf '%s' "$want" >"$DIR/.recipe"
fi
MODHASH=$(sha256sum "$DIR/go.mod" | cut -c1-16)

major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
LD=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  LD+=" -X $p.gitCommit=module-$K8S_VERSION -X $p.gitTreeState=clean -X $p.buildDate=$K8S_BUILD_DATE"
done

# ---------------------------------------------------------------- agnhost
recipe="agnhost|$AGNHOST_TAG|$GO_VERSION|$MODHASH"
if up_to_date agnhost "$recipe"; then
  log "agnhost: up to date"
else
  start=$SECONDS
  (cd "$DIR" && nice -n 10 go build -trimpath -ldflags "-s -w $LD" -o "$BIN/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost)
  mv -f "$BIN/agnhost.tmp" "$BIN/agnhost"
  mark agnhost "$recipe"
  log "agnhost: built in $((SECONDS - start)) s"
fi
bb=/bin/busybox
[ -x "$bb" ] || die "$bb not found (Debian package busybox-static; scripts/deps.sh installs it)"
# The specs exec `curl` and netcat-openbsd's `nc -w 1 -u` in agnhost containers; busybox has
# neither (its nc has no -u). The machine's own binaries go in, with their libraries, and
# bash is /bin/sh: Debian's busybox ash runs its applets (its nc) before looking at PATH.
extras=()
for spec in /usr/bin/curl:/usr/bin/curl /bin/nc.openbsd:/usr/bin/nc /usr/bin/bash:/bin/sh \
  /usr/bin/bash:/bin/bash; do
  if [ -x "${spec%%:*}" ]; then
    extras+=("$spec")
  else
    log "warning: ${spec%%:*} not found (Debian packages curl, netcat-openbsd, bash): the Networking specs that exec it will fail"
  fi
done
img_recipe="$recipe|$(sha256sum "$BIN/agnhost" "$bb" "$REPO_DIR/scripts/k8s/oci_image.py" "${extras[@]%%:*}" | cut -c1-16 | tr '\n' ' ')"
if [ -f "$IMAGES/agnhost.tar" ] && [ -f "$IMAGES/.agnhost.recipe" ] &&
  [ "$(cat "$IMAGES/.agnhost.recipe")" = "$img_recipe" ]; then
  log "agnhost image: up to date"
else
  python3 "$REPO_DIR/scripts/k8s/oci_image.py" agnhost "$BIN/agnhost" "$bb" "$IMAGES/agnhost.tar.tmp" "$AGNHOST_TAG" \
    "${extras[@]}" >/dev/null
  mv -f "$IMAGES/agnhost.tar.tmp" "$IMAGES/agnhost.tar"
  printf '%s' "$img_recipe" >"$IMAGES/.agnhost.recipe"
  log "agnhost image: $IMAGES/agnhost.tar ($AGNHOST_TAG)"
fi
# `--agnhost`: only the image (what the Kubernetes lab tests need), not the e2e binary.
[ "$AGNHOST_ONLY" = 1 ] && { echo "$BIN"; exit 0; }

# ---------------------------------------------------------------- e2e.test
recipe="netsuite|$LD|$GO_VERSION|$want|$MODHASH"
if up_to_date e2e.test "$recipe"; then
  log "e2e.test: up to date"
else
  log "e2e.test: go test -c (network suite) ..."
  # -vet=off: `go test` vets every package it compiles (1,866 vet runs, 2 CPU-minutes on a
  # cold build, measured with process accounting): upstream's code, not ours.
  start=$SECONDS
  (cd "$DIR" && nice -n 10 go test -c -vet=off -trimpath -ldflags "-s -w $LD" -o "$BIN/e2e.test.tmp" ./netsuite)
  mv -f "$BIN/e2e.test.tmp" "$BIN/e2e.test"
  mark e2e.test "$recipe"
  log "e2e.test: built in $((SECONDS - start)) s ($(du -h "$BIN/e2e.test" | cut -f1))"
fi

# ---------------------------------------------------------------- ginkgo
recipe="github.com/onsi/ginkgo/v2/ginkgo@$GINKGO_VERSION|$GO_VERSION|$MODHASH"
if up_to_date ginkgo "$recipe"; then
  log "ginkgo: up to date"
else
  start=$SECONDS
  (cd "$DIR" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$BIN/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo)
  mv -f "$BIN/ginkgo.tmp" "$BIN/ginkgo"
  mark ginkgo "$recipe"
  log "ginkgo: built in $((SECONDS - start)) s"
fi

[ "$RUN" = 1 ] || { echo "$BIN"; exit 0; }

# ---------------------------------------------------------------- --run
# The specs that cannot run in the lab, and why:
# - SCTP / Feature:SCTPConnectivity: this kernel has no sctp module.
# - Feature:Networking-IPv4/IPv6/DNS ("should provide Internet connection"): need the internet
#   (and CoreDNS, which the lab does not deploy) - the lab never routes out of its namespaces.
# - Feature:Networking-Performance (iperf2): needs iperf in agnhost (alpine's), not packed.
# - Disruptive, Serial, Slow: need SSH to the nodes / the whole cluster / long timeouts.
FOCUS=${E2E_FOCUS:-'\[sig-network\].*(NetworkPolicy|Networking).*'}
SKIP=${E2E_SKIP:-'SCTP|Feature:Networking-IPv4|Feature:Networking-IPv6|Feature:Networking-DNS|Feature:Networking-Performance|Disruptive|Serial|Slow'}
PROCS=${E2E_PROCS:-1}
BIN_DIR=${TERN_BIN_DIR:-$REPO_DIR/target/debug}
[ -x "$BIN_DIR/ternctl" ] || die "$BIN_DIR/ternctl not found (cargo build --bins, or set TERN_BIN_DIR)"
[ "$(id -u)" = 0 ] || die "--run needs root (the lab's namespaces, cgroups, mounts)"
LAB="e2e$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
OUT=${E2E_OUT:-/tmp/tern-e2e-$LAB}
mkdir -p "$OUT"
# e2e.test (or ginkgo and its e2e.test processes) runs in a session of its own, in the
# background, so that a signal to this script is handled at once (bash runs traps only between
# foreground commands) and stops the whole group before the lab goes down.
child=""
stop_child() {
  [ -n "$child" ] && kill -0 "$child" 2>/dev/null || return 0
  kill -TERM -- "-$child" 2>/dev/null
  for _ in $(seq 20); do kill -0 "$child" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- "-$child" 2>/dev/null || true
}
down() {
  "$BIN_DIR/ternctl" lab --name "$LAB" --bin-dir "$BIN_DIR" down >"$OUT/lab-down.log" 2>&1 && return 0
  log "lab down failed: see $OUT/lab-down.log, which ends:"
  tail -n 8 "$OUT/lab-down.log" | sed 's/^/    /' >&2
}
trap 'stop_child; down' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
log "lab $LAB: up --nodes ${E2E_NODES:-2} --kubernetes --ip-family ${E2E_IP_FAMILY:-ipv4} ..."
start=$SECONDS
env -u TERN_STORE "$BIN_DIR/ternctl" lab --name "$LAB" --bin-dir "$BIN_DIR" up --nodes "${E2E_NODES:-2}" \
  --kubernetes --ip-family "${E2E_IP_FAMILY:-ipv4}" --k8s-bin-dir "$BIN" >"$OUT/lab-up.log" 2>&1 ||
  { cat "$OUT/lab-up.log" >&2; die "lab up failed"; }
KUBECONFIG=$(sed -n 's/^export KUBECONFIG=//p' "$OUT/lab-up.log" | tail -1)
[ -f "$KUBECONFIG" ] || die "no kubeconfig in $OUT/lab-up.log"
log "lab $LAB up in $((SECONDS - start)) s; e2e.test (procs $PROCS) ..."
args=(--provider=local --kubeconfig="$KUBECONFIG" --kubectl-path="$BIN/kubectl"
  --num-nodes="${E2E_NODES:-2}" --report-dir="$OUT" --disable-log-dump --minStartupPods=0
  --ginkgo.focus="$FOCUS" --ginkgo.skip="$SKIP" --ginkgo.timeout="${E2E_TIMEOUT:-90m}"
  --ginkgo.json-report="$OUT/report.json")
start=$SECONDS
rc=0
if [ "$PROCS" -gt 1 ]; then
  # ginkgo's own flags go before the binary, without the ginkgo. prefix.
  gargs=()
  for a in "${args[@]}"; do case $a in --ginkgo.*) gargs+=("--${a#--ginkgo.}") ;; esac; done
  targs=()
  for a in "${args[@]}"; do case $a in --ginkgo.*) ;; *) targs+=("$a") ;; esac; done
  cmd=("$BIN/ginkgo" --procs="$PROCS" "${gargs[@]}" "$BIN/e2e.test" -- "${targs[@]}")
else
  cmd=("$BIN/e2e.test" "${args[@]}")
fi
PATH="$BIN:$PATH" setsid -w "${cmd[@]}" >"$OUT/e2e.log" 2>&1 &
child=$!
wait "$child" || rc=$?
child=""
log "e2e.test exited $rc after $((SECONDS - start)) s"
if [ "$rc" != 0 ] && ! [ -s "$OUT/report.json" ]; then
  # No report to read the failures from: what e2e.test (or ginkgo) printed last, and the disk.
  log "no report.json; $OUT/e2e.log ends:"
  tail -n 40 "$OUT/e2e.log" | cut -c1-300 | sed 's/^/    /' >&2
  df -h "$OUT" "$CACHE_ROOT" >&2 || true
fi
# One line per spec that ran, and the counts (a missing or unreadable report is one failure).
python3 - "$OUT/report.json" <<'PY' || true
import json, sys
FAILED = {"failed", "panicked", "timedout", "interrupted", "aborted"}
passed = failed = skipped = unfocused = 0
try:
    suites = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"not ok - upstream e2e: no report ({e})")
    print("# result: passed=0 failed=1 skipped=0")
    sys.exit(0)
for suite in suites:
    for s in suite.get("SpecReports") or []:
        if s.get("LeafNodeType") != "It":
            continue
        state = s["State"]
        msg = (s.get("Failure") or {}).get("Message", "").strip()
        if state == "skipped" and not msg:
            unfocused += 1  # not focused, or skipped by --ginkgo.skip
            continue
        name = " ".join(s["ContainerHierarchyTexts"] + [s["LeafNodeText"]])
        secs = s.get("RunTime", 0) / 1e9
        first = msg.splitlines()[0][:300] if msg else ""
        if state == "passed":
            passed += 1
            print(f"ok - {name} ({secs:.0f}s)")
        elif state in FAILED:
            failed += 1
            print(f"not ok - {name} ({state}, {secs:.0f}s)")
            for line in msg.splitlines()[:12]:
                print("#     " + line[:300])
        else:
            skipped += 1
            print(f"skip - {name}: {first}")
print(f"# upstream e2e: {passed + failed + skipped} specs ran or were skipped at run time, "
      f"{unfocused} not focused")
print(f"# result: passed={passed} failed={failed} skipped={skipped}")
PY
echo "$OUT"
exit "$rc"
