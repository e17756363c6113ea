//! The metrics endpoint's connections: each answered on a thread of its
//! own, a bounded number at once, each within a deadline.
//!
//! Why: answered one at a time, a client that connects and sends nothing
//! (a port scanner, a stuck scraper) held up every probe behind it for the
//! whole read timeout, and Kubernetes restarts a pod whose `/healthz` takes
//! longer than its probe timeout (1 s by default). Now a slow client holds
//! only its own thread, and only until its deadline: reading the request
//! and writing the answer take at most [`DEADLINE`] in all, however the
//! client trickles its bytes. Beyond [`MAX_CONNECTIONS`] at once, a new
//! connection is closed unanswered, so clients can never make the server
//! spawn threads without bound. Plain OS threads, no async runtime: idle,
//! the accepting thread is blocked in `accept` and no other exists.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Connections answered at once; more are closed unanswered.
const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take to send its request and read the answer,
/// in all.
pub(super) const DEADLINE: Duration = Duration::from_secs(5);
/// The name of the threads that answer connections (the accepting one is
/// `reconq-metrics`).
const CONNECTION_THREAD: &str = "reconq-http";

/// Accepts connections until `stop` is set (and a connection wakes the
/// loop), answering each with `answer` on a thread of its own.
pub(super) fn accept_loop(listener: &TcpListener, stop: &AtomicBool, answer: fn(&mut Connection) -> io::Result<()>) {
    let open = Arc::new(AtomicUsize::new(0));
    for connection in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match connection {
            Ok(stream) => answer_apart(stream, &open, answer),
            // Out of file descriptors and the like: do not spin on it.
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Answers `stream` on a new thread if fewer than [`MAX_CONNECTIONS`] are
/// `open`; otherwise (or if no thread can be spawned) drops it, closing it.
fn answer_apart(stream: TcpStream, open: &Arc<AtomicUsize>, answer: fn(&mut Connection) -> io::Result<()>) {
    let Some(slot) = Slot::take(open) else { return };
    let mut connection = Connection { stream, deadline: Instant::now() + DEADLINE };
    // A failed spawn drops the closure, and with it the slot and the stream.
    let _ = thread::Builder::new().name(CONNECTION_THREAD.into()).spawn(move || {
        let _slot = slot;
        let _ = answer(&mut connection);
    });
}

/// One of the [`MAX_CONNECTIONS`] places, given back on drop.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_CONNECTIONS).then_some(n + 1))
            .ok()
            .map(|_| Self(Arc::clone(open)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted connection whose every read and write must end by its
/// deadline: each blocks at most for the time left, and fails with
/// `TimedOut` once none is.
pub(super) struct Connection {
    stream: TcpStream,
    deadline: Instant,
}

impl Connection {
    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the connection's deadline passed"));
        }
        Ok(left)
    }
}

impl Read for Connection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.time_left()?))?;
        self.stream.read(buf)
    }
}

impl Write for Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.time_left()?))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
