#!/bin/bash
# As run for docs/benchmarks.md ("An hour of rw-async on one server"), from a checkout in /work/main.
# scratch: one bucketfs, PostgreSQL scale 10 on ext4/nbdfuse/loop, pgbench rw-async for DURATION s
# in 60 s slices, `bucketfs status` storage figures after each: does the stock of lz4 shrink?
set -euo pipefail
REPO=/work/main BENCH_DIR=/work/main/bench DURATION=${DURATION:-3600} CLIENTS=8 SCALE=10 VOLUME_SIZE=20G
export BUCKETFS_TEST_BACKENDS=file BUCKETFS_TEST_TMPDIR=/var/tmp
source "$REPO/tests/lib.sh"; source "$REPO/tests/blockstack.sh"; source "$BENCH_DIR/common.sh"
trap 'rc=$?; stack_teardown; bucketfs_alive && stop_bucketfs >/dev/null 2>&1; (exit $rc); _lib_cleanup' EXIT
chmod 755 "$TEST_DIR"; dir=$TEST_DIR/B; mkdir -p "$dir"; chmod 755 "$dir"
make_config "$dir/bucket" file
start_bucketfs "$CONFIG" >/dev/null 2>&1 || die "bucketfs did not start"
create_export vol "$VOLUME_SIZE" >/dev/null
stack_attach_nbd "$(nbd_uri vol)" "$dir" || die "nbdfuse failed"
stack_mkfs >/dev/null; stack_mount "$dir/mnt" || die "mount failed"
mapfile -t conf < <(bench_pg_settings 256MB 1GB "$CLIENTS")
pg_init "$dir/mnt/pgdata" "$dir/sock" "$(pick_unused_port)" "${conf[@]}" >/dev/null
pg_start >/dev/null || die "PostgreSQL did not start"
pg_as pgbench -h "$PG_SOCK" -p "$PG_PORT" -U postgres -i -q -s "$SCALE" postgres >/dev/null 2>&1
pg_psql -c CHECKPOINT >/dev/null
start=$SECONDS
printf 'min\ttps\tlog_written_MB\tlog_stored_MB\tlive_in_lz4_MB\tflushes\tflushes_lz4\tresealed\trepacked\tlog_files_MB\n'
while ((SECONDS - start < DURATION)); do
    out=$(PGOPTIONS="-c synchronous_commit=off" pg_as pgbench -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        -n -M prepared -c "$CLIENTS" -j 2 -T 60 postgres 2>&1)
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
    files=$(find "$dir/bucket/bucket/log" -type f -printf '%s\n' | awk '{ s += $1 } END { print s/1e6 }')
    bfs status | python3 -c '
import json, sys
e = json.load(sys.stdin)["engine"]; m = lambda n: "%.1f" % (n / 1e6)
print("\t".join([sys.argv[1], sys.argv[2], m(e["log_bytes_written"]), m(e["log_bytes_stored"]), m(e["live_bytes_in_lz4_objects"]),
  str(e["flushes"]), str(e["flushes_lz4"]), str(e["extents_resealed"]), str(e["extents_repacked"]), sys.argv[3]]))
' "$(( (SECONDS - start) / 60 ))" "$tps" "$files"
done
