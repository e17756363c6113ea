//! The durable store (guarantees §9): S2 stop/restart with every key
//! state, S3 exclusivity, bad files, flush failures (disk full) and S1
//! crashes by SIGKILL of a child process.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TempDir, wait_for};
use reconq::{
    Action, Context, Controller, ControllerHandle, ExponentialBackoff, KeyStatus, ReconcileError, SqliteStore,
    StoreError, StoredState,
};

const HOUR: Duration = Duration::from_secs(3600);
const LONG: Duration = Duration::from_secs(60);

/// Retries wait an hour, so retried keys stay delayed through the test.
fn hour_limiter() -> ExponentialBackoff<String> {
    ExponentialBackoff::new(HOUR, HOUR)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open_with_flush_interval(path, HOUR).unwrap()
}

type Calls = Arc<Mutex<Vec<(String, u32, i32)>>>;

/// A controller that records its calls and succeeds, except `fail*` keys
/// (retried), `park*` keys (parked) and `block` (waits for a stop).
fn controller(store: SqliteStore, calls: &Calls) -> Controller<String> {
    let calls = Arc::clone(calls);
    Controller::new("s2", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        calls.lock().unwrap().push((key.clone(), ctx.attempt(), ctx.priority()));
        if key == "block" {
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err("cancelled".into());
        }
        if key.starts_with("fail") {
            return Err("backend down".into());
        }
        if key.starts_with("park") {
            return Err(ReconcileError::permanent("bad spec"));
        }
        Ok(Action::Done)
    })
    .rate_limiter(hour_limiter())
    .store(store)
}

fn called(calls: &Calls, key: &str) -> bool {
    calls.lock().unwrap().iter().any(|(k, _, _)| k == key)
}

fn state(handle: &ControllerHandle<String>, key: &str) -> KeyStatus {
    handle.inspect(&key.to_string()).state
}

#[test]
fn s2_stop_and_restart_keep_every_key_state() {
    let dir = TempDir::new();
    let calls = Calls::default();
    let handle = controller(open(&dir.db()), &calls).start();
    for key in ["done", "fail", "park"] {
        handle.enqueue(key.to_string());
    }
    handle.enqueue_after("later".to_string(), HOUR);
    wait_for("done, fail and park reconciled", || ["done", "fail", "park"].iter().all(|k| called(&calls, k)));
    wait_for("fail retried, park parked", || {
        matches!(state(&handle, "fail"), KeyStatus::Waiting { .. }) && state(&handle, "park") == KeyStatus::Parked
    });
    // One worker busy on `block`: keys enqueued now wait ready at the stop.
    handle.enqueue("block".to_string());
    wait_for("block running", || called(&calls, "block"));
    handle.enqueue_with_priority("ready-high".to_string(), 7);
    handle.enqueue("ready-low".to_string());
    handle.stop();
    assert!(handle.join_timeout(LONG));

    let calls2 = Calls::default();
    let store = open(&dir.db());
    // Two workers: `block` blocks one again until the stop.
    let restarted = controller(store, &calls2).workers(2);
    let handle2 = restarted.handle();
    let handle2_started = restarted.start();
    // Delayed keys keep their due time, the failure count continues.
    assert!(matches!(state(&handle2, "later"), KeyStatus::Waiting { .. }));
    let fail = handle2.inspect(&"fail".to_string());
    assert!(matches!(fail.state, KeyStatus::Waiting { .. }), "{fail:?}");
    assert_eq!(fail.attempts, 1);
    assert_eq!(handle2.parked(), vec!["park".to_string()]);
    assert_eq!(handle2.inspect(&"park".to_string()).last_error.as_deref(), Some("bad spec"));
    wait_for("ready keys and the interrupted one reconciled", || {
        ["ready-high", "ready-low", "block"].iter().all(|k| called(&calls2, k))
    });
    let calls2_seen = calls2.lock().unwrap().clone();
    assert!(!calls2_seen.iter().any(|(k, _, _)| k == "done"), "a completed key came back: {calls2_seen:?}");
    let high = calls2_seen.iter().find(|(k, _, _)| k == "ready-high").unwrap();
    assert_eq!(high.2, 7, "priority kept");
    let block = calls2_seen.iter().find(|(k, _, _)| k == "block").unwrap();
    assert_eq!(block.1, 1, "the cancelled reconcile's failure counts");
    handle2_started.stop();
    assert!(handle2_started.join_timeout(LONG));
}

#[test]
fn s2_completed_keys_leave_the_file() {
    let dir = TempDir::new();
    let calls = Calls::default();
    let handle = controller(open(&dir.db()), &calls).workers(2).start();
    for i in 0..500 {
        handle.enqueue(format!("k{i}"));
    }
    assert!(handle.wait_idle(LONG));
    assert!(handle.stop_with_drain(LONG));
    assert!(open(&dir.db()).load("s2").unwrap().is_empty());
}

