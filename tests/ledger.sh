#!/usr/bin/env bash
# The flush barrier of DESIGN.md's durability contract, checked against a ledger over many
# random-time kills: a record written to export `ledger` and then flushed (NBD FLUSH, or the
# write itself with FUA) is in the ledger only once the barrier returned, and after every kill -9
# the export must hold every record of the ledger, intact, and nothing else but zeros and the one
# record that may have been in flight (tests/ledger.py states the rules). Meanwhile random
# 64 KiB - 1 MiB writes with occasional flushes go to export `noise`, so each kill lands among
# uploads, periodic flushes and competing barriers. Every CACHE_LOSS_EVERY-th round also deletes
# the cache directory before the restart: acknowledged records must be in the bucket itself.
#
# After each restart the check reads back the records of this round and the one before (and the
# slots after them); every FULL_CHECK_EVERY-th round, and the last, it reads back every record.
# (The disk cache is emptied at every start, so each check reads from the bucket: a full check
# every round grows with the square of the rounds, minutes of 100 rounds over moto.)
#
# Rounds: BUCKETFS_LEDGER_ROUNDS, default 20 over S3 (moto) and 10 over file:// (the README's
# test command, about two minutes together). The 100-kill run over S3 (about 7.5 minutes on the
# 2-core test VM; 0 violations on 2026-11-27):
#
#     BUCKETFS_LEDGER_ROUNDS=100 BUCKETFS_TEST_BACKENDS=s3 BUCKETFS_SKIP_CARGO_TEST=1 tests/run ledger
#
# A soak:
#
#     BUCKETFS_LEDGER_ROUNDS=1000 BUCKETFS_TEST_BACKENDS=s3 BUCKETFS_SKIP_CARGO_TEST=1 \
#         BUCKETFS_TEST_TIMEOUT=36000 tests/run ledger
#
# It takes hours, most of them in the full checks, which grow with the ledger:
# BUCKETFS_LEDGER_FULL_CHECK_EVERY=N (default 10) sets how often every record is read back.
#
# The ledger export has room for 256 records a round (at least 256 MiB); over file:// a round
# writes more, so a long run there ends early, with a full check, once the export is full.
#
# On a violation the test stops at that round and prints the check's findings and the server
# log around the kill; BUCKETFS_TEST_KEEP=1 keeps the ledger, the client logs and the bucket.
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires_nbdsh

LEDGER_PY="$TESTS_DIR/ledger.py"
# The kill lands this long after the writer's first acknowledged record of the round: long
# enough for tens of barriers among the noise (hundreds over file://). Over S3 a round also
# spends 1-2 s in the restart and the check (moto is slow), so the range is shorter there to
# keep 100 rounds near 6 minutes on the 2-core test VM.
KILL_AFTER_MS_MIN=300
KILL_AFTER_MS_MAX_FILE=2500
KILL_AFTER_MS_MAX_S3=1300
CACHE_LOSS_EVERY=10
FULL_CHECK_EVERY="${BUCKETFS_LEDGER_FULL_CHECK_EVERY:-10}"
((FULL_CHECK_EVERY >= 1)) || die "BUCKETFS_LEDGER_FULL_CHECK_EVERY must be at least 1"
NOISE_EXPORT_MIB=256
# Checkpoints at least this often (the default is 1024 to 8192 log objects). Every barrier here
# is a log object, and no round lives long enough for a quiet checkpoint, so with the defaults
# each restart replays hundreds of log objects (on moto ~20 ms each) and 100 rounds take far
# longer than the few minutes this test may take. More checkpoints also put more kills inside
# one, and in the collection and repacking that follow it.
LOG_OBJECTS_PER_CHECKPOINT_MIN=64
LOG_OBJECTS_PER_CHECKPOINT_MAX=128
# Bounds on waiting for the clients: to show progress after their start, to exit after the kill.
CLIENT_READY_S=60
CLIENT_EXIT_S=60

