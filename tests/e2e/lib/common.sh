# Shared helpers for the e2e scripts (sourced, not executed).
#
# Every script re-executes itself inside `unshare --mount --net --fork` (see enter_private_node),
# so the machine's root network namespace and its /etc, /opt, /var/lib/cni, /run are never changed:
# the private network namespace acts as the node's host namespace.

E2E_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$E2E_LIB/../../.." && pwd)
PLUGIN=${PLUGIN:-ref}
case "$PLUGIN" in
  ref|tern) ;;
  *) echo "PLUGIN must be ref or tern, got '$PLUGIN'" >&2; exit 2 ;;
esac

TERN_BIN=${TERN_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/debug}
REF_BIN=/usr/lib/cni

PASSED=0
FAILED=0
SKIPPED=0
ok()     { PASSED=$((PASSED + 1));  echo "ok - $*"; }
not_ok() { FAILED=$((FAILED + 1));  echo "not ok - $*"; }
skip()   { SKIPPED=$((SKIPPED + 1)); echo "skip - $*"; }
# check DESCRIPTION CMD...: runs CMD, reports ok / not ok with CMD's output on failure.
check() {
  local desc=$1; shift
  local out
  if out=$("$@" 2>&1); then ok "$desc"; return 0; fi
  not_ok "$desc"
  [ -n "$out" ] && sed 's/^/#   /' <<<"$out" | head -40
  return 1
}
report_counts() {
  echo "# $E2E_NAME[$PLUGIN]: $PASSED passed, $FAILED failed, $SKIPPED skipped"
  echo "# result: passed=$PASSED failed=$FAILED skipped=$SKIPPED"
}
log() { echo "# $*"; }

# enter_private_node SCRIPT ARGS...: re-executes SCRIPT inside a private mount + network namespace.
# A private PID namespace too: if the script is killed, the kernel ends every process it started
# (ternd, containerd, shims), so nothing can outlive a run even when the EXIT trap cannot run.
enter_private_node() {
  if [ "${E2E_INSIDE:-}" = 1 ]; then return 0; fi
  if [ "$(id -u)" -ne 0 ]; then echo "$E2E_NAME: must run as root" >&2; exit 1; fi
  E2E_INSIDE=1 PLUGIN=$PLUGIN exec unshare --mount --net --pid --mount-proc --fork \
    --kill-child -- bash "$@"
}