/// A key that ended is marked for the store before `wait_idle` can see
/// it done: a flush after `wait_idle` deletes the row a flush wrote while
/// the key ran. (Marked after the queue lock, a flush could take the
/// marks first and leave the key's row as waiting: 1 round in 30 under
/// load.) Many rounds, each with keys running at the first flush.
#[test]
fn a_flush_after_wait_idle_finds_every_ended_key() {
    let dir = TempDir::new();
    let gate = Arc::new(parking_lot::Mutex::new(()));
    let blocked = Arc::clone(&gate);
    let handle = Controller::new("s2", move |_: &String, _: &Context| -> Result<Action, ReconcileError> {
        drop(blocked.lock());
        Ok(Action::Done)
    })
    .store(open(&dir.db()))
    .workers(2)
    .start();
    let reader = open(&dir.db());
    for round in 0..60 {
        let held = gate.lock();
        for i in 0..4 {
            handle.enqueue(format!("r{round}k{i}"));
        }
        wait_for("two keys running", || handle.stats().processing == 2);
        handle.flush().unwrap();
        assert_eq!(reader.load("s2").unwrap().len(), 4, "round {round}: running keys are kept as waiting");
        drop(held);
        assert!(handle.wait_idle(LONG));
        handle.flush().unwrap();
        assert_eq!(reader.load("s2").unwrap(), [], "round {round}: every ended key left the file");
    }
    handle.stop();
}

#[test]
fn flushes_without_a_stop_within_the_interval() {
    let dir = TempDir::new();
    let store = SqliteStore::open_with_flush_interval(dir.db(), Duration::from_millis(50)).unwrap();
    let calls = Calls::default();
    let handle = controller(store, &calls).start();
    handle.enqueue_after("later".to_string(), HOUR);
    let reader = open(&dir.db());
    wait_for("the delayed key written", || reader.load("s2").unwrap().len() == 1);
    wait_for("store stats", || {
        handle.stats().store.is_some_and(|s| s.pending == 0 && s.last_flush_time.is_some() && s.error.is_none())
    });
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

#[test]
fn s3_a_second_live_holder_is_refused_and_a_stopped_one_releases() {
    let dir = TempDir::new();
    let calls = Calls::default();
    let first = controller(open(&dir.db()), &calls).start();
    first.enqueue_after("kept".to_string(), HOUR);
    let second = controller(open(&dir.db()), &calls).try_start().unwrap_err();
    let inner = second.get_ref().and_then(|e| e.downcast_ref::<StoreError>());
    assert!(matches!(inner, Some(StoreError::Locked(name)) if name == "s2"), "{second:?}");
    // Another name in the same file is fine.
    let other =
        Controller::new("other", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .store(open(&dir.db()))
            .try_start()
            .unwrap();
    other.stop();
    first.stop();
    assert!(first.join_timeout(LONG));
    let again = controller(open(&dir.db()), &calls).try_start().unwrap();
    assert!(matches!(state(&again, "kept"), KeyStatus::Waiting { .. }), "the refused start changed nothing");
    again.stop();
    assert!(again.join_timeout(LONG));
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_untouched() {
    let dir = TempDir::new();
    let garbage = b"this is not a database, just some text that happens to be here\n".repeat(20);
    std::fs::write(dir.db(), &garbage).unwrap();
    let err = SqliteStore::open(dir.db()).unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(std::fs::read(dir.db()).unwrap(), garbage);
}

#[test]
fn a_newer_schema_is_refused_and_untouched() {
    let dir = TempDir::new();
    drop(open(&dir.db()));
    {
        let conn = rusqlite_set_version(&dir.db(), reconq::SCHEMA_VERSION + 1);
        drop(conn);
    }
    let before = std::fs::read(dir.db()).unwrap();
    let err = SqliteStore::open(dir.db()).unwrap_err();
    assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("newer")), "{err}");
    assert_eq!(std::fs::read(dir.db()).unwrap(), before);
}

/// Sets `user_version` through a raw SQLite connection (as a newer reconq
/// would have written it).
fn rusqlite_set_version(path: &Path, version: i64) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    conn.pragma_update(None, "user_version", version).unwrap();
    conn
}

#[test]
fn an_unwritable_location_is_an_io_error() {
    let err = SqliteStore::open("/proc/reconq-no-such-dir/state.db").unwrap_err();
    assert!(matches!(err, StoreError::Io(_)), "{err}");
}

#[test]
fn rust_and_python_shapes_share_one_encoding() {
    // The bytes a Python ("ns", 3) key encodes to (tests/python/test_store.py
    // checks the same bytes from Python).
    let key = ("ns".to_string(), 3i64);
    assert_eq!(reconq::encode_key(&key), [4, 0, 0, 0, 2, 1, 0, 0, 0, 2, b'n', b's', 2, 0, 0, 0, 0, 0, 0, 0, 3]);
}

/// The crash child: reconciles keys `0..CRASH_KEYS` under load, failing
/// each key's first two attempts, and appends every call (`key attempt`)
/// to the log file `CALLS_ENV` names. A success is logged before it
/// returns, so a logged success may be reconciled again (at least once).
const CHILD_ENV: &str = "RECONQ_STORE_CRASH_CHILD";
const CALLS_ENV: &str = "RECONQ_STORE_CRASH_CALLS";
const CRASH_KEYS: usize = 300;

fn crash_child(dir: &Path) {
    use std::io::Write;
    let store = SqliteStore::open_with_flush_interval(dir.join("state.db"), Duration::from_millis(100)).unwrap();
    let calls = std::env::var(CALLS_ENV).unwrap();
    let log = Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(calls).unwrap());
    let handle = Controller::new("crash", move |key: &u64, ctx: &Context| -> Result<Action, ReconcileError> {
        std::thread::sleep(Duration::from_micros(200));
        writeln!(log.lock().unwrap(), "{key} {}", ctx.attempt()).unwrap();
        if ctx.attempt() < 2 { Err("not yet".into()) } else { Ok(Action::Done) }
    })
    .workers(4)
    .rate_limiter(ExponentialBackoff::new(Duration::from_millis(20), Duration::from_millis(200)))
    .store(store)
    .start();
    // The first run enqueues every key; later runs only restore.
    if !dir.join("enqueued").exists() {
        for key in 0..CRASH_KEYS as u64 {
            handle.enqueue(key);
        }
        std::fs::write(dir.join("enqueued"), b"").unwrap();
    }
    std::io::stdout().write_all(b"ready\n").unwrap();
    handle.wait_stopped(None);
}