ledger_py() { timeout "$BUCKETFS_CLIENT_TIMEOUT" "$NBD_PYTHON" "$LEDGER_PY" "$@"; }

# Lines of the ledger that record an acknowledged record ("INDEX NONCE"; the others are "run ...").
acked_count() { awk '$1 != "run" { n++ } END { print n + 0 }' "$1"; }
next_index() { awk '$1 != "run" && $1 + 1 > n { n = $1 + 1 } END { print n + 0 }' "$1"; }
# acked_more_than LEDGER N: the ledger holds more than N acknowledged records.
acked_more_than() { (($(acked_count "$1") > $2)); }

# wait_exit PID SECONDS: wait for a client started in the background and set EXIT_STATUS to its
# exit status; a client still running after SECONDS is killed and reported as "hung". (Not a
# command substitution: a subshell cannot wait for its parent's children.)
EXIT_STATUS=""
wait_exit() {
    local pid="$1" deadline=$((SECONDS + $2))
    EXIT_STATUS=0
    while pid_alive "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            EXIT_STATUS=hung
            return 0
        fi
        sleep 0.05
    done
    wait "$pid" || EXIT_STATUS=$?
}

# Milliseconds since an earlier $EPOCHREALTIME.
ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }'; }

# Print the server log around line LINE (where the killed run's log ends).
log_around_kill() {
    local line="$1"
    echo "----- bucketfs log around the kill (line $line of $BUCKETFS_LOG) -----" >&2
    sed -n "$((line > 40 ? line - 40 : 1)),$((line + 40))p" "$BUCKETFS_LOG" >&2
}

