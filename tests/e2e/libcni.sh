#!/usr/bin/env bash
# e2e: a runtime built on libcni 1.1.2 (rtcni, the library containerd and CRI-O use) drives the
# plugin chain through ADD / CHECK / DEL for cniVersion 0.3.1, 0.4.0 and 1.0.0, checking each
# result's shape and the lifecycle rules (duplicate ADD fails, DEL is idempotent, DEL with an empty
# CNI_NETNS releases everything). cniVersion 1.1.0 (CHECK, GC, STATUS) is tested by executing the
# plugin directly as the spec describes, because libcni 1.1.2 stops at 1.0.0.
#
#   PLUGIN=ref  Debian's ptp + host-local (+ bandwidth, portmap); the 1.1.0 part is skipped (the
#               reference plugins stop at 1.0.0).
#   PLUGIN=tern tern + tern-ipam (+ bandwidth, portmap) against ternd on a temp sqlite store.
# Runs entirely inside `unshare --mount --net --fork`; the machine's namespaces and files are untouched.
set -uo pipefail
E2E_NAME=libcni
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
enter_private_node "${BASH_SOURCE[0]}" "$@"
exec </dev/null

T=$(mktemp -d /tmp/tern-e2e-libcni.XXXXXX)
NETNAMES=()
cleanup() {
  set +e
  local n
  for n in "${NETNAMES[@]}"; do ip netns del "$n" 2>/dev/null; done
  stop_ternd
  unmount_below "$T"
  rm -rf "$T"
}
begin_node
HOSTLOCAL_DIR="$T/host-local"
NET=e2e-libcni

check "rtcni built from Debian's libcni" "$REPO/tests/e2e/rtcni/build.sh" "$T/rtcni" || finish
RTCNI="$T/rtcni"

if [ "$PLUGIN" = tern ]; then
  for b in tern tern-ipam ternd ternctl; do
    [ -x "$TERN_BIN/$b" ] || { not_ok "binary $TERN_BIN/$b exists (run cargo build --workspace --bins)"; finish; }
  done
  mkdir -p "$T/bin"
  cp "$TERN_BIN/tern" "$TERN_BIN/tern-ipam" "$T/bin/"
  export CNI_PATH="$T/bin:$REF_BIN"
  start_ternd_checked "$T" || finish
  POOL_RE='^10\.244\.'
else
  export CNI_PATH="$REF_BIN"
  POOL_RE='^10\.98\.0\.'
fi

# main_plugin_json: the first plugin of the chain (the one under test), without cniVersion/name.
main_plugin_json() {
  if [ "$PLUGIN" = tern ]; then
    printf '{"type": "tern", "agent_socket": "%s", "state_dir": "%s", "ipam": {"type": "tern-ipam"}}' \
      "$TERN_SOCK" "$TERN_STATE"
  else
    printf '{"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "dataDir": "%s", "ranges": [[{"subnet": "10.98.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}' \
      "$HOSTLOCAL_DIR"
  fi
}
# write_conflist VERSION FILE
write_conflist() {
  cat >"$2" <<JSON
{
  "cniVersion": "$1",
  "name": "$NET",
  "plugins": [
    $(main_plugin_json),
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
  ]
}
JSON
}
new_netns() { ip netns add "$1" && NETNAMES+=("$1") && ip -n "$1" link set lo up; }
del_netns() { ip netns del "$1"; }
# Capability args as a kubelet would pass them: bandwidth limits exercise runtimeConfig filtering,
# make the bandwidth plugin find the host veth in the chained result, and avoid the nil-pointer
# panic Debian's bandwidth 1.1.1 has on CHECK when no limits are configured. No portMappings:
# Debian's portmap 1.1.1 CHECK then insists on an IPv6 DNAT chain even for an IPv4-only result.
CAP='{"bandwidth": {"ingressRate": 100000000, "ingressBurst": 1000000, "egressRate": 100000000, "egressBurst": 1000000}}'
rt() { "$RTCNI" -cache "$T/cache" -cap "$CAP" "$@"; }
# pod_has_ip NETNS IP: the pod's eth0 carries IP.
pod_has_ip() { ip -n "$1" -4 -o addr show dev eth0 2>&1 | grep -q " inet $2/"; }
pod_has_no_eth0() { ! ip -n "$1" link show dev eth0 >/dev/null 2>&1; }
released() { ! ip_allocated "$1"; }
host_veths_gone() {
  if [ "$PLUGIN" = ref ]; then return 0; fi
  no_leftover_links
}
ALL_IPS=()