/// Test `test` of this binary, to run as a child (its environment says
/// which part it plays), its stdout piped.
fn test_child(test: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", test, "--nocapture", "--test-threads=1"]).stdout(std::process::Stdio::piped());
    command
}

fn spawn_crash_child(dir: &Path, calls: &Path) -> std::process::Child {
    test_child("s1_sigkill_at_random_moments_loses_no_key").env(CHILD_ENV, dir).env(CALLS_ENV, calls).spawn().unwrap()
}

/// Blocks until the child has restored and started.
fn wait_ready(child: &mut std::process::Child) {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited early");
    }
}

fn kill(child: &mut std::process::Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

#[test]
fn s1_sigkill_at_random_moments_loses_no_key() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return crash_child(Path::new(&dir));
    }
    let dir = TempDir::new();
    let crashes = dir.0.join("crashes.log");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..20 {
        let mut child = spawn_crash_child(&dir.0, &crashes);
        wait_ready(&mut child);
        // The first round outlives S1's window (flush interval + 1 s), so
        // every key is stored; later rounds die at random moments.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = if round == 0 { 1200 } else { seed % 400 };
        std::thread::sleep(Duration::from_millis(wait));
        kill(&mut child);
    }
    // What the file holds now must be what the last run starts from: each
    // stored key's first call continues its stored failure count.
    let stored: Vec<(u64, u32)> = open(&dir.db())
        .load("crash")
        .unwrap()
        .into_iter()
        .map(|row| (reconq::decode_key::<u64>(&row.key).unwrap(), row.failures))
        .collect();
    let succeeded_before: HashSet<u64> =
        calls_in(&crashes).into_iter().filter(|(_, a)| *a >= 2).map(|(k, _)| k).collect();
    let stored_keys: HashSet<u64> = stored.iter().map(|(k, _)| *k).collect();
    for key in 0..CRASH_KEYS as u64 {
        assert!(
            succeeded_before.contains(&key) || stored_keys.contains(&key),
            "key {key} neither succeeded nor is stored: lost"
        );
    }
    let last = dir.0.join("last.log");
    let mut child = spawn_crash_child(&dir.0, &last);
    wait_ready(&mut child);
    wait_for("every stored key reconciled successfully", || {
        let done: HashSet<u64> = calls_in(&last).into_iter().filter(|(_, a)| *a >= 2).map(|(k, _)| k).collect();
        stored_keys.iter().all(|k| done.contains(k))
    });
    kill(&mut child);
    let last_calls = calls_in(&last);
    for (key, failures) in stored {
        let first = last_calls.iter().find(|(k, _)| *k == key).unwrap();
        assert_eq!(first.1, failures, "key {key}: the failure count did not continue");
    }
}

fn calls_in(log: &Path) -> Vec<(u64, u32)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (key, attempt) = line.split_once(' ')?;
            Some((key.parse().ok()?, attempt.parse().ok()?))
        })
        .collect()
}

const DISK_FULL_ENV: &str = "RECONQ_STORE_DISK_FULL_CHILD";

/// Limits the size of files this (child) process writes.
fn set_file_size_limit(bytes: libc::rlim_t) {
    common::set_soft_limit(libc::RLIMIT_FSIZE, bytes);
}

/// In a child whose writes a file size limit will make fail: a controller
/// "full" flushing every 50 ms, with SIGXFSZ ignored (so "file too large"
/// is an EFBIG error, not a kill).
fn full_disk_controller(dir: &Path) -> ControllerHandle<String> {
    full_disk_controller_flushing_every(dir, Duration::from_millis(50))
}

