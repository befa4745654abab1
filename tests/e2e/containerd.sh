#!/usr/bin/env bash
# e2e "A real runtime drives it": containerd 1.6's `ctr run --rm --cni` runs two busybox containers
# on the node's pod network; B reaches A's httpd over TCP; after both exit nothing is left behind.
#
#   PLUGIN=ref  Debian's ptp + host-local (+ bandwidth, portmap): proves the harness itself.
#   PLUGIN=tern ternctl install-cni + ternd on a temp sqlite store; also checks via ternctl that no
#               allocation or WorkloadEndpoint remains.
# Runs entirely inside `unshare --mount --net --fork`; the machine's namespaces and files are untouched.
set -uo pipefail
E2E_NAME=containerd
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
enter_private_node "${BASH_SOURCE[0]}" "$@"
exec </dev/null

NS=e2e
IMAGE=docker.io/library/rt-busybox:latest
T=$(mktemp -d /tmp/tern-e2e-containerd.XXXXXX)
CTRD_PID=
A_PID=
B_PID=

ctr_() { ctr --address "$T/ctrd/containerd.sock" --namespace "$NS" "$@"; }

cleanup() {
  local id p
  set +e
  if [ -n "$CTRD_PID" ]; then
    for id in e2e-a e2e-b; do
      ctr_ task kill -s KILL "$id" >/dev/null 2>&1
    done
  fi
  for p in $A_PID $B_PID; do
    # The ctr clients exit once their task is gone; give them time to run the CNI DEL.
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
  if [ -n "$CTRD_PID" ]; then
    for id in e2e-a e2e-b; do
      ctr_ task delete -f "$id" >/dev/null 2>&1
      ctr_ container delete "$id" >/dev/null 2>&1
    done
    # Shims are daemonised by containerd: end them by the PIDs containerd recorded.
    for p in $(cat "$T"/ctrd/state/io.containerd.runtime.v2.task/*/*/shim.pid 2>/dev/null); do
      kill "$p" 2>/dev/null
    done
    kill "$CTRD_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$CTRD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$CTRD_PID" 2>/dev/null; wait "$CTRD_PID" 2>/dev/null
  fi
  stop_ternd
  unmount_below "$T"
  rm -rf "$T"
}
begin_node
mkdir -p /opt/cni/bin

# --- network configuration -----------------------------------------------------------------------
if [ "$PLUGIN" = ref ]; then
  POOL_RE='^10\.99\.0\.'
  cat >/etc/cni/net.d/10-e2e-ref.conflist <<JSON
{
  "cniVersion": "1.0.0",
  "name": "e2e-ref",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/24"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
  ]
}
JSON
  ok "ref conflist written (ptp + host-local + bandwidth + portmap)"
else
  POOL_RE='^10\.244\.'
  for b in tern tern-ipam ternd ternctl; do
    [ -x "$TERN_BIN/$b" ] || { not_ok "binary $TERN_BIN/$b exists (run cargo build --workspace --bins)"; finish; }
  done
  start_ternd_checked "$T" || finish
  check "ternctl install-cni copies the plugins and writes the conflist" \
    "$TERN_BIN/ternctl" install-cni --bin-dir /opt/cni/bin --conf-dir /etc/cni/net.d --agent-socket "$TERN_SOCK" || finish
  check "install-cni put tern and tern-ipam into the bin dir" test -x /opt/cni/bin/tern -a -x /opt/cni/bin/tern-ipam
  mkdir -p "$T/cnilog"
  check "install-cni conflist chains tern/tern-ipam + bandwidth + portmap; Calico-shaped conflist built" \
    python3 "$E2E_LIB/tern_conflist.py" /etc/cni/net.d/10-tern.conflist "$TERN_SOCK" \
      "$TERN_STATE" "$T/cnilog" "$T/10-tern.conflist" || finish
  # containerd 1.6 reads only the first file of the directory: leave exactly ours there.
  rm -f /etc/cni/net.d/*
  cp "$T/10-tern.conflist" /etc/cni/net.d/10-tern.conflist
fi

# --- containerd ----------------------------------------------------------------------------------
mkdir -p "$T/ctrd/root" "$T/ctrd/state"
cat >"$T/ctrd/config.toml" <<TOML
version = 2
root = "$T/ctrd/root"
state = "$T/ctrd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$T/ctrd/containerd.sock"
[ttrpc]
  address = "$T/ctrd/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$T/ctrd/opt"
TOML
containerd --config "$T/ctrd/config.toml" >"$T/containerd.log" 2>&1 &
CTRD_PID=$!
up=0
for _ in $(seq 1 100); do
  if ctr_ version >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$CTRD_PID" 2>/dev/null || break
  sleep 0.1
done
if [ "$up" = 1 ]; then ok "containerd started with private root/state/socket"; else
  not_ok "containerd started with private root/state/socket"; tail -20 "$T/containerd.log" | sed 's/^/#   /'; finish
fi

check "busybox image built" python3 "$REPO/scripts/k8s/oci_image.py" busybox /bin/busybox "$T/busybox.tar" rt-busybox:latest || finish
check "busybox image imported" ctr_ images import "$T/busybox.tar" || finish

# --- container A: httpd server -------------------------------------------------------------------
ctr_ run --rm --cni "$IMAGE" e2e-a sh -c \
  'ip -4 -o addr show dev eth0; echo pong-from-a > /var/www/index.html; exec httpd -f -p 80 -h /var/www' \
  >"$T/a.out" 2>&1 &
A_PID=$!
A_IP=
for _ in $(seq 1 150); do
  A_IP=$(sed -nE 's/.* inet ([0-9.]+)\/.*/\1/p' "$T/a.out" | head -1)
  [ -n "$A_IP" ] && break
  kill -0 "$A_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -n "$A_IP" ] && [[ "$A_IP" =~ $POOL_RE ]]; then ok "container A sees its eth0 address $A_IP"; else
  not_ok "container A sees its eth0 address from the pool (got '${A_IP}')"; sed 's/^/#   /' "$T/a.out"
  tail -20 "$T/containerd.log" | sed 's/^/#   containerd: /'; finish