# --- libcni-driven lifecycle per spec version ----------------------------------------------------
for V in 0.3.1 0.4.0 1.0.0; do
  conf="$T/$V.conflist"; write_conflist "$V" "$conf"
  ns="pod-${V//./}"; nsp="/run/netns/$ns"; id="lib-${V//./}"
  new_netns "$ns" || { not_ok "[$V] create netns $ns"; continue; }
  out=$(rt -conf "$conf" -id "$id" -netns "$nsp" add 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    not_ok "[$V] ADD through libcni (rc=$rc)"; sed 's/^/#   /' <<<"$out"; del_netns "$ns"; continue
  fi
  ok "[$V] ADD through libcni"
  check "[$V] result shape (interfaces[0] host veth, [1] pod iface in $nsp, ips -> 1, version field rules)" \
    python3 "$E2E_LIB/jsoncheck.py" result "$V" "$nsp" <<<"$out"
  ip=$(python3 "$E2E_LIB/jsoncheck.py" pod-ip <<<"$out" 2>/dev/null); ALL_IPS+=("$ip")
  if [[ "$ip" =~ $POOL_RE ]]; then ok "[$V] address $ip comes from the pool"; else not_ok "[$V] address '$ip' comes from the pool"; fi
  check "[$V] pod eth0 carries $ip" pod_has_ip "$ns" "$ip"
  check "[$V] IPAM holds $ip" ip_allocated "$ip"
  hif=$(python3 "$E2E_LIB/jsoncheck.py" host-if <<<"$out" 2>/dev/null)
  check "[$V] chained bandwidth shaped host veth '$hif' (tbf qdisc)" bash -c "tc qdisc show dev '$hif' | grep -q tbf"
  if [ "$V" = 0.3.1 ]; then
    out=$(rt -conf "$conf" -id "$id" -netns "$nsp" check 2>&1)
    if [ $? -ne 0 ] && grep -q "does not support the CHECK command" <<<"$out"; then
      ok "[$V] runtime refuses CHECK below 0.4.0"
    else
      not_ok "[$V] runtime refuses CHECK below 0.4.0"; sed 's/^/#   /' <<<"$out"
    fi
  else
    check "[$V] CHECK through libcni" rt -conf "$conf" -id "$id" -netns "$nsp" check
  fi
  out=$(rt -conf "$conf" -id "$id" -netns "$nsp" add 2>&1)
  if [ $? -ne 0 ]; then ok "[$V] second ADD for the same container/ifname fails"; else
    not_ok "[$V] second ADD for the same container/ifname fails"; sed 's/^/#   /' <<<"$out"
  fi
  check "[$V] first attachment survives the rejected ADD" pod_has_ip "$ns" "$ip"
  check "[$V] DEL through libcni" rt -conf "$conf" -id "$id" -netns "$nsp" del
  check "[$V] DEL released $ip" released "$ip"
  check "[$V] DEL removed the pod's eth0" pod_has_no_eth0 "$ns"
  check "[$V] DEL removed the host veth" host_veths_gone
  check "[$V] second DEL succeeds" rt -conf "$conf" -id "$id" -netns "$nsp" del
  del_netns "$ns"
done

# --- DEL with an empty CNI_NETNS (what containerd's `ctr run --rm` sends) -------------------------
V=1.0.0; conf="$T/$V.conflist"; ns=pod-emptyns; nsp=/run/netns/$ns; id=lib-emptyns
if new_netns "$ns" && out=$(rt -conf "$conf" -id "$id" -netns "$nsp" add 2>&1); then
  ip=$(python3 "$E2E_LIB/jsoncheck.py" pod-ip <<<"$out"); ALL_IPS+=("$ip")
  ok "[empty netns] ADD $ip"
  check "[empty netns] DEL with CNI_NETNS=\"\" succeeds" rt -conf "$conf" -id "$id" -netns "" del
  check "[empty netns] DEL released $ip" released "$ip"
  if [ "$PLUGIN" = tern ]; then
    check "[empty netns] DEL removed the host veth without entering the netns" host_veths_gone
  else
    skip "[empty netns] host veth removal (ptp leaves it to the netns' destruction)"
  fi
  check "[empty netns] DEL again (netns given) succeeds" rt -conf "$conf" -id "$id" -netns "$nsp" del
else
  not_ok "[empty netns] ADD"; sed 's/^/#   /' <<<"${out:-}"
fi
del_netns "$ns" 2>/dev/null

# --- cniVersion 1.1.0 by direct execution: ADD/CHECK/DEL/GC/STATUS ---------------------------------
if [ "$PLUGIN" = ref ]; then
  skip "[1.1.0] direct ADD/CHECK/DEL/GC/STATUS (Debian's reference plugins stop at 1.0.0)"
else
  PLUG="$T/bin/tern"
  CONF110=$(printf '{"cniVersion": "1.1.0", "name": "%s", %s' "$NET" "$(main_plugin_json | sed 's/^{//')")
  # cni CMD ID NETNS STDIN: executes the plugin with a clean environment, as a runtime does.
  # Sets OUT and RC.
  cni() {
    local cmd=$1 id=$2 netns=$3 stdin=$4
    if [ "$cmd" = STATUS ] || [ "$cmd" = GC ]; then
      OUT=$(env -i PATH="$PATH" CNI_COMMAND="$cmd" CNI_PATH="$CNI_PATH" "$PLUG" <<<"$stdin" 2>"$T/stderr"); RC=$?
    else
      OUT=$(env -i PATH="$PATH" CNI_COMMAND="$cmd" CNI_CONTAINERID="$id" CNI_NETNS="$netns" \
        CNI_IFNAME=eth0 CNI_ARGS="" CNI_PATH="$CNI_PATH" "$PLUG" <<<"$stdin" 2>"$T/stderr"); RC=$?
    fi
  }
  with_prev() { python3 -c 'import json,sys; c=json.loads(sys.argv[1]); c["prevResult"]=json.loads(sys.argv[2]); print(json.dumps(c))' "$1" "$2"; }
  with_valid() { python3 -c 'import json,sys; c=json.loads(sys.argv[1]); v=[{"containerID": x, "ifname": "eth0"} for x in sys.argv[2:]]; c["cni.dev/valid-attachments"]=v; c["cni.dev/attachments"]=v; print(json.dumps(c))' "$@"; }
  expect_rc0() { if [ "$RC" -eq 0 ]; then ok "$1"; else not_ok "$1 (rc=$RC)"; sed 's/^/#   /' <<<"$OUT"; sed 's/^/#   stderr: /' "$T/stderr"; fi; }

  ns=pod-110; nsp=/run/netns/$ns; new_netns "$ns"
  cni ADD c110 "$nsp" "$CONF110"; expect_rc0 "[1.1.0] direct ADD"
  RES=$OUT
  check "[1.1.0] result shape (cniVersion 1.1.0, no ips[].version, interfaces/sandbox/index)" \
    python3 "$E2E_LIB/jsoncheck.py" result 1.1.0 "$nsp" <<<"$RES"
  ip=$(python3 "$E2E_LIB/jsoncheck.py" pod-ip <<<"$RES" 2>/dev/null); ALL_IPS+=("$ip")
  check "[1.1.0] pod eth0 carries $ip" pod_has_ip "$ns" "$ip"
  cni CHECK c110 "$nsp" "$(with_prev "$CONF110" "$RES")"; expect_rc0 "[1.1.0] direct CHECK with prevResult"
  cni ADD c110 "$nsp" "$CONF110"
  if [ "$RC" -ne 0 ] && python3 -c 'import json,sys; d=json.load(sys.stdin); assert isinstance(d.get("code"), int) and d.get("msg")' <<<"$OUT" 2>/dev/null; then
    ok "[1.1.0] second ADD for the same container/ifname fails with a JSON error"
  else
    not_ok "[1.1.0] second ADD for the same container/ifname fails with a JSON error (rc=$RC)"; sed 's/^/#   /' <<<"$OUT"
  fi
  cni DEL c110 "$nsp" "$(with_prev "$CONF110" "$RES")"; expect_rc0 "[1.1.0] direct DEL with prevResult"
  check "[1.1.0] DEL released $ip" released "$ip"
  cni DEL c110 "$nsp" "$CONF110"; expect_rc0 "[1.1.0] second DEL"
  cni DEL c110 "" "$CONF110"; expect_rc0 "[1.1.0] DEL with empty CNI_NETNS after teardown"
  del_netns "$ns"

  # GC: two attachments, only one listed as valid; the other's reservation must go.
  new_netns pod-gck; new_netns pod-gcd
  cni ADD gc-keep /run/netns/pod-gck "$CONF110"; expect_rc0 "[1.1.0] ADD gc-keep"
  ip_keep=$(python3 "$E2E_LIB/jsoncheck.py" pod-ip <<<"$OUT" 2>/dev/null)
  cni ADD gc-drop /run/netns/pod-gcd "$CONF110"; expect_rc0 "[1.1.0] ADD gc-drop"
  ip_drop=$(python3 "$E2E_LIB/jsoncheck.py" pod-ip <<<"$OUT" 2>/dev/null)
  ALL_IPS+=("$ip_keep" "$ip_drop")
  cni GC "" "" "$(with_valid "$CONF110" gc-keep)"; expect_rc0 "[1.1.0] GC with cni.dev/valid-attachments=[gc-keep]"
  check "[1.1.0] GC released the unlisted attachment's $ip_drop" released "$ip_drop"
  check "[1.1.0] GC kept the listed attachment's $ip_keep" ip_allocated "$ip_keep"
  cni DEL gc-keep /run/netns/pod-gck "$CONF110"; expect_rc0 "[1.1.0] DEL gc-keep"
  cni DEL gc-drop /run/netns/pod-gcd "$CONF110"; expect_rc0 "[1.1.0] DEL gc-drop after GC"
  del_netns pod-gck; del_netns pod-gcd

  check "no pod veth remains in the node namespace" no_leftover_links
  check "no tern allocation or WorkloadEndpoint remains (ternctl)" tern_no_leftovers "${ALL_IPS[@]}"

  cni STATUS "" "" "$CONF110"; expect_rc0 "[1.1.0] STATUS with ternd up exits 0"
  stop_ternd
  cni STATUS "" "" "$CONF110"
  if [ "$RC" -ne 0 ] && python3 "$E2E_LIB/jsoncheck.py" error 50 <<<"$OUT" >/dev/null; then
    ok "[1.1.0] STATUS with ternd stopped fails with code 50"
  else
    not_ok "[1.1.0] STATUS with ternd stopped fails with code 50 (rc=$RC)"; sed 's/^/#   /' <<<"$OUT"
  fi
fi

if [ "$PLUGIN" = ref ]; then
  check "no pod veth remains in the node namespace" no_leftover_links
  check "host-local holds no address" bash -c "! ls '$HOSTLOCAL_DIR/$NET' 2>/dev/null | grep -qE '^10\\.'"
fi
check "libcni result cache emptied" bash -c "[ -z \"\$(ls '$T/cache/results' 2>/dev/null)\" ]"
finish
