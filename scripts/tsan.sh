#!/usr/bin/env bash
# Runs every Rust test under ThreadSanitizer (nightly toolchain with the
# rust-src component: `rustup component add rust-src --toolchain nightly`).
# Not part of .ci/run: a fresh machine may not have them. Thread-leak reports
# are off because two tests deliberately detach a reconcile that never
# returns; any data-race report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/tsan}
export RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread"
export TSAN_OPTIONS="report_thread_leaks=0 halt_on_error=1"
cargo +nightly test -Zbuild-std --target "$(rustc -vV | sed -n 's/^host: //p')" --tests "$@"
