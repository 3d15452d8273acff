# shellcheck shell=bash
# tests/pgcheck.sh — assertions and PostgreSQL checks shared by the PostgreSQL tests.
#
# Sourced after tests/lib.sh and tests/blockstack.sh (uses PG_* and pg_log_tail). The caller sets
# STEP_TIMEOUT_SECONDS, the bound on any one client step.
#
# Assertions (each prints a TAP-like line; failures collect in FAILED)
#   ok TEXT, not_ok TEXT         report one check
#   check TEXT CMD...            run CMD; ok or not_ok
#   must TEXT CMD...             a step the rest depends on: on failure report, show the
#                                PostgreSQL log tail and stop this backend
#   report_failures              at the end of a case: die listing the failed checks, if any
# Database
#   sql SQL                      one statement on database postgres (role postgres)
#   pgbench_run LOG ARG...       pgbench ARG... postgres > LOG (tail shown on failure)
#   fingerprint                  row counts and balance sums of the pgbench tables
#   balances_agree FINGERPRINT   every pgbench transaction wholly present or wholly absent
#   amcheck_clean                pg_amcheck --all --heapallindexed finds nothing
# The crash check (an acknowledged-commit ledger beside a pgbench load)
#   crash_load_start DIR SECONDS start pgbench -T SECONDS and the acks client (table acks must
#                                exist); ACKED=DIR/acked lists each acknowledged insert
#   crash_load_reap              after the crash: wait for both to end, log what was acknowledged
#   check_recovered FINGERPRINT_BEFORE   after recovery: every acknowledged insert present, acks
#                                a prefix, balances agree, amcheck clean, the database writes

