# shellcheck shell=bash
# bench/common.sh — what bench/run and bench/ab share: PostgreSQL's settings, the state every
# pgbench run starts from, and CPU counters. Sourced after tests/lib.sh and tests/blockstack.sh.

# postgresql.conf lines, identical on every target and in every comparison:
#   bench_pg_settings SHARED_BUFFERS MAX_WAL_SIZE CLIENTS   (synchronous_commit is set per run)
bench_pg_settings() {
    printf '%s\n' \
        "shared_buffers = $1" \
        "max_wal_size = $2" \
        "min_wal_size = 256MB" \
        "checkpoint_timeout = 5min" \
        "checkpoint_completion_target = 0.9" \
        "fsync = on" \
        "full_page_writes = on" \
        "wal_compression = off" \
        "max_connections = $(($3 + 20))"
}

# What pgbench itself does before a run (run with -n to keep it out of the counters), then a
# checkpoint, so that every run starts from the same clean state.
bench_pg_prepare() {
    pg_psql -c "VACUUM pgbench_branches" -c "VACUUM pgbench_tellers" \
        -c "TRUNCATE pgbench_history" -c "CHECKPOINT" >/dev/null
}

# CPU seconds used so far by the NBD server process and by nbdfuse (null for an empty PID or a
# process that is gone), and by the whole machine (busy and in all), as JSON: on a saturated
# 2-core machine the CPU a server costs per transaction is a steadier figure than TPS.
#   cpu_counters SERVER_PID FUSE_PID
cpu_counters() {
    python3 - "$1" "$2" <<'PY'
import json, os, sys
tick = os.sysconf("SC_CLK_TCK")
def process_s(pid):
    if not pid:
        return None
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / tick  # utime + stime, all threads
with open("/proc/stat") as f:
    cpu = [int(x) for x in f.readline().split()[1:9]]  # user .. steal
print(json.dumps({"server_s": process_s(sys.argv[1]), "nbdfuse_s": process_s(sys.argv[2]),
                  "machine_busy_s": (sum(cpu) - cpu[3] - cpu[4]) / tick, "machine_s": sum(cpu) / tick}))
PY
}
