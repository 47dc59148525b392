#!/usr/bin/env bash
# starve.sh runs one test of package node again and again inside a CPU quota
# (a cgroup), to reproduce what a loaded machine does to a cluster in one
# process: restarts that take seconds, members falsely declared dead for a
# second, one-sided failure detection. It keeps the nodes' debug log
# (FREQRING_TEST_LOG, FREQRING_NODETEST_LOG) and the test output of every failing run, and prints
# one line per run and a count at the end.
#
#   deploy/scale/starve.sh                      # 20 runs at 0.05 of a core
#   RUNS=60 QUOTA=0.06 deploy/scale/starve.sh
#
# Environment (all optional):
#   TEST=TestRulesChangeRollsThrough   the test (a -run pattern, anchored)
#   RUNS=20        runs, one process each
#   QUOTA=0.05     the share of one core the test process gets (0.05 to 1)
#   RACE=0         1: build with -race
#   MAX_SECONDS=1800  stop starting runs after this long
#   WORK=DIR       where the binary, logs and summary go (default: a new
#                  directory under /tmp)
#
# It needs root (it creates and removes a cgroup: v1 cpu controller at
# /sys/fs/cgroup/cpu, or v2 cpu.max) and Go. Several copies may run at once,
# each in its own cgroup. Each run is bounded by a 240 s timeout.
set -euo pipefail

test="${TEST:-TestRulesChangeRollsThrough}"
runs="${RUNS:-20}"
quota="${QUOTA:-0.05}"
max_seconds="${MAX_SECONDS:-1800}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${WORK:-$(mktemp -d /tmp/freqring-starve.XXXXXX)}"
mkdir -p "$work"

if [[ $EUID -ne 0 ]]; then
  echo "starve.sh: needs root to create a cgroup" >&2
  exit 2
fi
period=100000
quota_us=$(awk -v q="$quota" -v p="$period" 'BEGIN { if (q <= 0 || q > 1) exit 1; printf "%d", q * p }') || {
  echo "starve.sh: QUOTA=$quota is not in (0, 1]" >&2
  exit 2
}

name="freqring-starve-$$"
if [[ -d /sys/fs/cgroup/cpu ]]; then # v1
  cg=/sys/fs/cgroup/cpu/$name
  mkdir "$cg"
  echo "$period" >"$cg/cpu.cfs_period_us"
  echo "$quota_us" >"$cg/cpu.cfs_quota_us"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then # v2
  cg=/sys/fs/cgroup/$name
  mkdir "$cg"
  echo "$quota_us $period" >"$cg/cpu.max"
else
  echo "starve.sh: no cgroup cpu controller found under /sys/fs/cgroup" >&2
  exit 2
fi
cleanup() { rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT

bin="$work/node.test"
race=()
[[ "${RACE:-0}" == 1 ]] && race=(-race)
(cd "$root" && go test -c "${race[@]}" -o "$bin" ./node)

summary="$work/summary.txt"
start=$(date +%s)
failed=0
done_runs=0
for i in $(seq 1 "$runs"); do
  (($(date +%s) - start > max_seconds)) && break
  log="$work/run-$i.log"
  out="$work/run-$i.out"
  t0=$(date +%s)
  set +e
  (
    echo "$BASHPID" >"$cg/cgroup.procs" 2>/dev/null || echo "$BASHPID" >"$cg/tasks"
    cd "$root/node"
    FREQRING_TEST_LOG="$log" FREQRING_NODETEST_LOG="$log" exec timeout 240 "$bin" -test.run "^${test}\$" -test.count 1 -test.v -test.timeout 230s
  ) >"$out" 2>&1
  rc=$?
  set -e
  done_runs=$i
  figures=$(grep -hoE '[0-9]+ decided, [^(]*' "$out" | head -1 || true) # the oracle's line, if the test prints one
  line="run $i rc=$rc secs=$(($(date +%s) - t0)) $figures"
  echo "$line" | tee -a "$summary"
  if [[ $rc -eq 0 ]]; then
    rm -f "$log" "$out"
  else
    failed=$((failed + 1))
  fi
done
echo "$test at $quota of a core: $failed of $done_runs runs failed (logs of failures and summary in $work)" | tee -a "$summary"