fn full_disk_controller_flushing_every(dir: &Path, interval: Duration) -> ControllerHandle<String> {
    // SAFETY: ignoring SIGXFSZ turns "file too large" into an EFBIG error.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let store = SqliteStore::open_with_flush_interval(dir.join("state.db"), interval).unwrap();
    Controller::new("full", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .store(store)
        .start()
}

/// Test `test` of this binary in a child of its own (a process-wide limit
/// must not reach the other tests): in that child, with `env` naming a
/// fresh directory, runs `child` on it and says it returned; here, runs
/// the child and asserts that it succeeded and said so (a child that ran
/// no test would succeed too).
fn run_in_child(test: &str, env: &str, child: fn(&Path)) {
    let returned = format!("{test}: the child returned");
    if let Ok(dir) = std::env::var(env) {
        child(Path::new(&dir));
        println!("{returned}");
        return;
    }
    let dir = TempDir::new();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, &dir.0)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains(&returned), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// In a child: a file size limit makes flushes fail (disk full); the
/// error shows in stats, nothing is dropped, and once the limit is lifted
/// the next flush writes every key.
fn disk_full_child(dir: &Path) {
    let handle = full_disk_controller(dir);
    set_file_size_limit(64 * 1024);
    const N: usize = 3000;
    for i in 0..N {
        handle.enqueue_after(format!("{i:0>100}"), HOUR);
    }
    wait_for("a failed flush reported", || handle.stats().store.is_some_and(|s| s.error.is_some()));
    let table = reconq::status::format_table(&reconq::status::snapshot());
    assert!(table.lines().any(|l| l.starts_with("full ") && l.contains("store: ")), "{table}");
    let stats = handle.stats().store.unwrap();
    assert!(stats.pending > 0, "the failed keys stay pending: {stats:?}");
    assert_eq!(handle.stats().waiting, N, "nothing dropped from memory");
    set_file_size_limit(libc::RLIM_INFINITY);
    wait_for("a flush after the limit is lifted", || {
        handle.stats().store.is_some_and(|s| s.error.is_none() && s.pending == 0)
    });
    handle.stop();
    assert!(handle.join_timeout(LONG));
    assert_eq!(open(&dir.join("state.db")).load("full").unwrap().len(), N);
}

#[test]
fn disk_full_is_reported_and_retried_with_nothing_lost() {
    run_in_child("disk_full_is_reported_and_retried_with_nothing_lost", DISK_FULL_ENV, disk_full_child);
}

/// S2 under the race of item 7b: a reconcile that raises `RetryAfter`
/// once `stop_with_drain` has shut the queue down (the queue then refuses
/// the retry) leaves its key delayed at its due time, not ready.
#[test]
fn s2_a_retry_raised_while_a_drain_begins_keeps_its_due_time() {
    let dir = TempDir::new();
    let own: Arc<std::sync::OnceLock<ControllerHandle<String>>> = Arc::default();
    let in_reconcile = Arc::new(std::sync::Barrier::new(2));
    let (own2, in_reconcile2) = (Arc::clone(&own), Arc::clone(&in_reconcile));
    let handle = Controller::new("race", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        if key != "retry" {
            return Ok(Action::Done);
        }
        in_reconcile2.wait();
        // Blocks until the stop has shut the queue down: from then on an
        // enqueue is refused, so the probe stays unknown.
        let own = own2.get().unwrap();
        wait_for("the drain shut the queue down", || {
            own.enqueue_after("probe".to_string(), HOUR);
            state(own, "probe") == KeyStatus::Unknown
        });
        Err(ReconcileError::retry_after(HOUR, "come back in an hour"))
    })
    .store(open(&dir.db()))
    .start();
    own.set(handle.clone()).unwrap();
    handle.enqueue("retry".to_string());
    in_reconcile.wait();
    let report = handle.stop_with_drain_report(LONG);
    assert!(report.finished && report.store_error.is_none(), "{report:?}");

    let again =
        Controller::new("race", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .store(open(&dir.db()))
            .start();
    match state(&again, "retry") {
        KeyStatus::Waiting { until } => {
            assert!(until > std::time::Instant::now() + HOUR / 2, "restored due too early")
        }
        other => panic!("the retried key came back {other:?}, not waiting for its due time"),
    }
    again.stop();
    assert!(again.join_timeout(LONG));
}

const FINAL_FLUSH_ENV: &str = "RECONQ_STORE_FINAL_FLUSH_CHILD";

/// In a child: keys flushed while the disk had room stay in the file; a
/// stop whose last flush fails (file size limit) says so in its report and
/// in stats, with the unwritten keys still pending.
fn final_flush_child(dir: &Path) {
    let handle = full_disk_controller(dir);
    let reader = open(&dir.join("state.db"));
    for i in 0..10 {
        handle.enqueue_after(format!("early-{i}"), HOUR);
    }
    wait_for("the early keys written", || reader.load("full").unwrap().len() == 10);
    set_file_size_limit(64 * 1024);
    const N: usize = 3000;
    for i in 0..N {
        handle.enqueue_after(format!("{i:0>100}"), HOUR);
    }
    let report = handle.stop_with_drain_report(LONG);
    assert!(report.store_error.is_some(), "the failed last flush is reported: {report:?}");
    let flushed = handle.flush().expect_err("flush() after a stop returns its failed last flush");
    assert!(flushed.to_string().contains("store I/O error"), "{flushed}");
    let stats = handle.stats().store.unwrap();
    assert!(stats.error.is_some() && stats.pending >= N, "the error stays visible: {stats:?}");
    set_file_size_limit(libc::RLIM_INFINITY);
    let rows = open(&dir.join("state.db")).load("full").unwrap();
    let early = rows.iter().filter(|row| reconq::decode_key::<String>(&row.key).unwrap().starts_with("early-"));
    assert_eq!(early.count(), 10, "what was on disk before the stop is still there");
}

#[test]
fn s2_a_failed_last_flush_is_reported_and_loses_nothing_written_before() {
    let test = "s2_a_failed_last_flush_is_reported_and_loses_nothing_written_before";
    run_in_child(test, FINAL_FLUSH_ENV, final_flush_child);
}

#[test]
fn a_path_that_is_no_file_is_refused() {
    for path in ["", ":memory:"] {
        let err = SqliteStore::open(path).unwrap_err();
        assert!(matches!(err, StoreError::Invalid(ref m) if m.contains("store path")), "{path:?}: {err}");
    }
}

#[test]
fn a_corrupt_row_names_the_file_the_controller_and_the_key() {
    let dir = TempDir::new();
    drop(open(&dir.db()));
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute(
        "INSERT INTO keys (controller, key, state, failures, priority) VALUES ('s2', x'01000000016b', 0, -5, 0)",
        [],
    )
    .unwrap();
    drop(conn);
    let calls = Calls::default();
    let err = controller(open(&dir.db()), &calls).try_start().unwrap_err();
    let inner = err.get_ref().and_then(|e| e.downcast_ref::<StoreError>());
    let Some(StoreError::Invalid(message)) = inner else { panic!("not Invalid: {err:?}") };
    for part in [&dir.db().display().to_string(), "\"s2\"", "[01, 00, 00, 00, 01, 6b]", "corrupt"] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
}

/// The edges and the caches' key sets are read at start as the keys are: a
/// row that cannot be read stops the start, naming the file, the
/// controller and the row's kind.
#[test]
fn a_corrupt_edge_or_cache_row_names_the_file_and_the_controller() {
    for (insert, kind) in [
        ("INSERT INTO edges (controller, child, parent, position) VALUES ('s2', 'text', x'01', 0)", "edge"),
        ("INSERT INTO cache_keys (controller, cache, key, version) VALUES ('s2', x'00', x'01', NULL)", "cache row"),
    ] {
        let dir = TempDir::new();
        drop(open(&dir.db()));
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        conn.execute(insert, []).unwrap();
        drop(conn);
        let calls = Calls::default();
        let err = controller(open(&dir.db()), &calls).try_start().unwrap_err();
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<StoreError>());
        let Some(StoreError::Invalid(message)) = inner else { panic!("{kind}: not Invalid: {err:?}") };
        for part in [dir.db().display().to_string(), "\"s2\"".to_string(), format!("a corrupt {kind}")] {
            assert!(message.contains(&part), "{message:?} lacks {part:?}");
        }
    }
}

