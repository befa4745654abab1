# Steps, logs and counts for scripts/test.sh (sourced, not executed).
#
# A step's output goes to the console and to a log of its own under $CI_LOGS, so that the end
# of the run can repeat what made a step fail (a CI summary often shows only the last lines).
# A background step (bg_step) writes only to its log, which join_step prints when it ends.
# Every step's wall time is kept for the table `summary` prints.

CI_LOGS=$(mktemp -d /tmp/tern-ci-steps.XXXXXX)
failed_steps=()
step_times=()
declare -A bg_pid=() bg_t0=()

# step NAME CMD...: runs CMD; true when it succeeded.
step() {
  local name=$1; shift
  echo "=== step: $name"
  local t0=$SECONDS rc
  "$@" 2>&1 | tee "$CI_LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  step_done "$name" "$rc" $((SECONDS - t0))
}

# step_done NAME RC SECONDS: records the outcome of a step.
step_done() {
  step_times+=("$1 $3 $2")
  if [ "$2" = 0 ]; then
    echo "=== step ok: $1 ($3s)"
    return 0
  fi
  echo "=== step FAILED: $1 ($3s, exit $2)"
  failed_steps+=("$1")
  return 1
}

# bg_step NAME CMD...: starts CMD in the background, its output in its log only.
bg_step() {
  local name=$1; shift
  echo "=== background step: $name (log $CI_LOGS/$name.log)"
  # The step's own end time, for the table (it is joined later).
  { "$@"; local rc=$?; echo "$SECONDS" >"$CI_LOGS/$name.end"; exit "$rc"; } >"$CI_LOGS/$name.log" 2>&1 &
  bg_pid[$name]=$!
  bg_t0[$name]=$SECONDS
}

# join_step NAME: waits for a background step, prints its log; true when it succeeded.
join_step() {
  local name=$1 rc=0
  [ -n "${bg_pid[$name]:-}" ] || return 1
  echo "=== step: $name (joined; started $((SECONDS - bg_t0[$name]))s ago)"
  wait "${bg_pid[$name]}" || rc=$?
  unset "bg_pid[$name]"
  cat "$CI_LOGS/$name.log"
  local end
  end=$(cat "$CI_LOGS/$name.end" 2>/dev/null || echo "$SECONDS")
  echo "=== $name ran from ${bg_t0[$name]}s to ${end}s of the run"
  step_done "$name" "$rc" $((end - bg_t0[$name]))
}

# stop_bg: ends the background steps still running (the run was interrupted): the commands
# a step runs first (k8s-e2e.sh takes its lab down on SIGTERM), then the step.
stop_bg() {
  local n
  for n in "${!bg_pid[@]}"; do
    pkill -TERM -P "${bg_pid[$n]}" 2>/dev/null
    kill -TERM "${bg_pid[$n]}" 2>/dev/null
    wait "${bg_pid[$n]}" 2>/dev/null
  done
  return 0
}

# digest NAME: the lines of a failed step's log that say why (compile errors, failed tests and
# their panics, clippy's warnings, a full disk), at most 60.
digest() {
  grep -E -A2 '^(error(\[E[0-9]+\])?:|warning:|test .* \.\.\. FAILED$|Diff in|not ok)|panicked at|No space left|Killed' \
    "$CI_LOGS/$1.log" | grep -v '^--$' | cut -c1-300 | head -n 60
}

# disk_report DIR...: the free space where a run writes.
disk_report() {
  local d
  for d in "$@"; do
    [ -d "$d" ] || continue
    df -Pk "$d" | awk -v d="$d" 'NR == 2 { printf "disk: %s: %.1f GB free of %.1f GB\n", d, $4 / 1048576, $2 / 1048576 }'
  done
}

e2e_pass=0
e2e_fail=0
e2e_skip=0
# count_result NAME RC LOG: adds the `# result: passed=N failed=N skipped=N` line of LOG to the
# totals; no such line, or a non-zero RC with no failure reported (e.g. a cleanup error), is
# one failure.
count_result() {
  local name=$1 rc=$2 log=$3 counts p f k
  counts=$(grep -E '^# result: passed=[0-9]+ failed=[0-9]+ skipped=[0-9]+$' "$log" | tail -1)
  if [ -z "$counts" ]; then
    echo "not ok - $name exited with status $rc without reporting its counts"
    e2e_fail=$((e2e_fail + 1))
    return 1
  fi
  p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$counts")
  f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$counts")
  k=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$counts")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - $name exited with status $rc"
    f=1
  fi
  echo "=== e2e done: $name passed=$p failed=$f skipped=$k"
  e2e_pass=$((e2e_pass + p)); e2e_fail=$((e2e_fail + f)); e2e_skip=$((e2e_skip + k))
  [ "$f" -eq 0 ]
}

# summary: every step's time, then the reasons of the failed ones.
summary() {
  local s
  echo "=== steps (seconds, exit status):"
  for s in "${step_times[@]}"; do
    # shellcheck disable=SC2086
    printf '  %-16s %6ss  exit %s\n' $s
  done
  echo "  total            ${SECONDS}s"
  for s in "${failed_steps[@]}"; do
    echo "=== why $s failed (from $CI_LOGS/$s.log):"
    digest "$s"
  done
  if [ "${#failed_steps[@]}" -gt 0 ]; then
    echo "failed steps: ${failed_steps[*]}"
  fi
}
