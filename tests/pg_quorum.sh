#!/usr/bin/env bash
# tests/pg_ledger.sh through a journal of three targets with a write quorum of two
# ([[storage.journal.targets]], docs/0009-journal-tier.md). Over S3 (moto) the bucket sits behind
# bench/s3proxy.py at 20 ms and the targets are prefixes behind proxies of their own at 2, 5 and
# 20 ms, the third refusing every request from the start: bucketfs is killed with SIGKILL under
# pgbench with synchronous_commit = on, every acknowledged id must survive and pg_amcheck must be
# clean. Then, on the NBD level: a flush returns while the bucket and one target refuse every
# request, and is there after kill -9 and a start that reads two targets; a start that can read
# only one refuses and names --accept-journal-loss. Over file:// the targets are three local
# directories, deleted while the server is down.
set -euo pipefail
PG_LEDGER_JOURNAL=2
: "${BUCKETFS_PG_LEDGER_ROUNDS:=2}"
export BUCKETFS_PG_LEDGER_ROUNDS
# shellcheck source=tests/pg_ledger.sh
source "$(dirname "$0")/pg_ledger.sh"