const BURST_ENV: &str = "RECONQ_STORE_BURST_CHILD";
const BURST_KEYS: u64 = 300_000;
const BURST_INTERVAL: Duration = Duration::from_secs(1);

/// The bursts' controller: `u64` keys, a no-op reconcile, on `store`.
fn burst_controller(store: SqliteStore) -> ControllerHandle<u64> {
    Controller::new("burst", |_: &u64, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .store(store)
        .start()
}

/// The burst child: enqueues `BURST_KEYS` keys at once (each delayed an
/// hour, so every one must be written), says so, and waits to be killed.
fn burst_child(dir: &Path) {
    use std::io::Write;
    let store = SqliteStore::open_with_flush_interval(dir.join("state.db"), BURST_INTERVAL).unwrap();
    let handle = burst_controller(store);
    for key in 0..BURST_KEYS {
        handle.enqueue_after(key, HOUR);
    }
    std::io::stdout().write_all(b"ready\n").unwrap();
    handle.wait_stopped(None);
}

/// S1 as written, for a burst: SIGKILL `flush_interval` + 1 s after the
/// last key of a 100,000-key burst was enqueued, and a restart has every
/// key.
#[test]
fn s1_a_burst_is_stored_within_the_interval_plus_a_second() {
    if let Ok(dir) = std::env::var(BURST_ENV) {
        return burst_child(Path::new(&dir));
    }
    let dir = TempDir::new();
    let mut child =
        test_child("s1_a_burst_is_stored_within_the_interval_plus_a_second").env(BURST_ENV, &dir.0).spawn().unwrap();
    wait_ready(&mut child);
    // The bound S1 promises, measured from the burst's end: this sleep is
    // the guarantee under test, not a wait for a condition.
    std::thread::sleep(BURST_INTERVAL + Duration::from_secs(1));
    kill(&mut child);
    let restarted = burst_controller(open(&dir.db()));
    let waiting = restarted.stats().waiting;
    restarted.stop();
    assert!(restarted.join_timeout(LONG));
    assert_eq!(waiting, BURST_KEYS as usize, "keys enqueued more than flush_interval + 1 s before the kill were lost");
}

/// A burst is written while it is being marked, not at the next tick: with
/// a tick ten minutes away, a burst larger than the flusher's no-aging
/// bound (128k keys) is written at once, so a million-key burst does not
/// add a tick's wait to its write (S1).
#[test]
fn a_burst_is_written_without_waiting_for_the_tick() {
    const KEYS: u64 = 150_000;
    let dir = TempDir::new();
    let store = SqliteStore::open_with_flush_interval(dir.db(), Duration::from_secs(1200)).unwrap();
    let handle = burst_controller(store);
    for key in 0..KEYS {
        handle.enqueue_after(key, HOUR);
    }
    // The flush that the burst set off takes at least the 128k marks that
    // set it off; the rest waits for the tick, ten minutes away.
    let pending = || handle.stats().store.unwrap().pending as u64;
    wait_for("the burst's first 128k keys written before the tick", || pending() <= KEYS - 128 * 1024);
    assert!(open(&dir.db()).load("burst").unwrap().len() as u64 >= 128 * 1024);
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

fn file_len(db: &Path, suffix: &str) -> u64 {
    let mut path = db.as_os_str().to_owned();
    path.push(suffix);
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Once a large batch completed and the store went idle, the WAL is
/// checkpointed into the main file and truncated, and the main file gives
/// the pages of the deleted rows back: the store is one file again, about
/// the size of what it holds.
#[test]
fn an_idle_store_is_one_file_that_shrinks_after_a_large_batch() {
    let dir = TempDir::new();
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let gate2 = Arc::clone(&gate);
    let store = SqliteStore::open_with_flush_interval(dir.db(), Duration::from_millis(50)).unwrap();
    let handle = Controller::new("idle", move |_: &u64, _: &Context| -> Result<Action, ReconcileError> {
        let (open, cv) = &*gate2;
        let mut open = open.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        Ok(Action::Done)
    })
    .store(store)
    .start();
    const N: u64 = 20_000;
    for key in 0..N {
        handle.enqueue(key);
    }
    let reader = open(&dir.db());
    wait_for("the batch written, the WAL checkpointed", || {
        reader.load("idle").unwrap().len() as u64 == N && file_len(&dir.db(), "-wal") == 0
    });
    let full = file_len(&dir.db(), "");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    assert!(handle.wait_idle(LONG));
    wait_for("the rows deleted, the file shrunk, the WAL empty", || {
        reader.load("idle").unwrap().is_empty()
            && file_len(&dir.db(), "") < full / 4
            && file_len(&dir.db(), "-wal") == 0
    });
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

// flush(): everything changed before it returned is on disk.

/// Long enough that no tick writes during a test: only `flush()` (or a
/// stop) can have written what the file holds.
const NO_TICK: Duration = Duration::from_secs(30);

const FLUSH_CHILD_ENV: &str = "RECONQ_STORE_FLUSH_CHILD";
const FLUSH_ROUND_ENV: &str = "RECONQ_STORE_FLUSH_ROUND";
const FLUSH_KEYS: usize = 40;

/// The keys round `round` of the flush child leaves pending, with the
/// state each must be stored in.
fn flush_round_keys(round: usize) -> Vec<(String, Kept)> {
    let mut keys = Vec::new();
    for i in 0..4 {
        keys.push((format!("block-{round}-{i}"), Kept::Waiting));
    }
    for i in 0..FLUSH_KEYS {
        keys.push((format!("fail-{round}-{i}"), Kept::Retried));
        keys.push((format!("park-{round}-{i}"), Kept::Parked));
        keys.push((format!("ready-{round}-{i}"), Kept::Waiting));
        keys.push((format!("later-{round}-{i}"), Kept::Delayed));
    }
    keys
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    Waiting,
    Delayed,
    Retried,
    Parked,
}

/// The flush child: with flushes 30 s apart, retried and parked keys
/// (reconciled first), keys in flight (`block*` never return), ready keys
/// behind them and delayed ones, then `flush()`, then "flushed" on stdout,
/// which the parent answers with SIGKILL.
fn flush_child(dir: &Path) {
    use std::io::Write;
    let round: usize = std::env::var(FLUSH_ROUND_ENV).unwrap().parse().unwrap();
    let store = SqliteStore::open_with_flush_interval(dir.join(format!("round-{round}.db")), NO_TICK).unwrap();
    let handle = Controller::new("flush", |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        if key.starts_with("block") {
            loop {
                std::thread::park();
            }
        }
        if key.starts_with("park") {
            return Err(ReconcileError::permanent("bad spec"));
        }
        Err("backend down".into())
    })
    .workers(4)
    .rate_limiter(hour_limiter())
    .store(store)
    .start();
    let keys = flush_round_keys(round);
    let named = |prefix: &'static str| keys.iter().map(|(k, _)| k.clone()).filter(move |k| k.starts_with(prefix));
    for key in named("fail").chain(named("park")) {
        handle.enqueue(key);
    }
    wait_for("the fail and park keys reconciled", || {
        let stats = handle.stats();
        stats.parked == FLUSH_KEYS && stats.reconciles as usize == 2 * FLUSH_KEYS
    });
    named("block").for_each(|key| handle.enqueue(key));
    wait_for("every worker blocked", || handle.stats().processing == 4);
    named("ready").for_each(|key| handle.enqueue(key));
    named("later").for_each(|key| handle.enqueue_after(key, HOUR));
    handle.flush().unwrap();
    std::io::stdout().write_all(b"flushed\n").unwrap();
    handle.wait_stopped(None);
}

/// Blocks until the child printed `word` on its stdout.
fn wait_line(child: &mut std::process::Child, word: &str) {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(word) {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited before {word:?}");
    }
}

#[test]
fn flush_writes_everything_changed_before_it_so_a_sigkill_after_it_loses_nothing() {
    let test = "flush_writes_everything_changed_before_it_so_a_sigkill_after_it_loses_nothing";
    if let Ok(dir) = std::env::var(FLUSH_CHILD_ENV) {
        return flush_child(Path::new(&dir));
    }
    let dir = TempDir::new();
    for round in 0..10 {
        let mut child =
            test_child(test).env(FLUSH_CHILD_ENV, &dir.0).env(FLUSH_ROUND_ENV, round.to_string()).spawn().unwrap();
        wait_line(&mut child, "flushed");
        kill(&mut child);
        let rows = open(&dir.0.join(format!("round-{round}.db"))).load("flush").unwrap();
        let stored: std::collections::HashMap<String, (Kept, u32)> = rows
            .into_iter()
            .map(|row| {
                let state = match row.state {
                    StoredState::Waiting => Kept::Waiting,
                    StoredState::Delayed { .. } if row.failures > 0 => Kept::Retried,
                    StoredState::Delayed { .. } => Kept::Delayed,
                    StoredState::Parked { .. } => Kept::Parked,
                };
                (reconq::decode_key::<String>(&row.key).unwrap(), (state, row.failures))
            })
            .collect();
        for (key, expected) in flush_round_keys(round) {
            let found = stored.get(&key).map(|(state, _)| *state);
            assert_eq!(found, Some(expected), "round {round}: key {key} enqueued before flush() returned");
        }
    }
}

/// In a child: a flush() whose write fails (file size limit) returns the
/// store error; the keys stay pending and the next flush() writes them.
fn failed_flush_child(dir: &Path) {
    let handle = full_disk_controller_flushing_every(dir, NO_TICK);
    set_file_size_limit(64 * 1024);
    const N: usize = 3000;
    for i in 0..N {
        handle.enqueue_after(format!("{i:0>100}"), HOUR);
    }
    let err = handle.flush().expect_err("a write past the file size limit fails");
    let store_error = err.get_ref().and_then(|inner| inner.downcast_ref::<StoreError>());
    assert!(matches!(store_error, Some(StoreError::Io(_))), "{err:?}");
    assert!(err.to_string().contains("store I/O error"), "{err}");
    let stats = handle.stats();
    let store = stats.store.clone().unwrap();
    assert!(store.pending >= N && store.error.is_some(), "the keys stay pending: {store:?}");
    assert_eq!(stats.waiting, N, "nothing dropped from memory");
    set_file_size_limit(libc::RLIM_INFINITY);
    handle.flush().unwrap();
    assert_eq!(handle.stats().store.unwrap().pending, 0);
    assert_eq!(open(&dir.join("state.db")).load("full").unwrap().len(), N);
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

#[test]
fn a_failed_flush_returns_the_store_error_and_keeps_the_keys_pending() {
    const ENV: &str = "RECONQ_STORE_FAILED_FLUSH_CHILD";
    run_in_child("a_failed_flush_returns_the_store_error_and_keeps_the_keys_pending", ENV, failed_flush_child);
}

#[test]
fn concurrent_flushes_all_return_with_their_keys_written() {
    let dir = TempDir::new();
    let store = SqliteStore::open_with_flush_interval(dir.db(), NO_TICK).unwrap();
    let handle =
        Controller::new("many", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .store(store)
            .start();
    let reader = open(&dir.db());
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let handle = handle.clone();
            let reader = reader.clone();
            std::thread::spawn(move || {
                for round in 0..20 {
                    let key = format!("{thread}-{round}");
                    handle.enqueue_after(key.clone(), HOUR);
                    handle.flush().unwrap();
                    let rows = reader.load("many").unwrap();
                    let key = reconq::encode_key(&key);
                    assert!(rows.iter().any(|row| row.key == key), "thread {thread}, round {round}: not written");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(reader.load("many").unwrap().len(), 8 * 20);
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

#[test]
fn flush_before_start_is_an_error_and_without_a_store_returns_at_once() {
    let dir = TempDir::new();
    let calls = Calls::default();
    let unstarted = controller(open(&dir.db()), &calls);
    let err = unstarted.handle().flush().expect_err("nothing is claimed before start");
    assert_eq!(err.kind(), std::io::ErrorKind::Other);
    assert!(err.to_string().contains("was not started"), "{err}");
    let plain =
        Controller::new("plain", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) });
    assert!(plain.handle().flush().is_err(), "not started, store or not");
    let plain = plain.start();
    plain.enqueue_after("later".to_string(), HOUR);
    plain.flush().unwrap();
    plain.stop();
    plain.flush().unwrap();
    assert!(plain.join_timeout(LONG));
}

#[test]
fn flush_during_a_stop_writes_what_changed_and_after_it_returns_its_outcome() {
    let dir = TempDir::new();
    let calls = Calls::default();
    let store = SqliteStore::open_with_flush_interval(dir.db(), NO_TICK).unwrap();
    let handle = controller(store, &calls).start();
    handle.enqueue("block".to_string());
    wait_for("block in flight", || called(&calls, "block"));
    handle.enqueue_after("later".to_string(), HOUR);
    // Without drain or deadline: the stop waits for `block`, which returns
    // only once cancelled, after this flush.
    let stopping = handle.stop_with(reconq::StopOptions { drain: false, timeout: None, aux_grace: None });
    handle.flush().unwrap();
    let stored: HashSet<String> =
        open(&dir.db()).load("s2").unwrap().iter().map(|row| reconq::decode_key::<String>(&row.key).unwrap()).collect();
    assert_eq!(stored, HashSet::from(["block".to_string(), "later".to_string()]));
    handle.cancel(&"block".to_string());
    let mut stopping = stopping;
    assert!(stopping.wait(LONG).is_some_and(|report| report.finished));
    assert!(handle.join_timeout(LONG));
    handle.flush().unwrap();
}

// ---------------------------------------------------------------------------
// Dependencies between keys (guarantees §14): edges are kept in the store.

/// A controller named "edges" on `store` whose reconciles succeed.
fn edges_controller(store: SqliteStore) -> Controller<String> {
    Controller::new("edges", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .store(store)
}

fn strings(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// Starts an `edges_controller`, setting dashboard → model before start
/// and model → source, config after.
fn start_with_edges(store: SqliteStore) -> ControllerHandle<String> {
    let controller = edges_controller(store);
    controller.handle().set_dependencies(&"dashboard".to_string(), strings(&["model"])).unwrap();
    let handle = controller.start();
    handle.set_dependencies(&"model".to_string(), strings(&["source", "config"])).unwrap();
    handle
}

/// The edges the file holds for controller "edges", as (child, parent),
/// sorted.
fn stored_edges(db: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt =
        conn.prepare("SELECT child, parent FROM edges WHERE controller = 'edges' ORDER BY child, position").unwrap();
    let rows = stmt.query_map([], |row| Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))).unwrap();
    let decode = |bytes: &[u8]| reconq::decode_key::<String>(bytes).unwrap();
    let mut edges: Vec<_> = rows.map(|row| row.unwrap()).map(|(c, p)| (decode(&c), decode(&p))).collect();
    edges.sort();
    edges
}

/// Edges set before and after start come back after a stop, in the order
/// set, and hold keys again (D1); parents set again before a restart win
/// over the stored ones; clearing them ([]) deletes their rows.
#[test]
fn edges_come_back_after_a_stop_and_clearing_them_deletes_their_rows() {
    let dir = TempDir::new();
    let handle = start_with_edges(open(&dir.db()));
    handle.set_dependencies(&"report".to_string(), strings(&["model"])).unwrap();
    handle.stop();
    assert!(handle.join_timeout(LONG));

    let restarted = edges_controller(open(&dir.db()));
    // Set again before start: these replace the stored parents of "report".
    restarted.handle().set_dependencies(&"report".to_string(), strings(&["source"])).unwrap();
    let handle = restarted.start();
    assert_eq!(handle.dependencies(&"model".to_string()), strings(&["source", "config"]));
    assert_eq!(handle.dependencies(&"dashboard".to_string()), strings(&["model"]));
    assert_eq!(handle.dependencies(&"report".to_string()), strings(&["source"]));
    // D1 holds with the restored edges: a cycle through them is refused.
    assert!(handle.set_dependencies(&"source".to_string(), strings(&["dashboard"])).is_err());
    handle.set_dependencies(&"model".to_string(), []).unwrap();
    handle.stop();
    assert!(handle.join_timeout(LONG));
    assert_eq!(
        stored_edges(&dir.db()),
        [("dashboard", "model"), ("report", "source")].map(|(c, p)| (c.to_string(), p.to_string()))
    );
}

const EDGES_ENV: &str = "RECONQ_STORE_EDGES_CHILD";
const EDGES_INTERVAL: Duration = Duration::from_secs(1);

/// The edges child: sets edges before and after start, says so, and waits
/// to be killed.
fn edges_child(dir: &Path) {
    use std::io::Write;
    let handle = start_with_edges(SqliteStore::open_with_flush_interval(dir.join("state.db"), EDGES_INTERVAL).unwrap());
    std::io::stdout().write_all(b"ready\n").unwrap();
    handle.wait_stopped(None);
}

/// S1 for edges: SIGKILL `flush_interval` + 1 s after the last edge was
/// set, and a restart has every edge.
#[test]
fn edges_set_more_than_the_interval_plus_a_second_before_a_sigkill_come_back() {
    if let Ok(dir) = std::env::var(EDGES_ENV) {
        return edges_child(Path::new(&dir));
    }
    let dir = TempDir::new();
    let test = "edges_set_more_than_the_interval_plus_a_second_before_a_sigkill_come_back";
    let mut child = test_child(test).env(EDGES_ENV, &dir.0).spawn().unwrap();
    wait_ready(&mut child);
    // The bound S1 promises: this sleep is the guarantee under test, not a
    // wait for a condition.
    std::thread::sleep(EDGES_INTERVAL + Duration::from_secs(1));
    kill(&mut child);
    let handle = edges_controller(open(&dir.db())).start();
    assert_eq!(handle.dependencies(&"model".to_string()), strings(&["source", "config"]));
    assert_eq!(handle.dependencies(&"dashboard".to_string()), strings(&["model"]));
    assert_eq!(handle.dependents(&"model".to_string()), strings(&["dashboard"]));
    handle.stop();
    assert!(handle.join_timeout(LONG));
}

/// A file of schema 1 (before edges were kept) is brought up to the
/// current one at open: its keys stay, and edges are kept from then on.
#[test]
fn a_schema_1_file_gains_the_edges_table_and_keeps_its_keys() {
    let dir = TempDir::new();
    {
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        conn.execute_batch(
            "CREATE TABLE keys (controller TEXT NOT NULL, key BLOB NOT NULL, state INTEGER NOT NULL,
                 due_unix_ms INTEGER, error TEXT, failures INTEGER NOT NULL, priority INTEGER NOT NULL,
                 PRIMARY KEY (controller, key)) WITHOUT ROWID;
             PRAGMA user_version = 1;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO keys VALUES ('edges', ?1, 2, NULL, 'bad spec', 0, 0)",
            [reconq::encode_key(&"parked".to_string())],
        )
        .unwrap();
    }
    let handle = edges_controller(open(&dir.db())).start();
    assert_eq!(handle.parked(), strings(&["parked"]));
    handle.set_dependencies(&"child".to_string(), strings(&["parent"])).unwrap();
    handle.stop();
    assert!(handle.join_timeout(LONG));
    assert_eq!(stored_edges(&dir.db()), [("child".to_string(), "parent".to_string())]);
    let version: i64 = rusqlite::Connection::open(dir.db())
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, reconq::SCHEMA_VERSION);
}

/// Parents set before start win over stored ones that would close a cycle
/// with them: those are dropped (logged), in memory and in the file.
#[test]
fn stored_edges_closing_a_cycle_with_ones_set_before_start_are_dropped() {
    let dir = TempDir::new();
    let handle = edges_controller(open(&dir.db())).start();
    handle.set_dependencies(&"model".to_string(), strings(&["source"])).unwrap();
    handle.set_dependencies(&"dashboard".to_string(), strings(&["model"])).unwrap();
    handle.stop();
    assert!(handle.join_timeout(LONG));

    let restarted = edges_controller(open(&dir.db()));
    restarted.handle().set_dependencies(&"source".to_string(), strings(&["dashboard"])).unwrap();
    let handle = restarted.start();
    assert_eq!(handle.dependencies(&"source".to_string()), strings(&["dashboard"]));
    // Keys are restored in the order of their encoding ("model" is
    // shorter): model's parents come back, dashboard's close the cycle.
    assert_eq!(handle.dependencies(&"model".to_string()), strings(&["source"]));
    assert_eq!(handle.dependencies(&"dashboard".to_string()), Vec::<String>::new());
    handle.stop();
    assert!(handle.join_timeout(LONG));
    assert_eq!(
        stored_edges(&dir.db()),
        [("model", "source"), ("source", "dashboard")].map(|(c, p)| (c.to_string(), p.to_string()))
    );
}
