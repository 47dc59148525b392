#!/usr/bin/env bash
# restart.sh measures a node holding N recipients at the seed's steady state:
# how long `freqring synth` takes to write them, the snapshot's size, how
# long `freqring serve` takes to recover them and how much memory it holds
# then, a short bench against those recipients, the snapshot the node
# writes while it serves that bench, and its resident set after the bench and
# at its peak.
#
#   deploy/scale/restart.sh N          # e.g. 1000000, 10000000, 100000000
#
# Environment (all optional):
#   WORK=DIR        where the binary, data directory and logs go (default: a new
#                   directory under /tmp); the data directory must not exist
#   PORT=17170      the node's gRPC port on 127.0.0.1
#   ADMIN_PORT=17171 the node's admin HTTP port (/metrics) on 127.0.0.1
#   BENCH=15s       bench duration (0: no bench, no snapshot while serving)
#   SNAP_EVERY=5s   the node's --snapshot-interval during the run (with
#                   --snapshot-wal-ratio -1, so that snapshots come that often)
#   SEED=1          synth seed
#   KEEP=1          keep the data directory afterwards (default: remove it)
#   REUSE=1         restart from the data directory a KEEP=1 run left in WORK
#                   instead of synthesizing it again
#   SERVE_FLAGS=... more flags for freqring serve, e.g. --heap-slabs
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
admin_port="${ADMIN_PORT:-17171}"
bench_for="${BENCH:-15s}"
snap_every="${SNAP_EVERY:-5s}"
seed="${SEED:-1}"
addr="127.0.0.1:$port"
data="$work/data"
log="$work/serve.log"
bin="$work/freqring"
mkdir -p "$work"

# GODEBUG (gctrace=1, say) is meant for the node, not for the compiler.
(cd "$root" && env -u GODEBUG go build -o "$bin" ./cmd/freqring)
if [ "${REUSE:-}" = "1" ] && [ -d "$data" ] && [ -f "$work/synth.out" ]; then
	echo "== reusing $data (REUSE=1); its synth:"
	cat "$work/synth.out"
else
	echo "== synth of $n recipients into $data"
	"$bin" synth --data-dir "$data" --recipients "$n" --seed "$seed" | tee "$work/synth.out"
fi

echo "== restart: freqring serve --data-dir $data (log: $log)"
start=$(date +%s.%N)
"$bin" serve --data-dir "$data" --listen "$addr" --admin-listen "127.0.0.1:$admin_port" --snapshot-interval "$snap_every" --snapshot-wal-ratio -1 ${SERVE_FLAGS:-} >"$log" 2>&1 &
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

# gc_cpu NAME prints the node's GC cycles and its runtime's CPU estimates, in
# seconds, as of its last GC: GC, idle and available (GOMAXPROCS x wall). It
# keeps the whole /metrics page in $work/metrics.NAME.
# Plain bash (/dev/tcp), so that the script needs no curl.
gc_cpu() {
	exec 3<>"/dev/tcp/127.0.0.1/$admin_port"
	printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
	tee "$work/metrics.$1" <&3 | awk '/^go_gc_duration_seconds_count /{c=$2} /^go_cpu_classes_gc_total_cpu_seconds_total /{g=$2}
		/^go_cpu_classes_idle_cpu_seconds_total /{i=$2} /^go_cpu_classes_total_cpu_seconds_total /{t=$2}
		END {print c+0, g+0, i+0, t+0}'
	exec 3<&-
}

gc_share=""
if [ "$bench_for" != "0" ]; then
	echo "== bench for $bench_for against the synthesized recipients (snapshots every $snap_every meanwhile)"
	read -r c0 g0 i0 t0 < <(gc_cpu before-bench)
	"$bin" bench --addr "$addr" --recipients "$n" --seed "$seed" --duration "$bench_for" --quiet
	read -r c1 g1 i1 t1 < <(gc_cpu after-bench)
	# The node's resident set now, after serving, and its peak since it
	# started (recovery, the bench and the snapshots meanwhile), in kB.
	rss_served=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
	rss_peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
	# The runtime updates its CPU estimates at each GC: the share is over
	# the GC cycles that ended during the bench (none: no figure).
	gc_share=$(awk -v c0="$c0" -v c1="$c1" -v g0="$g0" -v g1="$g1" -v i0="$i0" -v i1="$i1" -v t0="$t0" -v t1="$t1" 'BEGIN {
		g = g1 - g0; i = i1 - i0; t = t1 - t0 # awk also reads values such as 1.5e+06
		if (c1 == c0 || t - i <= 0) { printf "gc_cycles_during_bench=%d (no GC cycle ended during the bench: no GC CPU share to report)", c1 - c0; exit }
		printf "gc_cycles_during_bench=%d gc_cpu_share_of_used=%.1f%% gc_cpu_share_of_available=%.1f%%", c1 - c0, 100 * g / (t - i), 100 * g / t
	}')
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
	-v heap="$(field go_heap_bytes)" -v mapped="$(field store_mapped_bytes)" 'BEGIN {
	printf "synth_s=%s snapshot_B/recipient=%.1f restart_recovery_s=%.2f start_to_serving_s=%.2f\n", synth, snap/n, rec, wall
	printf "rss_GiB=%.2f rss_B/recipient=%.1f store_B/recipient=%.1f go_heap_B/recipient=%.1f store_mapped_B/recipient=%.1f\n", rss/2^30, rss/n, store/n, heap/n, mapped/n
}'
if [ -n "$gc_share" ]; then
	awk -v n="$n" -v now="$rss_served" -v peak="$rss_peak" 'BEGIN {
		printf "rss_after_bench_GiB=%.2f rss_after_bench_B/recipient=%.1f rss_peak_GiB=%.2f rss_peak_B/recipient=%.1f\n", now*1024/2^30, now*1024/n, peak*1024/2^30, peak*1024/n
	}'
	# What the store held, had mapped and kept free for reuse after the
	# bench, from the /metrics page read then.
	awk -v n="$n" '/^freqring_store_held_bytes /{h=$2} /^freqring_store_mapped_bytes /{m=$2} /^freqring_store_free_bytes /{f=$2}
		END {printf "after_bench: store_B/recipient=%.1f store_mapped_B/recipient=%.1f store_free_B/recipient=%.1f\n", h/n, m/n, f/n}' "$work/metrics.after-bench"
	echo "$gc_share"
fi
if [ -n "$serving_snap" ]; then
	echo "snapshot_while_serving (the last one): $(sed -n 's/.*\(records=[0-9]* bytes=[0-9]*\).*\(took=[^ ]*\).*/\1 \2/p' <<<"$serving_snap")"
fi
if [ "${KEEP:-}" != "1" ]; then
	rm -rf "$data"
fi
