#!/usr/bin/env bash
# tests/pg_ledger.sh through the journal tier ([storage.journal], docs/0009-journal-tier.md): on
# S3 (moto) behind bench/s3proxy.py adding 20 ms to every request, PostgreSQL's commits are
# acknowledged once their log objects are in the local journal, and the bucket gets them in the
# background. bucketfs is killed with SIGKILL at random moments under pgbench with
# synchronous_commit = on; every acknowledged id must survive, and pg_amcheck must be clean.
# Then, on the NBD level: a flush returns while the store refuses every request, and the data
# is there after kill -9 and a restart; a deleted journal, or none configured, makes
# `bucketfs run` refuse to start and name --accept-journal-loss, which then starts it.
set -euo pipefail
PG_LEDGER_JOURNAL=1
: "${BUCKETFS_PG_LEDGER_ROUNDS:=3}"
export BUCKETFS_PG_LEDGER_ROUNDS
# shellcheck source=tests/pg_ledger.sh
source "$(dirname "$0")/pg_ledger.sh"