run_case() {
    local rounds round ledger="$CASE_DIR/ledger.txt" wlog="$CASE_DIR/writer.log"
    local nlog="$CASE_DIR/noise.log" began=$SECONDS next before wpid npid delay_ms wrc nrc
    # This round's client output; appended to writer.log and noise.log when the round is over.
    local wround="$CASE_DIR/writer.round.log" nround="$CASE_DIR/noise.round.log"
    local kill_line out cache_note verified=0 cache_losses=0 present t0 ready_ms restart_ms check_ms
    # A partial check reads the records from the first one of the previous round on.
    local prev_next=0 check_first full_checks=0 kill_after_ms_max
    if [[ "$BACKEND" == s3 ]]; then
        rounds="${BUCKETFS_LEDGER_ROUNDS:-20}"
        kill_after_ms_max="$KILL_AFTER_MS_MAX_S3"
    else
        rounds="${BUCKETFS_LEDGER_ROUNDS:-10}"
        kill_after_ms_max="$KILL_AFTER_MS_MAX_FILE"
    fi
    # Record i is the 4 KiB block i of export ledger: 1 MiB a round is 256 records a round.
    local ledger_export_mib=$((rounds > 256 ? rounds : 256))
    local ledger_records_max=$((ledger_export_mib * 1024 / 4))
    make_config "$CASE_DIR" "$BACKEND"
    config_set "$CONFIG" tuning log_objects_per_checkpoint_min "$LOG_OBJECTS_PER_CHECKPOINT_MIN"
    config_set "$CONFIG" tuning log_objects_per_checkpoint_max "$LOG_OBJECTS_PER_CHECKPOINT_MAX"
    start_bucketfs "$CONFIG"
    create_export ledger "${ledger_export_mib}M"
    create_export noise "${NOISE_EXPORT_MIB}M"
    : >"$ledger"
    : >"$wlog"
    : >"$nlog"
    for ((round = 1; round <= rounds; round++)); do
        next="$(next_index "$ledger")"
        if ((next >= ledger_records_max)); then
            log "the ledger export is full after $((round - 1)) rounds: no more rounds"
            out="$(ledger_py check "$(nbd_uri ledger)" "$ledger" 0 2>&1)" ||
                { echo "$out" >&2; die "the final full ledger check failed"; }
            log "final full check: ${out#ledger check: }"
            break
        fi
        before="$(acked_count "$ledger")"
        t0="$EPOCHREALTIME"
        echo "== round $round" >"$wround"
        echo "== round $round" >"$nround"
        "$NBD_PYTHON" "$LEDGER_PY" noise "$(nbd_uri noise)" 2>>"$nround" &
        npid=$!
        register_pid "$npid"
        "$NBD_PYTHON" "$LEDGER_PY" write "$(nbd_uri ledger)" "$ledger" "$next" 2>>"$wround" &
        wpid=$!
        register_pid "$wpid"
        # Pick the moment of the kill only once both clients are at work.
        wait_for "$CLIENT_READY_S" acked_more_than "$ledger" "$before" ||
            { cat "$wround" >&2; die "round $round: the ledger writer acknowledged no record within ${CLIENT_READY_S}s"; }
        wait_for "$CLIENT_READY_S" grep -q "first write acknowledged" "$nround" ||
            { cat "$nround" >&2; die "round $round: the noise load wrote nothing within ${CLIENT_READY_S}s"; }
        ready_ms="$(ms_since "$t0")"
        delay_ms=$((KILL_AFTER_MS_MIN + RANDOM % (kill_after_ms_max - KILL_AFTER_MS_MIN + 1)))
        sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
        pid_alive "$wpid" || grep -q "export full" "$wround" ||
            { cat "$wround" >&2; die "round $round: the ledger writer exited before the kill"; }
        pid_alive "$npid" || { cat "$nround" >&2; die "round $round: the noise load exited before the kill"; }
        kill9_bucketfs
        kill_line="$(wc -l <"$BUCKETFS_LOG")"
        wait_exit "$wpid" "$CLIENT_EXIT_S"
        wrc="$EXIT_STATUS"
        wait_exit "$npid" "$CLIENT_EXIT_S"
        nrc="$EXIT_STATUS"
        cat "$wround" >>"$wlog"
        cat "$nround" >>"$nlog"
        [[ "$wrc" == 0 ]] ||
            { cat "$wround" >&2; die "round $round: the ledger writer ended with status $wrc after the kill (expected 0: connection died)"; }
        [[ "$nrc" == 0 ]] ||
            { cat "$nround" >&2; die "round $round: the noise load ended with status $nrc after the kill (expected 0: connection died)"; }
        cache_note=""
        if ((round % CACHE_LOSS_EVERY == 0)); then
            rm -rf "$CACHE_DIR"
            cache_losses=$((cache_losses + 1))
            cache_note=", cache directory deleted"
        fi
        t0="$EPOCHREALTIME"
        start_bucketfs "$CONFIG"
        restart_ms="$(ms_since "$t0")"
        check_first="$prev_next"
        prev_next="$next"
        if ((round % FULL_CHECK_EVERY == 0 || round == rounds)); then
            check_first=0
        fi
        t0="$EPOCHREALTIME"
        out="$(ledger_py check "$(nbd_uri ledger)" "$ledger" "$check_first" 2>&1)" || {
            echo "$out" >&2
            log_around_kill "$kill_line"
            die "round $round: the ledger check failed after kill -9 at ${delay_ms} ms$cache_note (writer: $(tail -n 1 "$wlog"))"
        }
        ((check_first > 0)) || full_checks=$((full_checks + 1))
        present="${out#*present=}"
        verified=$((verified + ${present%% *}))
        check_ms="$(ms_since "$t0")"
        log "round $round: killed after ${delay_ms} ms$cache_note; +$(($(acked_count "$ledger") - before)) acknowledged; clients ready in ${ready_ms} ms, restart ${restart_ms} ms, check ${check_ms} ms; ${out#ledger check: }"
    done
    stop_bucketfs
    log "totals: $((round - 1)) rounds ($cache_losses with the cache deleted), $(acked_count "$ledger") records acknowledged, $verified acknowledged records read back intact over all checks ($full_checks full), $((SECONDS - began)) s"
}

for_each_backend run_case
