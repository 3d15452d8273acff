#!/usr/bin/env bash
# The durability contract seen from PostgreSQL 15 (tests/ledger.sh does the same with raw NBD
# barriers): on the block stack of tests/blockstack.sh, with synchronous_commit = on, a pgbench
# custom script inserts numbered ids, one committed transaction each, beside a tpcb-like pgbench
# load; bucketfs is killed with SIGKILL at a random moment; the dead stack is torn down, bucketfs
# restarted (every CACHE_LOSS_EVERY-th round with its cache directory deleted, so that what was
# acknowledged must come from the bucket), ext4 replays its journal and PostgreSQL runs crash
# recovery. Then every acknowledged id must be there.
#
# An id is acknowledged when pgbench logged its transaction (-l): pgbench writes a transaction's
# log line only once its last command, the COMMIT, returned. Each ledger client c inserts
# (round, c, 1), (round, c, 2), ... in order, so with L_c lines logged for c the table must hold
# exactly (round, c, 1..M) with L_c <= M <= L_c + 1: every acknowledged id, no hole, and at
# most the one COMMIT that was in flight at the kill. Earlier rounds must stay as they were, the
# load's balances must agree after each recovery (every transaction wholly in or out), and at the
# end pg_amcheck must be clean and e2fsck must find the file system clean after a clean stop.
#
# Rounds: BUCKETFS_PG_LEDGER_ROUNDS (default 6 a backend, about 2 minutes over S3 on the 2-core
# test VM; a round takes 12-25 s there). A soak (100 rounds, about half an hour):
#
#     BUCKETFS_PG_LEDGER_ROUNDS=100 BUCKETFS_TEST_BACKENDS=s3 BUCKETFS_SKIP_CARGO_TEST=1 \
#         BUCKETFS_TEST_TIMEOUT=7200 tests/run pg_ledger
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/blockstack.sh
source "$(dirname "$0")/blockstack.sh"

requires nbdfuse fusermount3 losetup mkfs.ext4 e2fsck fuser pgrep timeout
requires "$PG_BIN/postgres" "$PG_BIN/pgbench" "$PG_BIN/pg_amcheck" "$PG_BIN/psql"

ROUNDS=${BUCKETFS_PG_LEDGER_ROUNDS:-6}
# tests/pg_journal.sh sets this to 1: the same rounds through a journal tier ([storage.journal]),
# the S3 backend behind a 20 ms link, then the journal's loss cases (journal_cases below).
# tests/pg_quorum.sh sets it to 2: a journal of three targets, two of which must hold a write
# (quorum_setup, quorum_cases).
JOURNAL=${PG_LEDGER_JOURNAL:-0}
JOURNAL_LATENCY=20ms
((ROUNDS >= 1)) || die "BUCKETFS_PG_LEDGER_ROUNDS must be at least 1"
EXPORT_NAME=pgvol
VOLUME_SIZE=2G
LEDGER_CLIENTS=4
LOAD_CLIENTS=2
LOAD_SCALE=2
# The kill lands this long after the first acknowledged id of the round: from early in the run
# to well into it, where checkpoints of PostgreSQL and of bucketfs happen.
KILL_AFTER_MS_MIN=500
KILL_AFTER_MS_MAX=6000
CACHE_LOSS_EVERY=2
# Checkpoints of bucketfs at least this often: every COMMIT is a barrier and so a log object,
# and each restart replays the log objects written since the last checkpoint (tests/ledger.sh).
LOG_OBJECTS_PER_CHECKPOINT_MIN=64
LOG_OBJECTS_PER_CHECKPOINT_MAX=128
# Bounds on waiting: for the first acknowledged id, for the clients to end after the kill.
CLIENT_READY_S=60
CLIENT_EXIT_S=60
# Bound on any one client step, so that a hung server fails the test instead of blocking CI.
STEP_TIMEOUT_SECONDS=180

