//! A minimal HTTP endpoint on a blocking `TcpListener`, each connection
//! answered on a thread of its own (bounded, with a deadline: see
//! `connections`): `GET /metrics` (the scrape),
//! `/status` (the status table; JSON on `Accept: application/json` or
//! `?format=json`), `/healthz` and `/readyz` (Kubernetes probes: 200 `ok`,
//! or 503 with the reasons, see `observe::probes`). Idle, the one thread
//! left is blocked in `accept` and uses no CPU; there is no async runtime.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};

use super::connections::{self, Connection};
use crate::observe::status;

/// Requests with a longer head are answered from what was read.
const MAX_HEAD: usize = 8 * 1024;

/// A running metrics endpoint (see [`serve`](crate::metrics::serve)).
/// Dropping it, or [`close`](Self::close), stops the server thread.
#[derive(Debug)]
#[must_use = "dropping the server stops it"]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) fn serve(addr: impl ToSocketAddrs) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        thread::Builder::new()
            .name("reconq-metrics".into())
            .spawn(move || connections::accept_loop(&listener, &stop, answer))?
    };
    Ok(MetricsServer { addr, stop, thread: Some(thread) })
}

impl MetricsServer {
    /// The address the server listens on (with the port chosen by the OS if
    /// port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops accepting connections and waits for the accepting thread to
    /// exit; connections being answered finish on their own threads, each
    /// by its deadline. Closing twice is fine.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocked `accept` with a connection of our own.
        let target = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.addr.port()),
            IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), self.addr.port()),
            _ => self.addr,
        };
        if TcpStream::connect_timeout(&target, connections::DEADLINE).is_ok() {
            let _ = thread.join();
        }
        // Otherwise the thread stays blocked in accept (its listener open)
        // and exits at its next connection; it is detached, not leaked
        // into anything else.
    }
}

impl MetricsServer {
    /// Lets the server thread run on, unowned, until the process ends: for
    /// a handle whose owner is gone without closing it (Python's
    /// `start_http_server(...)` called on its own line, as
    /// prometheus_client users write it).
    #[cfg(feature = "python")]
    pub(crate) fn detach(mut self) {
        drop(self.thread.take());
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.close();
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

/// The status line, content type and body for a GET of `path`.
fn route(path: &str, wants_json: bool) -> (&'static str, &'static str, String) {
    match path {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", super::render()),
        "/status" if wants_json => ("200 OK", "application/json", status::to_json(&status::snapshot())),
        "/status" => ("200 OK", TEXT, status::format_table(&status::snapshot())),
        "/healthz" => probe(status::liveness_problems()),
        "/readyz" => probe(status::readiness_problems()),
        _ => ("404 Not Found", TEXT, "404 page not found; try /metrics, /status, /healthz or /readyz\n".to_owned()),
    }
}

/// `200 ok`, or `503` with one line per problem (as controller-runtime's
/// `/readyz` lists its failed checks).
fn probe(problems: Vec<String>) -> (&'static str, &'static str, String) {
    if problems.is_empty() {
        return ("200 OK", TEXT, "ok\n".to_owned());
    }
    let mut body = String::new();
    for problem in problems {
        body.push_str(&problem);
        body.push('\n');
    }
    ("503 Service Unavailable", TEXT, body)
}

fn answer(stream: &mut Connection) -> io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let wants_json = query.split('&').any(|pair| pair == "format=json")
        || lines.any(|line| {
            line.split_once(':').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("accept") && value.contains("application/json")
            })
        });
    let (status, content_type, body) = route(if matches!(method, "GET" | "HEAD") { path } else { "" }, wants_json);
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes())?;
    stream.flush()
}
