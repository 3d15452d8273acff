#!/usr/bin/env bash
# The durability contract of DESIGN.md, seen from an NBD client:
#   - flushed data survives kill -9;
#   - every acknowledged but unflushed write is after a crash wholly present or wholly absent,
#     and what survives is a prefix of the acknowledged order;
#   - flushed data survives a clean stop/start and the loss of the cache directory;
#   - a clean stop (SIGTERM) flushes what nobody flushed;
#   - a write acknowledged with FUA survives kill -9, however many came just before the crash
#     (on file:// they are durable in the bucket's journal first: docs/0002-local-journal.md).
set -euo pipefail
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

requires qemu-io nbdcopy cmp

ROUNDS="${BUCKETFS_DURABILITY_ROUNDS:-3}"

# The unflushed writes of each round: "offset length" per request, in issue order. Disjoint,
# after pattern A's 4 MiB, sizes from one sector to several MiB, aligned and not.
B_REQUESTS=(
    "8388608 4096"
    "8400000 12345"
    "8454144 65536"
    "9437184 1048576"
    "11534336 512"
    "11600001 777777"
    "13631488 3145728"
    "17825792 131072"
    "18000000 4097"
    "20971520 2097152"
    "23068672 32768"
    "24000000 1"
)

crash_round() {
    local round="$1" delay="$2" gap_ms="$3" name="crash$1" args=() req off len out i qpid deadline
    local present=() state torn=0 acked
    create_export "$name" 64M
    # A: written and flushed; must survive anything.
    qio "$name" 'write -P 0xaa 0 4M' 'flush' || die "round $round: writing pattern A failed"
    # B: written with no flush and no FUA (writeback cache mode), then the client idles on an
    # open connection while the server is killed (qemu-io would flush when it closes).
    # With a gap between the writes, periodic flushes land among them, so a crash can keep
    # some of them and lose the later ones (the prefix check below then has work to do).
    for req in "${B_REQUESTS[@]}"; do
        args+=(-c "write -P 0xbb $req")
        ((gap_ms == 0)) || args+=(-c "sleep $gap_ms")
    done
    : >"$CASE_DIR/b$round.out"
    stdbuf -oL qemu-io -f raw -t writeback "${args[@]}" -c 'sleep 600000' "$(nbd_uri "$name")" \
        >"$CASE_DIR/b$round.out" 2>&1 &
    qpid=$!
    register_pid "$qpid"
    deadline=$((SECONDS + 120))
    while :; do
        acked="$(grep -c '^wrote ' "$CASE_DIR/b$round.out" || true)"
        ((${acked:-0} < ${#B_REQUESTS[@]})) || break
        if ! pid_alive "$qpid" || ((SECONDS > deadline)); then
            cat "$CASE_DIR/b$round.out" >&2
            die "round $round: qemu-io did not complete the ${#B_REQUESTS[@]} unflushed writes"
        fi
        sleep 0.05
    done
    sleep "$delay"
    log "round $round: all ${#B_REQUESTS[@]} unflushed writes acknowledged (${gap_ms} ms apart); kill -9 after ${delay}s"
    kill9_bucketfs
    kill -KILL "$qpid" 2>/dev/null || true
    wait "$qpid" 2>/dev/null || true

    start_bucketfs "$CONFIG"
    qio "$name" 'read -P 0xaa 0 4M' ||
        die "round $round: flushed pattern A (0xaa, 0..4M) did not survive kill -9"
    for i in "${!B_REQUESTS[@]}"; do
        read -r off len <<<"${B_REQUESTS[$i]}"
        if qio "$name" "read -P 0xbb $off $len" 2>/dev/null; then
            state=present
        elif qio "$name" "read -P 0 $off $len" 2>/dev/null; then
            state=absent
        else
            state=torn
            torn=$((torn + 1))
            out="$(qio_output "$name" "read -v $off $((len < 64 ? len : 64))")"
            echo "request $i (write -P 0xbb $off $len) is torn; first bytes: $out" >&2
        fi
        present+=("$state")
    done
    log "round $round: unflushed writes after crash: ${present[*]}"
    ((torn == 0)) || die "round $round: $torn unflushed write(s) torn by the crash (partly present)"
    # Ordering: what survives is a prefix of the acknowledged order.
    local seen_absent=0
    for i in "${!present[@]}"; do
        if [[ "${present[$i]}" == absent ]]; then
            seen_absent=1
        elif ((seen_absent)); then
            die "round $round: write $i (${B_REQUESTS[$i]}) survived the crash but an earlier one did not (not a prefix): ${present[*]}"
        fi
    done
    # The bytes between the requests were never written.
    qio "$name" 'read -P 0 4194304 4194304' 'read -P 0 25165824 4194304' ||
        die "round $round: never-written ranges are not zero after the crash"
}

# Thousands of small FUA writes, each a flush barrier of its own, with kill -9 in the middle:
# every acknowledged one must read back.
fua_crash() {
    local name=fua out="$CASE_DIR/fua.out" args=() i n=3000 acked=0 qpid deadline checks=()
    create_export "$name" 16M
    for ((i = 0; i < n; i++)); do
        args+=(-c "write -f -P $((i % 250 + 1)) $((i * 4096)) 4096")
    done
    : >"$out"
    stdbuf -oL qemu-io -f raw -t none "${args[@]}" -c 'sleep 600000' "$(nbd_uri "$name")" \
        >"$out" 2>&1 &
    qpid=$!
    register_pid "$qpid"
    deadline=$((SECONDS + 120))
    while ((acked < n / 3)); do
        if ! pid_alive "$qpid" || ((SECONDS > deadline)); then
            die "fua: qemu-io stopped after $acked writes"
        fi
        acked="$(grep -c '^wrote ' "$out" || true)"
        sleep 0.02
    done
    kill9_bucketfs
    kill -KILL "$qpid" 2>/dev/null || true
    wait "$qpid" 2>/dev/null || true
    acked="$(grep -c '^wrote ' "$out" || true)"
    log "fua: kill -9 after $acked acknowledged FUA writes"
    start_bucketfs "$CONFIG"
    if bucketfs_log_current | grep -q 'left in the journal'; then
        log "fua: the restart stored objects left in the bucket's journal"
    fi
    while read -r off; do
        i=$((off / 4096))
        checks+=("read -P $((i % 250 + 1)) $off 4096")
    done < <(sed -n 's/^wrote 4096\/4096 bytes at offset \([0-9]*\)$/\1/p' "$out")
    ((${#checks[@]} == acked)) || die "fua: could not parse the qemu-io output"
    qio "$name" "${checks[@]}" || die "fua: a write acknowledged with FUA was lost by kill -9"
}

clean_restart_and_cache_loss() {
    local src="$CASE_DIR/keep.img" out="$CASE_DIR/keep.out"
    log "flushed data across clean stop/start and cache loss"
    create_export keep 64M
    head -c 48M /dev/urandom >"$src"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy --flush "$src" "$(nbd_uri keep)" ||
        die "nbdcopy into export keep failed"
    # Written without a flush: a clean stop must flush it.
    QIO_OPTS="-t writeback" qio keep 'write -P 0xcd 50331648 1048576' ||
        die "unflushed write to keep failed"
    stop_bucketfs
    start_bucketfs "$CONFIG"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy "$(nbd_uri keep)" "$out" || die "nbdcopy out failed"
    truncate -s 48M "$out"
    cmp -s "$src" "$out" || die "flushed data differs after a clean stop/start"
    qio keep 'read -P 0xcd 50331648 1048576' ||
        die "a write acknowledged before SIGTERM was not flushed by the clean stop"

    stop_bucketfs
    [[ -d "$CACHE_DIR" ]] || log "note: cache dir $CACHE_DIR did not exist"
    rm -rf "$CACHE_DIR"
    start_bucketfs "$CONFIG"
    timeout "$BUCKETFS_CLIENT_TIMEOUT" nbdcopy "$(nbd_uri keep)" "$out" ||
        die "nbdcopy out after deleting the cache failed"
    truncate -s 48M "$out"
    cmp -s "$src" "$out" || die "data differs after deleting the cache directory"
    qio keep 'read -P 0xcd 50331648 1048576' || die "0xcd range differs after cache loss"
    rm -f "$src" "$out"
}

run_case() {
    local round delays=(0 1.5 0 3 0.7) intervals=(600000 1000 200 2500 500) gaps=(0 0 70 0 40)
    # Each round gets its own periodic-flush interval, so kill -9 lands sometimes with nothing
    # uploaded yet and sometimes in the middle of a periodic flush.
    for ((round = 1; round <= ROUNDS; round++)); do
        FLUSH_INTERVAL_MS="${intervals[$(((round - 1) % 5))]}"
        if ((round == 1)); then
            make_config "$CASE_DIR" "$BACKEND"
        else
            config_set "$CONFIG" storage flush_interval_ms "$FLUSH_INTERVAL_MS"
        fi
        log "round $round: flush_interval_ms=$FLUSH_INTERVAL_MS"
        bucketfs_alive || start_bucketfs "$CONFIG"
        crash_round "$round" "${delays[$(((round - 1) % 5))]}" "${gaps[$(((round - 1) % 5))]}"
        # Restart so the new flush interval is in force for the next round.
        stop_bucketfs
    done
    start_bucketfs "$CONFIG"
    fua_crash
    clean_restart_and_cache_loss
    # Exports of the crash rounds still hold their flushed data after all that.
    for ((round = 1; round <= ROUNDS; round++)); do
        qio "crash$round" 'read -P 0xaa 0 4M' || die "crash$round lost its pattern A later on"
    done
    stop_bucketfs
}

for_each_backend run_case