# make_private_mounts TMP: detaches our mount namespace and puts fresh tmpfs over the runtime's
# well-known paths. A path that does not exist on the machine is created inside an overlay of its
# nearest existing parent (upper dir under TMP), so the machine's own directories are never created
# or written to.
make_private_mounts() {
  local tmp=$1 p
  mount --make-rprivate /
  # The temp dir itself becomes a tmpfs: overlay upper dirs and containerd's overlayfs snapshots
  # then work even where /tmp is itself an overlay (container CI runners).
  mount -t tmpfs -o mode=0700 tmpfs "$tmp"
  # /var/lib/tern and /run/tern are tern's defaults: private too, in case a default is used.
  for p in /etc/cni/net.d /opt /var/lib/cni /run/containerd /run/netns /var/lib/tern /run/tern; do
    private_dir "$tmp" "$p"
  done
}
OVERLAID=" "
private_dir() {
  local tmp=$1 path=$2 anc key
  if [ ! -d "$path" ]; then
    anc=$(dirname "$path")
    while [ ! -d "$anc" ]; do anc=$(dirname "$anc"); done
    if [[ "$OVERLAID" != *" $anc "* ]]; then
      key=${anc//\//_}
      mkdir -p "$tmp/ovl/$key/up" "$tmp/ovl/$key/work"
      mount -t overlay overlay -o "lowerdir=$anc,upperdir=$tmp/ovl/$key/up,workdir=$tmp/ovl/$key/work" "$anc"
      OVERLAID="$OVERLAID$anc "
    fi
    mkdir -p "$path"
  fi
  mount -t tmpfs -o mode=0755 tmpfs "$path"
}

# setup_node_netns: loopback up and a default route through a veth pair with underlay addresses,
# because the kernel has no dummy module and proxy-ARP needs a covering route on the node.
setup_node_netns() {
  ip link set lo up
  ip link add e2e-up0 type veth peer name e2e-up1
  ip addr add 198.18.0.1/24 dev e2e-up0
  ip addr add 198.18.0.2/24 dev e2e-up1
  ip link set e2e-up0 up
  ip link set e2e-up1 up
  ip route add default via 198.18.0.2 dev e2e-up0
  sysctl -qw net.ipv4.ip_forward=1
}

# Interfaces the e2e run did not create itself (pod veths left behind), one name per line.
leftover_links() {
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -vxE 'lo|e2e-up0|e2e-up1' || true
}
no_leftover_links() {
  local l; l=$(leftover_links)
  if [ -n "$l" ]; then echo "leftover interfaces: $l"; ip -o link show; return 1; fi
}

# --- tern agent -------------------------------------------------------------------------------
TERND_PID=
# start_ternd DIR: runs ternd on a fresh sqlite store in DIR and waits for its socket.
start_ternd() {
  local dir=$1
  TERN_DB="sqlite://$dir/tern.db"
  TERN_SOCK="$dir/ternd.sock"
  TERN_STATE="$dir/state"
  mkdir -p "$TERN_STATE"
  "$TERN_BIN/ternd" --node-name e2e-node --store "$TERN_DB" --socket "$TERN_SOCK" \
    --state-dir "$TERN_STATE" >"$dir/ternd.log" 2>&1 &
  TERND_PID=$!
  local i
  for i in $(seq 1 100); do
    if [ -S "$TERN_SOCK" ]; then return 0; fi
    if ! kill -0 "$TERND_PID" 2>/dev/null; then
      echo "ternd exited early:"; tail -20 "$dir/ternd.log"; TERND_PID=; return 1
    fi
    sleep 0.1
  done
  echo "ternd socket $TERN_SOCK did not appear within 10s"; tail -20 "$dir/ternd.log"; return 1
}
# start_ternd_checked DIR: start_ternd reported as one check. Not run through `check`, whose
# command substitution is a subshell that would lose TERND_PID and the TERN_* variables.
start_ternd_checked() {
  if start_ternd "$1" >"$1/ternd-start.log" 2>&1; then
    ok "ternd starts on a fresh sqlite store"
  else
    not_ok "ternd starts on a fresh sqlite store"; sed 's/^/#   /' "$1/ternd-start.log"; return 1
  fi
}
stop_ternd() {
  if [ -n "$TERND_PID" ]; then
    kill "$TERND_PID" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do kill -0 "$TERND_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$TERND_PID" 2>/dev/null || true
    wait "$TERND_PID" 2>/dev/null || true
    TERND_PID=
  fi
}
ternctl() { "$TERN_BIN/ternctl" --store "$TERN_DB" "$@"; }

# tern_no_leftovers IP...: no allocation of any IP in `ipam show` and no WorkloadEndpoint left.
tern_no_leftovers() {
  local show weps ip bad=0
  for ip in "$@"; do
    show=$(ternctl ipam show --ip "$ip" 2>&1) || { echo "ternctl ipam show --ip $ip failed: $show"; return 1; }
    if grep -q "is in use" <<<"$show"; then
      echo "allocation of $ip still held:"; echo "$show"; bad=1
    fi
  done
  weps=$(ternctl get workloadendpoint -o json 2>&1) || { echo "ternctl get workloadendpoint failed: $weps"; return 1; }
  python3 "$E2E_LIB/jsoncheck.py" empty-list <<<"$weps" || bad=1
  return $bad
}
# ip_allocated IP: whether IPAM still holds IP (tern: ipam show; ref: host-local's data dir).
ip_allocated() {
  local ip=$1
  if [ "$PLUGIN" = tern ]; then
    ternctl ipam show --ip "$ip" 2>/dev/null | grep -q "is in use"
  else
    [ -n "$(find "${HOSTLOCAL_DIR:-/var/lib/cni/networks}" -name "$ip" 2>/dev/null)" ]
  fi
}

# unmount_below DIR: lazily unmounts every mount below DIR (snapshots, ...), deepest first, so
# DIR can be removed; the tmpfs and overlay mounts over system paths vanish with the private
# mount namespace.
unmount_below() {
  grep -o " $1[^ ]* " /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
}

# finish: prints the counts and exits with the right status (cleanup runs from the EXIT trap).
finish() { report_counts; [ "$FAILED" -eq 0 ]; exit $?; }

# begin_node: what every script does once its `cleanup` and temp dir $T exist: the traps (cleanup
# on exit, also after Ctrl-C), the mode line, private mounts under $T and the node's netns.
begin_node() {
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  log "mode=$PLUGIN tmp=$T"
  make_private_mounts "$T"
  setup_node_netns
}
