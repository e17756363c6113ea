//! A loopback proxy in front of etcd's JSON gateway that fails the
//! requests a test picks: the one failed call a busy etcd or a broken
//! connection causes, aimed at the call under test instead of at whatever
//! a `SIGSTOP` happens to catch.
//!
//! It reads each HTTP/1.1 request whole (head and `Content-Length` body:
//! the engine's `ureq` sends no chunked bodies and never pipelines), then
//! either forwards it or answers `503` and closes the connection. Replies
//! are copied back as they come, so streamed watches pass untouched.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

/// Which requests fail: asked of each request's body.
type Rule = dyn Fn(&[u8]) -> bool + Send + Sync;

pub struct FaultyProxy {
    pub endpoint: String,
    failed: Arc<AtomicUsize>,
    stopped: Arc<AtomicBool>,
}

impl FaultyProxy {
    /// Forwards to `upstream` (`http://host:port`), failing the first
    /// `failures` requests whose body `fail` picks.
    pub fn start(upstream: &str, failures: usize, fail: impl Fn(&[u8]) -> bool + Send + Sync + 'static) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (failed, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let rule: Arc<Rule> = Arc::new(move |body| fail(body));
        let (counted, stop) = (Arc::clone(&failed), Arc::clone(&stopped));
        thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&upstream)) else { continue };
                let (rule, counted) = (Arc::clone(&rule), Arc::clone(&counted));
                thread::spawn(move || {
                    let _ = serve(client, server, &*rule, &counted, failures);
                });
            }
        });
        Self { endpoint, failed, stopped }
    }

    /// Requests failed so far.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

/// One client connection: its requests one at a time, each forwarded or
/// failed; the replies copied back by a thread of their own.
fn serve(
    client: TcpStream,
    mut server: TcpStream,
    fail: &Rule,
    failed: &AtomicUsize,
    failures: usize,
) -> io::Result<()> {
    let (mut replies_from, mut replies_to) = (server.try_clone()?, client.try_clone()?);
    thread::spawn(move || {
        let _ = io::copy(&mut replies_from, &mut replies_to);
        let _ = replies_to.shutdown(Shutdown::Both);
    });
    let mut requests = BufReader::new(client.try_clone()?);
    loop {
        let (head, body) = read_request(&mut requests)?;
        let picked = fail(&body)
            && failed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < failures).then_some(n + 1)).is_ok();
        if picked {
            let mut client = &client;
            client.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            let _ = server.shutdown(Shutdown::Both);
            return client.shutdown(Shutdown::Both);
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