sql() { timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
    -d postgres -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

# sum(abalance)|sum(bbalance)|sum(tbalance)|sum(delta) of the load: equal exactly when every
# tpcb-like transaction is wholly present or wholly absent (pgbench -n never truncates history).
balances() {
    sql "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
                (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
}
balances_agree() {
    local a b t d
    IFS='|' read -r a b t d <<<"$1"
    [[ -n $a && $a == "$b" && $b == "$t" && $t == "$d" ]]
}

has_acked_id() { [[ $(sql "SELECT count(*) > 0 FROM ledger WHERE round = $1") == t ]]; }

# wait_exit PID SECONDS: wait for a background job; EXIT_STATUS is its status, or "hung" when
# it was still running after SECONDS (it is then killed).
EXIT_STATUS=""
wait_exit() {
    local pid=$1 deadline=$((SECONDS + $2))
    EXIT_STATUS=0
    while pid_alive "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            EXIT_STATUS=hung
            return 0
        fi
        sleep 0.1
    done
    wait "$pid" || EXIT_STATUS=$?
}

# "round client L" per ledger client of round R, from pgbench's transaction logs (PREFIX.*):
# L is the number of transactions logged as done (their latency field is a number; pgbench
# logs failures with a word there).
acked_counts() { # acked_counts ROUND PREFIX
    local round=$1 prefix=$2 c
    for ((c = 0; c < LEDGER_CLIENTS; c++)); do
        awk -v c="$c" -v r="$round" '$1 == c && $3 ~ /^[0-9]+$/ { n++ } END { print r, c, n + 0 }' "$prefix".*
    done
}

# Compare the table with the acknowledged counts of every round so far ($1: "round client L"
# lines) and with what the checks of earlier rounds found ($2: "round client M" lines, which
# must not change). Prints the rows found as "round client M" on stdout, and one line per
# violation on stderr; fails if there is one.
check_ledger() { # check_ledger ACKED_FILE FOUND_BEFORE_FILE
    local acked=$1 found_before=$2 present
    present=$(sql "SELECT round, client, count(*), min(n), max(n) FROM ledger GROUP BY 1, 2 ORDER BY 1, 2") || return 1
    awk -v acked="$acked" -v before="$found_before" '
        BEGIN {
            while ((getline line < acked) > 0) { split(line, f, " "); L[f[1] " " f[2]] = f[3] }
            while ((getline line < before) > 0) { split(line, f, " "); B[f[1] " " f[2]] = f[3] }
            bad = 0
        }
        NF == 0 { next }
        {
            split($0, f, "|"); k = f[1] " " f[2]; count = f[3]; lo = f[4]; hi = f[5]
            seen[k] = 1
            print k, hi
            if (count != hi || lo != 1) {
                printf "round %s client %s: %d rows between %d and %d: a hole\n", f[1], f[2], count, lo, hi > "/dev/stderr"; bad = 1
            }
            l = (k in L) ? L[k] : 0
            if (hi < l) {
                printf "round %s client %s: ids up to %d acknowledged, only up to %d present\n", f[1], f[2], l, hi > "/dev/stderr"; bad = 1
            }
            if (hi > l + 1) {
                printf "round %s client %s: ids up to %d present, only %d acknowledged (at most one more may be)\n", f[1], f[2], hi, l > "/dev/stderr"; bad = 1
            }
            if ((k in B) && B[k] != hi) {
                printf "round %s client %s: ids up to %d present, %d after its own round\n", f[1], f[2], hi, B[k] > "/dev/stderr"; bad = 1
            }
        }
        END {
            for (k in L) if (L[k] > 0 && !(k in seen)) {
                printf "round/client %s: %d ids acknowledged, none present\n", k, L[k] > "/dev/stderr"; bad = 1
            }
            exit bad
        }' <<<"$present"
}

amcheck_clean() {
    local out
    if out=$(timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pg_amcheck" -h "$PG_SOCK" -p "$PG_PORT" \
        -U postgres --all --install-missing --heapallindexed 2>&1); then
        return 0
    fi
    head -n 40 <<<"$out" >&2
    return 1
}

run_case() {
    local began=$SECONDS round script=$CASE_DIR/ledger.sql acked=$CASE_DIR/acked found=$CASE_DIR/found
    local ledger_pid load_pid delay_ms prefix lrc drc cache_note t0 restart_s recovery_s out sums
    local total_acked=0 total_extra=0 cache_losses=0 n_acked n_found kill_line
    local records_replayed=0 replayed replay_note=""

    trap stack_teardown EXIT
    # The postgres user must reach the mount point and the socket directory below these.
    chmod 755 "$TEST_DIR" "$CASE_DIR"
    make_config "$CASE_DIR/server" "$BACKEND"
    ((JOURNAL == 1)) && journal_setup
    ((JOURNAL == 2)) && quorum_setup
    config_set "$CONFIG" tuning log_objects_per_checkpoint_min "$LOG_OBJECTS_PER_CHECKPOINT_MIN"
    config_set "$CONFIG" tuning log_objects_per_checkpoint_max "$LOG_OBJECTS_PER_CHECKPOINT_MAX"
    start_bucketfs "$CONFIG"
    create_export "$EXPORT_NAME" "$VOLUME_SIZE"
    stack_attach_nbd "$(nbd_uri "$EXPORT_NAME")" "$CASE_DIR" || die "nbdfuse + losetup failed"
    stack_mkfs || die "mkfs.ext4 failed"
    stack_mount "$CASE_DIR/mnt" || die "mount failed"
    pg_init "$CASE_DIR/mnt/pgdata" "$CASE_DIR/sock" "$(pick_unused_port)" \
        "synchronous_commit = on" "fsync = on" "full_page_writes = on" \
        "restart_after_crash = off" "shared_buffers = 64MB" "max_wal_size = 256MB"
    pg_start || die "PostgreSQL did not start"
    [[ $(sql "SHOW synchronous_commit") == on ]] || die "synchronous_commit is not on"
    timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        -i -q -s "$LOAD_SCALE" postgres >"$CASE_DIR/pgbench-init.log" 2>&1 ||
        die "pgbench -i failed: $(tail -n 5 "$CASE_DIR/pgbench-init.log")"
    sql "CREATE TABLE ledger (round int, client int, n int, PRIMARY KEY (round, client, n))"
    # pgbench keeps a client's variables from one transaction to the next: n counts that
    # client's transactions (-D n=0 starts it), and :client_id is pgbench's number of the client.
    cat >"$script" <<'SQL'
\set n :n + 1
BEGIN;
INSERT INTO ledger (round, client, n) VALUES (:round, :client_id, :n);
COMMIT;
SQL
    : >"$acked"
    : >"$found"
    # The whole stack is synced before the first kill: the first round's crash must not find
    # the cluster's own files (written through the page cache) partly missing.
    sync -f "$STACK_MNT"

    for ((round = 1; round <= ROUNDS; round++)); do
        prefix=$CASE_DIR/round$round/ledger
        mkdir -p "$CASE_DIR/round$round"
        (
            trap - ERR
            set +e
            exec timeout "$BUCKETFS_CLIENT_TIMEOUT" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" \
                -U postgres -n -f "$script" -c "$LEDGER_CLIENTS" -j 1 -T 3600 \
                -D round="$round" -D n=0 -l --log-prefix="$prefix" postgres \
                >"$CASE_DIR/round$round/ledger-pgbench.log" 2>&1
        ) &
        ledger_pid=$!
        (
            trap - ERR
            set +e
            exec timeout "$BUCKETFS_CLIENT_TIMEOUT" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" \
                -U postgres -n -c "$LOAD_CLIENTS" -j 1 -T 3600 postgres \
                >"$CASE_DIR/round$round/load-pgbench.log" 2>&1
        ) &
        load_pid=$!
        wait_for "$CLIENT_READY_S" has_acked_id "$round" ||
            die "round $round: no id acknowledged within ${CLIENT_READY_S}s: $(tail -n 5 "$CASE_DIR/round$round/ledger-pgbench.log")"
        delay_ms=$((KILL_AFTER_MS_MIN + RANDOM % (KILL_AFTER_MS_MAX - KILL_AFTER_MS_MIN + 1)))
        sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
        pid_alive "$ledger_pid" || die "round $round: the ledger pgbench ended before the kill: $(tail -n 5 "$CASE_DIR/round$round/ledger-pgbench.log")"
        pid_alive "$load_pid" || die "round $round: the load pgbench ended before the kill: $(tail -n 5 "$CASE_DIR/round$round/load-pgbench.log")"
        kill9_bucketfs
        kill_line=$(wc -l <"$BUCKETFS_LOG")
        # The FUSE connection aborts with nbdfuse, so that PostgreSQL's I/O fails instead of
        # waiting for a server that will not come back on this connection.
        stack_kill9_nbdfuse

        # PostgreSQL PANICs on the failed I/O; pgbench's clients abort and it exits, closing
        # its transaction logs. A pgbench that had to be killed may have lost log lines.
        wait_exit "$ledger_pid" "$CLIENT_EXIT_S"
        lrc=$EXIT_STATUS
        wait_exit "$load_pid" "$CLIENT_EXIT_S"
        drc=$EXIT_STATUS
        [[ $lrc != hung && $lrc != 124 ]] || die "round $round: the ledger pgbench did not end after the kill"
        [[ $drc != hung && $drc != 124 ]] || die "round $round: the load pgbench did not end after the kill"
        if ! pg_wait_gone 20; then
            log "round $round: PostgreSQL still running 20 s after the kill; pg_ctl stop -m immediate"
            pg_stop immediate || pg_kill9
        fi
        PG_POSTMASTER_PID=
        stack_umount
        stack_detach
        acked_counts "$round" "$prefix" >>"$acked"
        cache_note=""
        if ((round % CACHE_LOSS_EVERY == 0)); then
            rm -rf "$CACHE_DIR"
            cache_losses=$((cache_losses + 1))
            cache_note=", cache deleted"
        fi

        t0=$SECONDS
        start_bucketfs "$CONFIG"
        stack_attach_nbd "$(nbd_uri "$EXPORT_NAME")" "$CASE_DIR" || die "round $round: nbdfuse + losetup failed after the restart"
        # The kernel replays the ext4 journal at mount.
        stack_mount "$CASE_DIR/mnt" || die "round $round: mount after the kill failed"
        restart_s=$((SECONDS - t0))
        rm -f "$PG_DATA/postmaster.pid" # the killed postmaster's; its PID may be in use by now
        t0=$SECONDS
        pg_start || die "round $round: PostgreSQL crash recovery failed"
        recovery_s=$((SECONDS - t0))

        if ! out=$(check_ledger "$acked" "$found" 2>"$CASE_DIR/round$round/violations"); then
            cat "$CASE_DIR/round$round/violations" >&2
            echo "----- bucketfs log around the kill (line $kill_line) -----" >&2
            sed -n "$((kill_line > 40 ? kill_line - 40 : 1)),$((kill_line + 10))p" "$BUCKETFS_LOG" >&2
            die "round $round: acknowledged ids lost after kill -9 at ${delay_ms} ms$cache_note"
        fi
        printf '%s\n' "$out" >"$found"
        if ((JOURNAL >= 1)); then
            # Journaled barriers (docs/0009): the records of the barriers acknowledged since
            # the last log object were replayed by the restart's open.
            replayed=$(tail -n +"$kill_line" "$BUCKETFS_LOG" | sed 's/\x1b\[[0-9;]*m//g' |
                grep -o 'journal records replayed into the bucket.*replayed=[0-9]*' |
                tail -n 1 | grep -o '[0-9]*$' || true)
            records_replayed=$((records_replayed + ${replayed:-0}))
            replay_note="; ${replayed:-0} journal records replayed"
        fi
        sums=$(balances) || die "round $round: the load's tables cannot be read"
        balances_agree "$sums" || die "round $round: the load's balances disagree after recovery: $sums"
        n_acked=$(awk -v r="$round" '$1 == r { n += $3 } END { print n + 0 }' "$acked")
        n_found=$(awk -v r="$round" '$1 == r { n += $3 } END { print n + 0 }' "$found")
        total_acked=$((total_acked + n_acked))
        total_extra=$((total_extra + n_found - n_acked))
        log "round $round: killed after ${delay_ms} ms$cache_note; $n_acked ids acknowledged, $n_found present" \
            "($((n_found - n_acked)) committed in flight); ledger pgbench exit $lrc, load exit $drc;" \
            "restart + mount ${restart_s} s, crash recovery ${recovery_s} s; balances agree$replay_note"
    done
    if ((JOURNAL >= 1 && records_replayed == 0)); then
        die "no restart replayed a journal record: the kills never caught a barrier answered from the journal"
    fi

    amcheck_clean || die "pg_amcheck found corruption after $ROUNDS rounds"
    log "pg_amcheck --all --heapallindexed: no corruption"
    pg_stop fast || die "PostgreSQL did not stop cleanly"
    stack_umount
    out=$(stack_fsck_check) || die "e2fsck -f -n after a clean stop: $out"
    log "e2fsck -f -n after a clean stop: $(tail -n 1 <<<"$out")"
    stack_detach
    stop_bucketfs
    log "totals: $ROUNDS rounds ($cache_losses with the cache deleted), $total_acked ids acknowledged," \
        "all present; $total_extra more committed in flight; $((SECONDS - began)) s"
    ((JOURNAL == 1)) && journal_cases
    ((JOURNAL == 2)) && quorum_cases
    return 0
}

# --- the journal tier (tests/pg_journal.sh) ------------------------------------------------------

# The journal in the case's directory; on S3, bench/s3proxy.py between bucketfs and moto adds
# JOURNAL_LATENCY to every request and refuses every request while $FAULT_FILE exists.
journal_setup() {
    JOURNAL_DIR=$CASE_DIR/journal
    FAULT_FILE=$CASE_DIR/fault
    config_set "$CONFIG" storage.journal path "\"$JOURNAL_DIR\""
    if [[ $BACKEND == s3 ]]; then
        config_set "$CONFIG" aws endpoint "\"$(start_proxy "$JOURNAL_LATENCY" "$FAULT_FILE")\""
    fi
}

# Prints the endpoint of a new bench/s3proxy.py in front of moto: LATENCY added to every
# request, every request refused while FAULT_FILE exists.
start_proxy() { # start_proxy LATENCY FAULT_FILE
    local port
    port=$(pick_unused_port)
    "$BUCKETFS_TEST_PYTHON" "$REPO_ROOT/bench/s3proxy.py" --listen "127.0.0.1:$port" \
        --upstream "${S3_ENDPOINT#http://}" --latency "$1" --fault-while "$2" \
        >>"$CASE_DIR/s3proxy.log" 2>&1 &
    register_pid $!
    wait_for 30 _port_open "$port" || die "s3proxy did not start: $(cat "$CASE_DIR/s3proxy.log")"
    echo "http://127.0.0.1:$port"
}

# Three targets, write quorum 2. Over S3: prefixes of the test bucket, each behind a proxy of
# its own (2, 5 and 20 ms), the third refusing every request from the start: one target is
# unreachable throughout the rounds. Over file://: three local directories.
quorum_setup() {
    local i latencies=(2ms 5ms 20ms)
    FAULT_FILE=$CASE_DIR/fault
    QUORUM_DIRS=("$CASE_DIR/journal-a" "$CASE_DIR/journal-b" "$CASE_DIR/journal-c")
    QUORUM_FAULTS=("$CASE_DIR/fault-a" "$CASE_DIR/fault-b" "$CASE_DIR/fault-c")
    config_set "$CONFIG" storage.journal write_quorum 2
    for i in 0 1 2; do
        if [[ $BACKEND == s3 ]]; then
            printf '[[storage.journal.targets]]\nurl = "%s"\nendpoint = "%s"\n' \
                "$BUCKET_URL-journal-$i" "$(start_proxy "${latencies[$i]}" "${QUORUM_FAULTS[$i]}")" >>"$CONFIG"
        else
            printf '[[storage.journal.targets]]\npath = "%s"\n' "${QUORUM_DIRS[$i]}" >>"$CONFIG"
        fi
    done
    if [[ $BACKEND == s3 ]]; then
        printf 'refuse\n' >"${QUORUM_FAULTS[2]}"
        config_set "$CONFIG" aws endpoint "\"$(start_proxy "$JOURNAL_LATENCY" "$FAULT_FILE")\""
    fi
}

# Fails unless `bucketfs run` refuses to start, naming the journal and the way out.
expect_refused_start() { # expect_refused_start WHY
    local out rc=0
    out=$(timeout 60 "$BUCKETFS" run -c "$CONFIG" 2>&1) || rc=$?
    ((rc != 0 && rc != 124)) || die "$1: bucketfs run did not refuse to start (exit $rc)"
    grep -q -- "--accept-journal-loss" <<<"$out" || die "$1: the refusal does not say how to go on: $(tail -n 3 <<<"$out")"
    log "$1: refused: $(grep -o 'this bucket was last written through.*' <<<"$out" | head -c 200)"
}

journal_cases() {
    local name=jcase
    start_bucketfs "$CONFIG"
    grep -q "durability: journal in $JOURNAL_DIR" <(bucketfs_log_current) ||
        die "bucketfs run did not print the journal's guarantee at start"
    create_export "$name" 16M
    qio "$name" "write -P 0x11 0 1M" "flush"
    # The store refuses everything (S3: the proxy) or is a directory (file): the flush returns
    # once journaled; kill -9, and the restart uploads the journal's objects first.
    [[ $BACKEND == s3 ]] && printf 'refuse\n' >"$FAULT_FILE"
    qio "$name" "write -P 0x22 0 1M" "flush"
    log "a flush returned while the store refused every request"
    kill9_bucketfs
    rm -f "$FAULT_FILE"
    start_bucketfs "$CONFIG"
    qio "$name" "read -P 0x22 0 1M"
    log "after kill -9 and a restart, the data only the journal held is there"

    # The journal deleted while the server is down: refused, unless the loss is accepted.
    [[ $BACKEND == s3 ]] && printf 'refuse\n' >"$FAULT_FILE"
    qio "$name" "write -P 0x33 0 1M" "flush"
    kill9_bucketfs
    rm -f "$FAULT_FILE"
    rm -rf "$JOURNAL_DIR"
    expect_refused_start "journal deleted"
    start_bucketfs "$CONFIG" --accept-journal-loss
    if [[ $BACKEND == s3 ]]; then
        qio "$name" "read -P 0x22 0 1M"
        log "--accept-journal-loss: the bucket's own state (the write only the journal held is gone)"
    fi
    qio "$name" "write -P 0x44 0 1M" "flush"
    stop_bucketfs
    start_bucketfs "$CONFIG"
    qio "$name" "read -P 0x44 0 1M"
    # Without [storage.journal] after a crash with a journal: refused too.
    kill9_bucketfs
    sed -i "\|^path = \"$JOURNAL_DIR\"|d" "$CONFIG"
    expect_refused_start "no journal configured"
    log "journal cases: ok"
}

# The quorum's cases, on the NBD level: a flush returns once two targets hold it (over S3 while
# the bucket and the third target refuse every request) and is there after kill -9 and a start
# that reads two targets; a start that can read only one refuses, naming --accept-journal-loss.
quorum_cases() {
    local name=qcase
    start_bucketfs "$CONFIG"
    grep -q "durability: journal of 3 targets" <(bucketfs_log_current) ||
        die "bucketfs run did not print the quorum's guarantee at start"
    create_export "$name" 16M
    qio "$name" "write -P 0x11 0 1M" "flush"
    if [[ $BACKEND == s3 ]]; then
        local states
        states=$(status_json | "$BUCKETFS_TEST_PYTHON" -c 'import json, sys
print(" ".join(t["state"] for t in json.load(sys.stdin)["journal"]["targets"]))')
        [[ $states == "ok ok joining" || $states == "ok ok failing" ]] ||
            die "bucketfs status shows the targets as \"$states\", not two ok and the third unreachable"
        log "bucketfs status: targets $states"
    fi
    [[ $BACKEND == s3 ]] && printf 'refuse\n' >"$FAULT_FILE"
    qio "$name" "write -P 0x22 0 1M" "flush"
    kill9_bucketfs
    rm -f "$FAULT_FILE"
    if [[ $BACKEND == s3 ]]; then
        log "a flush returned while the bucket and the third target refused every request"
    else
        rm -rf "${QUORUM_DIRS[2]}"
        log "the third target deleted while the server is down"
    fi
    start_bucketfs "$CONFIG"
    qio "$name" "read -P 0x22 0 1M"
    log "after kill -9, a start that read two of the three targets has the data"

    [[ $BACKEND == s3 ]] && printf 'refuse\n' >"$FAULT_FILE"
    qio "$name" "write -P 0x33 0 1M" "flush"
    kill9_bucketfs
    rm -f "$FAULT_FILE"
    if [[ $BACKEND == s3 ]]; then
        printf 'refuse\n' >"${QUORUM_FAULTS[1]}"
        expect_refused_start "one of three targets reachable"
        rm -f "${QUORUM_FAULTS[1]}"
        start_bucketfs "$CONFIG"
        qio "$name" "read -P 0x33 0 1M"
        log "with the second target back: the data is there"
    else
        rm -rf "${QUORUM_DIRS[0]}" "${QUORUM_DIRS[1]}"
        expect_refused_start "two of three targets deleted"
        start_bucketfs "$CONFIG" --accept-journal-loss
    fi
    stop_bucketfs
    log "quorum cases: ok"
}

for_each_backend run_case
