#!/usr/bin/env bash
# restart.sh measures a node holding N recipients at the seed's steady state:
# how long `freqring synth` takes to write them, the snapshot's size, how
# long `freqring serve` takes to recover them and how much memory it holds
# then, a short bench against those recipients, and the snapshot the node
# writes while it serves that bench.
#
#   deploy/scale/restart.sh N          # e.g. 1000000, 10000000, 100000000
#
# Environment (all optional):
#   WORK=DIR        where the binary, data directory and logs go (default: a new
#                   directory under /tmp); the data directory must not exist
#   PORT=17170      the node's gRPC port on 127.0.0.1
#   BENCH=15s       bench duration (0: no bench, no snapshot while serving)
#   SNAP_EVERY=5s   the node's --snapshot-interval during the run
#   SEED=1          synth seed
#   KEEP=1          keep the data directory afterwards (default: remove it)
#
# It needs Go and about (N x 170 bytes) of memory for the node plus
# N x 130 bytes of disk (twice that while a second snapshot is written). It
# starts one node, waits for SERVING on gRPC health (freqring status --wait),
# and stops that node by its PID (SIGTERM, which writes a final snapshot).
set -euo pipefail

n="${1:?usage: restart.sh N (recipients)}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${WORK:-$(mktemp -d /tmp/freqring-scale.XXXXXX)}"
port="${PORT:-17170}"
bench_for="${BENCH:-15s}"
snap_every="${SNAP_EVERY:-5s}"
seed="${SEED:-1}"
addr="127.0.0.1:$port"
data="$work/data"
log="$work/serve.log"
bin="$work/freqring"
mkdir -p "$work"

(cd "$root" && go build -o "$bin" ./cmd/freqring)
echo "== synth of $n recipients into $data"
"$bin" synth --data-dir "$data" --recipients "$n" --seed "$seed" | tee "$work/synth.out"

echo "== restart: freqring serve --data-dir $data (log: $log)"
start=$(date +%s.%N)
"$bin" serve --data-dir "$data" --listen "$addr" --snapshot-interval "$snap_every" >"$log" 2>&1 &
pid=$!
stop_node() {
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		wait "$pid" || true
	fi
}
trap stop_node EXIT
"$bin" status --addr "$addr" --wait 30m >/dev/null &
waiter=$!
# Whichever ends first: the wait for SERVING, or the node (a failed start).
wait -n "$pid" "$waiter" || true
if ! kill -0 "$pid" 2>/dev/null; then
	kill "$waiter" 2>/dev/null || true
	echo "freqring serve exited before SERVING; its log:" >&2
	cat "$log" >&2
	exit 1
fi
wait "$waiter"
serving=$(date +%s.%N)
grep -m1 'msg="recovery done"' "$log"

if [ "$bench_for" != "0" ]; then
	echo "== bench for $bench_for against the synthesized recipients (snapshots every $snap_every meanwhile)"
	"$bin" bench --addr "$addr" --recipients "$n" --seed "$seed" --duration "$bench_for" --quiet
fi
stop_node
trap - EXIT

echo "== snapshots: every one but the last was taken while serving (the last is the shutdown's)"
grep 'msg="snapshot written"' "$log" || true

recovery=$(grep -m1 'msg="recovery done"' "$log")
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$recovery"; }
snap_bytes=$(sed -n 's/.*snapshot_bytes=\([0-9]*\).*/\1/p' "$work/synth.out")
synth_s=$(sed -n 's/^synth_seconds=\([0-9.]*\).*/\1/p' "$work/synth.out")
serving_snap=$(grep 'msg="snapshot written"' "$log" | head -n -1 | tail -n 1)
echo "== summary, N=$n"
awk -v n="$n" -v synth="$synth_s" -v snap="$snap_bytes" -v rec="$(field seconds)" \
	-v wall="$(echo "$serving - $start" | bc)" -v rss="$(field rss_bytes)" -v store="$(field store_bytes)" \
	-v heap="$(field go_heap_bytes)" 'BEGIN {
	printf "synth_s=%s snapshot_B/recipient=%.1f restart_recovery_s=%.2f start_to_serving_s=%.2f\n", synth, snap/n, rec, wall
	printf "rss_GiB=%.2f rss_B/recipient=%.1f store_B/recipient=%.1f go_heap_B/recipient=%.1f\n", rss/2^30, rss/n, store/n, heap/n
}'
if [ -n "$serving_snap" ]; then
	echo "snapshot_while_serving (the last one): $(sed -n 's/.*\(records=[0-9]* bytes=[0-9]*\).*\(took=[^ ]*\).*/\1 \2/p' <<<"$serving_snap")"
fi
if [ "${KEEP:-}" != "1" ]; then
	rm -rf "$data"
fi
