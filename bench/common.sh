# shellcheck shell=bash
# bench/common.sh — what bench/run, bench/ab and bench/versus share: PostgreSQL's settings, the
# state every pgbench run starts from, CPU counters and one pgbench slice. Sourced after
# tests/lib.sh and tests/blockstack.sh.

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
# process that is gone), and by the whole machine (busy, stolen by the hypervisor, and in all),
# as JSON: on a saturated 2-core machine the CPU a server costs per transaction is a steadier
# figure than TPS.
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
                  "machine_busy_s": (sum(cpu) - cpu[3] - cpu[4]) / tick, "machine_s": sum(cpu) / tick,
                  "steal_s": cpu[7] / tick}))
PY
}

# CPU seconds a PostgreSQL cluster's backends have used: its postmaster's own and that of its
# children that have exited (a pgbench connection's backend exits with it).
#   postgres_exited_cpu_s POSTMASTER_PID
postgres_exited_cpu_s() {
    python3 -c '
import os, sys
with open("/proc/%s/stat" % sys.argv[1]) as f:
    fields = f.read().rsplit(")", 1)[1].split()
print(sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK"))  # utime stime cutime cstime
' "$1"
}

# PostgreSQL's own counters on the cluster the PG_* variables name, as one JSON object: WAL
# written (bytes, full-page images, syncs, writes forced by full WAL buffers), blocks read from
# the kernel, buffers backends had to write themselves, and pgbench_accounts' dead tuples and
# size (heap and indexes). Where a workload's time goes when the NBD server does no work.
pg_counters() {
    pg_psql -c "SELECT json_build_object(
        'wal_bytes', w.wal_bytes, 'wal_fpi', w.wal_fpi, 'wal_sync', w.wal_sync,
        'wal_buffers_full', w.wal_buffers_full, 'blks_read', d.blks_read,
        'buffers_backend', b.buffers_backend, 'dead_tuples', t.n_dead_tup,
        'accounts_bytes', pg_total_relation_size('pgbench_accounts'))
        FROM pg_stat_wal w, pg_stat_bgwriter b, pg_stat_database d, pg_stat_user_tables t
        WHERE d.datname = current_database() AND t.relname = 'pgbench_accounts'"
}

# One slice of a workload on the cluster the PG_* variables name: bench_pg_prepare, then pgbench
# (prepared statements) with the CPU counters read around it. Prints a row of
# bench_slice_header's columns after slice and side: TPS, the server's CPU per transaction
# (empty without a PID), the share of the machine busy, PostgreSQL's backends' CPU per
# transaction and the share of the machine the hypervisor stole.
#   bench_slice SERVER_PID SYNCHRONOUS_COMMIT DURATION_S CLIENTS [PGBENCH_ARG...]
bench_slice() {
    local pid=$1 sync=$2 duration=$3 clients=$4 before after out children pg_before pg_after
    shift 4
    bench_pg_prepare
    # A caller may observe pgbench's run alone (bench/versus: PostgreSQL's counters, perf).
    if declare -F bench_slice_observe_start >/dev/null; then bench_slice_observe_start "$duration"; fi
    children=$(pgrep -c -P "$PG_POSTMASTER_PID" || true)
    pg_before=$(postgres_exited_cpu_s "$PG_POSTMASTER_PID")
    before=$(cpu_counters "$pid" "")
    out=$(PGOPTIONS="-c synchronous_commit=$sync" pg_as pgbench -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        -n -M prepared -c "$clients" -j "$(($(nproc) < clients ? $(nproc) : clients))" -T "$duration" \
        "$@" postgres 2>&1) || { echo "$out" >&2; return 1; }
    after=$(cpu_counters "$pid" "")
    # The backends count once the postmaster has reaped them (within milliseconds).
    for _ in {1..50}; do
        (($(pgrep -c -P "$PG_POSTMASTER_PID" || true) <= children)) && break
        sleep 0.05
    done
    pg_after=$(postgres_exited_cpu_s "$PG_POSTMASTER_PID")
    if declare -F bench_slice_observe_stop >/dev/null; then bench_slice_observe_stop; fi
    python3 - "$before" "$after" "$out" "$pg_before" "$pg_after" <<'PY'
import json, re, sys
b, a, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
postgres_s = float(sys.argv[5]) - float(sys.argv[4])
tps = float(re.search(r"^tps = ([0-9.]+)", out, re.M).group(1))
tx = int(re.search(r"^number of transactions actually processed: (\d+)", out, re.M).group(1))
machine_s = a["machine_s"] - b["machine_s"]
busy = (a["machine_busy_s"] - b["machine_busy_s"]) / machine_s
steal = (a["steal_s"] - b["steal_s"]) / machine_s
cpu = "" if b["server_s"] is None or a["server_s"] is None else "%.1f" % ((a["server_s"] - b["server_s"]) * 1e6 / tx)
print("%.1f\t%s\t%.3f\t%.1f\t%.3f" % (tps, cpu, busy, postgres_s * 1e6 / tx, steal))
PY
}

# The header of the TSV that bench/ab and bench/versus write bench_slice's rows into.
bench_slice_header() {
    printf 'slice\tside\ttps\tserver_cpu_us_per_tx\tmachine_busy\tpostgres_cpu_us_per_tx\tsteal\n'
}

# The synchronous_commit setting and pgbench arguments of a workload name, as
# "SYNC [ARG...]"; empty for an unknown name.
bench_workload() {
    case $1 in
    rw-sync) echo on ;;
    rw-async) echo off ;;
    ro) echo "on -S" ;;
    esac
}
