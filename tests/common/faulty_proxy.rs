//! A loopback proxy in front of etcd's JSON gateway that fails the
//! requests a test picks: the one failed call a busy etcd or a broken
//! connection causes, aimed at the call under test instead of at whatever
//! a `SIGSTOP` happens to catch.
//!
//! It reads each HTTP/1.1 request whole (head and `Content-Length` body:
//! the engine's `ureq` sends no chunked bodies and never pipelines), then
//! forwards it, answers `503` and closes the connection, or (a stalling
//! proxy, past its failures) never answers it. Replies are copied back as
//! they come, so streamed watches pass untouched.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

/// Which requests fail: asked of each request's body.
type Rule = dyn Fn(&[u8]) -> bool + Send + Sync;

/// What the proxy does with the requests its rule picks.
struct Faults {
    rule: Box<Rule>,
    /// How many picked requests fail (the first ones).
    failures: usize,
    /// Whether a request picked after those is never answered.
    stall_after: bool,
    failed: AtomicUsize,
    stalled: AtomicUsize,
}

pub struct FaultyProxy {
    pub endpoint: String,
    faults: Arc<Faults>,
    stopped: Arc<AtomicBool>,
}

impl FaultyProxy {
    /// Forwards to `upstream` (`http://host:port`), failing the first
    /// `failures` requests whose body `fail` picks.
    pub fn start(upstream: &str, failures: usize, fail: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> Self {
        Self::serving(upstream, failures, false, Box::new(fail))
    }

    /// [`start`](Self::start), and every request picked after those
    /// failures is held unanswered (etcd stalled on that call alone),
    /// until its client gives up.
    pub fn stalling(upstream: &str, failures: usize, pick: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> Self {
        Self::serving(upstream, failures, true, Box::new(pick))
    }

    fn serving(upstream: &str, failures: usize, stall_after: bool, rule: Box<Rule>) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let faults =
            Arc::new(Faults { rule, failures, stall_after, failed: AtomicUsize::new(0), stalled: AtomicUsize::new(0) });
        let stopped = Arc::new(AtomicBool::new(false));
        let (shared, stop) = (Arc::clone(&faults), Arc::clone(&stopped));
        thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&upstream)) else { continue };
                let faults = Arc::clone(&shared);
                thread::spawn(move || {
                    let _ = serve(client, server, &faults);
                });
            }
        });
        Self { endpoint, faults, stopped }
    }

    /// Requests failed so far.
    pub fn failed(&self) -> usize {
        self.faults.failed.load(Ordering::SeqCst)
    }

    /// Requests held unanswered so far.
    pub fn stalled(&self) -> usize {
        self.faults.stalled.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

/// One client connection: its requests one at a time, each forwarded,
/// failed or held; the replies copied back by a thread of their own.
fn serve(client: TcpStream, mut server: TcpStream, faults: &Faults) -> io::Result<()> {
    let (mut replies_from, mut replies_to) = (server.try_clone()?, client.try_clone()?);
    thread::spawn(move || {
        let _ = io::copy(&mut replies_from, &mut replies_to);
        let _ = replies_to.shutdown(Shutdown::Both);
    });
    let mut requests = BufReader::new(client.try_clone()?);
    loop {
        let (head, body) = read_request(&mut requests)?;
        if (faults.rule)(&body) {
            let failing = faults
                .failed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < faults.failures).then_some(n + 1))
                .is_ok();
            if failing {
                let mut client = &client;
                client
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
                let _ = server.shutdown(Shutdown::Both);
                return client.shutdown(Shutdown::Both);
            }
            if faults.stall_after {
                faults.stalled.fetch_add(1, Ordering::SeqCst);
                // Until the client closes its end.
                io::copy(&mut requests, &mut io::sink())?;
                return server.shutdown(Shutdown::Both);
            }
        }
        server.write_all(&head)?;
        server.write_all(&body)?;
    }
}

/// The next request's head (through the blank line) and its body.
fn read_request(from: &mut BufReader<TcpStream>) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut head = Vec::new();
    let mut length = 0;
    loop {
        let start = head.len();
        if from.read_until(b'\n', &mut head)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = String::from_utf8_lossy(&head[start..]).trim().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("content-length:") {
            length = value.trim().parse().map_err(|_| io::Error::other("a bad Content-Length"))?;
        }
    }
    let mut body = vec![0; length];
    from.read_exact(&mut body)?;
    Ok((head, body))
}