FAILED=()
ok() { echo "ok - $TEST_NAME [$BACKEND] $*"; }
not_ok() {
    echo "not ok - $TEST_NAME [$BACKEND] $*"
    FAILED+=("$*")
}
check() { # check DESCRIPTION CMD...
    local what=$1
    shift
    if "$@"; then ok "$what"; else not_ok "$what"; fi
}
must() {
    local what=$1
    shift
    "$@" && return 0
    not_ok "$what"
    echo "----- PostgreSQL log tail -----" >&2
    pg_log_tail 30 >&2
    die "$what (failed checks: ${#FAILED[@]})"
}
report_failures() {
    ((${#FAILED[@]} == 0)) && return 0
    echo "----- bucketfs log tail -----" >&2
    tail -n 40 "$BUCKETFS_LOG" 2>/dev/null >&2 || true
    die "${#FAILED[@]} check(s) failed: $(printf '%s; ' "${FAILED[@]}")"
}

sql() { timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
    -d postgres -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

pgbench_run() { # pgbench_run LOG ARG...
    local log=$1
    shift
    timeout "$STEP_TIMEOUT_SECONDS" "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" -U postgres \
        "$@" postgres >"$log" 2>&1 || {
        tail -n 5 "$log" >&2
        return 1
    }
}

# Row counts of the four pgbench tables and the sums of their balances, '|'-separated.
fingerprint() {
    sql "SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_branches),
                (SELECT count(*) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history),
                (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
                (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
}
FINGERPRINT_FIELDS="accounts|branches|tellers|history|sum(abalance)|sum(bbalance)|sum(tbalance)|sum(delta)"

# Each tpcb-like transaction adds one delta to an account, a teller and a branch and logs it in
# history (pgbench runs with -n so history is never truncated): the four sums agree exactly when
# every transaction is wholly present or wholly absent.
balances_agree() {
    local a b t h
    IFS='|' read -r _ _ _ _ a b t h <<<"$1"
    [[ -n $a && $a == "$b" && $b == "$t" && $t == "$h" ]]
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

# Insert 1, 2, 3, ... one autocommit statement per psql; append n to ACKED only after psql
# reported success, i.e. after COMMIT returned. Stops at the first failure.
acks_client() {
    local acked=$1 n=0
    trap - ERR
    while :; do
        n=$((n + 1))
        if timeout 30 "$PG_BIN/psql" -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres -XAtq \
            -v ON_ERROR_STOP=1 -c "INSERT INTO acks VALUES ($n)" >/dev/null 2>&1; then
            echo "$n" >>"$acked"
        else
            echo "$n" >"$acked.failed"
            return 0
        fi
    done
}

ACKED=
CRASH_LOG=
CRASH_PGBENCH_PID=
CRASH_ACKS_PID=
ACKED_COUNT=0
LAST_ACKED=0

crash_load_start() { # DIR SECONDS
    ACKED=$1/acked CRASH_LOG=$1/pgbench-crash.log
    : >"$ACKED"
    # Expected to fail when the storage dies: run outside errexit and the ERR trap.
    (
        trap - ERR
        set +e
        timeout $(($2 + 120)) "$PG_BIN/pgbench" -h "$PG_SOCK" -p "$PG_PORT" \
            -U postgres -n -T "$2" -c 4 -j 2 -P 1 postgres >"$CRASH_LOG" 2>&1
    ) &
    CRASH_PGBENCH_PID=$!
    acks_client "$ACKED" &
    CRASH_ACKS_PID=$!
}

crash_load_reap() {
    local i
    for ((i = 0; i < 300; i++)); do
        pid_alive "$CRASH_ACKS_PID" || pid_alive "$CRASH_PGBENCH_PID" || break
        sleep 0.1
    done
    kill "$CRASH_ACKS_PID" "$CRASH_PGBENCH_PID" 2>/dev/null || true
    wait "$CRASH_ACKS_PID" 2>/dev/null || true
    wait "$CRASH_PGBENCH_PID" 2>/dev/null || true
    ACKED_COUNT=$(wc -l <"$ACKED")
    LAST_ACKED=$(tail -n 1 "$ACKED")
    LAST_ACKED=${LAST_ACKED:-0}
    log "acknowledged inserts before the crash: $ACKED_COUNT (last $LAST_ACKED); pgbench's last" \
        "progress: $(grep '^progress' "$CRASH_LOG" | tail -n 1 || true)"
    check "the acks client had commits acknowledged before the crash" test "$ACKED_COUNT" -gt 0
}

check_recovered() { # FINGERPRINT_BEFORE_THE_CRASH_RUN
    local missing count_present max_present after history_before
    history_before=$(cut -d'|' -f4 <<<"$1")
    sql "SELECT n FROM acks ORDER BY n" >"$ACKED.present"
    missing=$(comm -23 <(sort "$ACKED") <(sort "$ACKED.present") | wc -l)
    IFS='|' read -r count_present max_present <<<"$(sql "SELECT count(*), coalesce(max(n), 0) FROM acks")"
    log "acks after recovery: $count_present rows (max $max_present); acknowledged $ACKED_COUNT; missing $missing"
    check "every acknowledged commit survived the crash ($ACKED_COUNT acknowledged, $missing missing)" \
        test "$missing" -eq 0
    check "acks is a prefix of the insert order (no holes)" test "$count_present" -eq "$max_present"
    check "at most the one in-flight insert committed past the last acknowledged one" \
        test "$max_present" -le $((LAST_ACKED + 1))

    after=$(fingerprint || true)
    log "after crash recovery: $FINGERPRINT_FIELDS = $after"
    # Not asserted: pgbench's own count of what committed before the crash is not exact.
    log "pgbench_history grew by $(($(cut -d'|' -f4 <<<"$after") - history_before)) rows in the" \
        "crash run; pgbench's per-second progress adds up to about $(awk '/^progress/ { n += $4 }
        END { printf "%d", n }' "$CRASH_LOG") transactions"
    check "pgbench balances agree after crash recovery (transactions atomic)" balances_agree "$after"
    check "pg_amcheck --all --heapallindexed finds no corruption" amcheck_clean
    check "the recovered database takes writes (pgbench -T 5)" \
        pgbench_run "$(dirname "$ACKED")/pgbench-after.log" -n -T 5 -c 2
}