fi
if [ "$PLUGIN" = tern ]; then
  check "host veth tern* exists while A runs" bash -c "ip -o link show | grep -qE '^[0-9]+: tern'"
  check "A's allocation is listed by ternctl ipam show" ip_allocated "$A_IP"
fi
# httpd needs a moment to bind after printing the address (on a loaded machine more than a
# moment): B tries for up to ~10 s.
sleep 0.5

# --- container B: client -------------------------------------------------------------------------
timeout 60 ctr --address "$T/ctrd/containerd.sock" --namespace "$NS" run --rm --cni "$IMAGE" e2e-b sh -c \
  "ip -4 -o addr show dev eth0; for i in 1 2 3 4 5 6 7 8 9 10; do printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 5 $A_IP 80 | grep . && break; sleep 0.5; done" \
  >"$T/b.out" 2>&1 &
B_PID=$!
wait "$B_PID"; b_rc=$?; B_PID=
B_IP=$(sed -nE 's/.* inet ([0-9.]+)\/.*/\1/p' "$T/b.out" | head -1)
if [ -n "$B_IP" ] && [[ "$B_IP" =~ $POOL_RE ]] && [ "$B_IP" != "$A_IP" ]; then
  ok "container B sees its own eth0 address $B_IP"
else
  not_ok "container B sees its own eth0 address (got '${B_IP}', A has $A_IP)"; sed 's/^/#   /' "$T/b.out"
fi
if grep -q pong-from-a "$T/b.out"; then ok "B reached A's httpd at $A_IP:80 (exit $b_rc)"; else
  not_ok "B reached A's httpd at $A_IP:80 (ctr exit $b_rc)"; sed 's/^/#   /' "$T/b.out"
fi

# --- A exits; both --rm runs tear down through CNI DEL (with an empty CNI_NETNS) ------------------
ctr_ task kill -s KILL e2e-a >/dev/null 2>&1
a_done=0
for _ in $(seq 1 150); do kill -0 "$A_PID" 2>/dev/null || { a_done=1; break; }; sleep 0.1; done
if [ "$a_done" = 1 ]; then wait "$A_PID"; A_PID=; ok "container A's ctr run --rm finished after kill"; else
  not_ok "container A's ctr run --rm finished after kill"
fi
check "containers removed" bash -c "[ -z \"\$(ctr --address '$T/ctrd/containerd.sock' --namespace $NS containers list -q)\" ]"
check "no pod veth remains in the node namespace" no_leftover_links
if [ "$PLUGIN" = tern ]; then
  check "no tern allocation or WorkloadEndpoint remains (ternctl)" tern_no_leftovers "$A_IP" "$B_IP"
else
  check "host-local released both addresses" bash -c "! ls /var/lib/cni/networks/e2e-ref 2>/dev/null | grep -qE '^10\\.99\\.'"
fi
check "libcni result cache emptied" bash -c "[ -z \"\$(ls /var/lib/cni/results 2>/dev/null)\" ]"
finish
