//! A watch stream on a socket of our own, so that a stop can interrupt
//! it: shutting the socket down (from [`WatchStream::closer`]) wakes the
//! read at once, with no polling timeout to wait out (an idle stream
//! blocks in `read` and uses no CPU). The gateway streams one JSON message
//! per line in a chunked HTTP/1.1 response; this reads exactly that.
//!
//! A read that times out (no event and no progress notification within
//! the quiet bound) is not the end of the stream: [`WatchStream::next`]
//! reports it and can be called again.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::{CALL_TIMEOUT, EtcdClient, EtcdError, RawKeyValue, Seen, int_field, is_timeout, prefix_end, raw_key_value};

/// One message of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchItem {
    /// Changes, in revision order: each a put or (`deleted`) a delete.
    Events(Vec<(bool, RawKeyValue)>),
    /// A progress notification: every change up to `revision` was sent.
    Progress(i64),
    /// Nothing arrived within the quiet bound; the stream may go on.
    Quiet,
}

/// An open watch of a prefix.
pub(crate) struct WatchStream {
    client: EtcdClient,
    /// What had been seen of etcd's history when the watch was asked for.
    before: Seen,
    socket: TcpStream,
    endpoint: String,
    /// Bytes read and not yet de-chunked.
    raw: Vec<u8>,
    /// The response body so far, up to an incomplete line.
    body: Vec<u8>,
    chunked: bool,
    /// Bytes left in the current chunk (`Some(0)`: its CRLF), or `None`
    /// when a chunk-size line comes next.
    chunk_left: Option<usize>,
}

impl EtcdClient {
    /// Watches every key under `prefix` from revision `after + 1`, with
    /// progress notifications; a read waits at most `quiet`.
    pub(crate) fn watch_prefix(&self, prefix: &str, after: i64, quiet: Duration) -> Result<WatchStream, EtcdError> {
        let before = self.before_request()?;
        let body = json!({ "create_request": {
            "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)),
            "start_revision": (after + 1).to_string(), "progress_notify": true,
        }})
        .to_string();
        let mut last = EtcdError::new("etcd: no endpoint");
        for endpoint in &self.endpoints {
            match WatchStream::open(self, &before, endpoint, &body, quiet) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

impl WatchStream {
    fn open(
        client: &EtcdClient,
        before: &Seen,
        endpoint: &str,
        body: &str,
        quiet: Duration,
    ) -> Result<Self, EtcdError> {
        let failed = |e: io::Error| EtcdError::new(format!("etcd at {endpoint}: {e}"));
        let host = endpoint.trim_start_matches("http://");
        let address = host.to_socket_addrs().map_err(failed)?.next();
        let address = address.ok_or_else(|| EtcdError::new(format!("etcd at {endpoint}: no address")))?;
        let mut socket = TcpStream::connect_timeout(&address, CALL_TIMEOUT).map_err(failed)?;
        socket.set_nodelay(true).map_err(failed)?;
        socket.set_read_timeout(Some(CALL_TIMEOUT)).map_err(failed)?;
        socket.set_write_timeout(Some(CALL_TIMEOUT)).map_err(failed)?;
        let request = format!(
            "POST /v3/watch HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Grpc-Metadata-hasleader: true\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).map_err(failed)?;
        let mut stream = Self {
            client: client.clone(),
            before: before.clone(),
            socket,
            endpoint: endpoint.to_owned(),
            raw: Vec::new(),
            body: Vec::new(),
            chunked: false,
            chunk_left: None,
        };
        stream.read_head()?;
        stream.socket.set_read_timeout(Some(quiet)).map_err(failed)?;
        Ok(stream)
    }

    /// A handle on the socket: shutting it down ends a read in progress.
    pub(crate) fn closer(&self) -> io::Result<TcpStream> {
        self.socket.try_clone()
    }

    fn error(&self, what: impl std::fmt::Display) -> EtcdError {
        EtcdError::new(format!("etcd watch at {}: {what}", self.endpoint))
    }

    /// Reads the status line and headers: a 200 with a chunked (or
    /// unframed) body, or an error with etcd's message.
    fn read_head(&mut self) -> Result<(), EtcdError> {
        let end = loop {
            if let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if !self.fill()? {
                return Err(self.error("no answer"));
            }
        };
        let head = String::from_utf8_lossy(&self.raw[..end]).into_owned();
        self.raw.drain(..end + 4);
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "200" {
            return Err(self.error(format!("HTTP {status}: {}", String::from_utf8_lossy(&self.raw))));
        }
        self.chunked = head.lines().any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
        Ok(())
    }

    /// Reads more bytes; `Ok(false)` at the end of the stream.
    fn fill(&mut self) -> Result<bool, EtcdError> {
        let mut buffer = [0u8; 16 * 1024];
        match self.socket.read(&mut buffer) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.raw.extend_from_slice(&buffer[..n]);
                Ok(true)
            }
            Err(e) => Err(if is_timeout(&e) { self.error("timed out") } else { self.error(e) }),
        }
    }

    /// Moves what `raw` holds of the body into `body`.
    fn dechunk(&mut self) -> Result<(), EtcdError> {
        if !self.chunked {
            self.body.append(&mut self.raw);
            return Ok(());
        }
        loop {
            match self.chunk_left {
                None => {
                    let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else { return Ok(()) };
                    let line = String::from_utf8_lossy(&self.raw[..end]).into_owned();
                    let size = line.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(size, 16).map_err(|_| self.error(format!("chunk {line:?}")))?;
                    if size == 0 {
                        return Err(self.error("ended"));
                    }
                    self.raw.drain(..end + 2);
                    self.chunk_left = Some(size);
                }
                Some(0) => {
                    if self.raw.len() < 2 {
                        return Ok(());
                    }
                    self.raw.drain(..2);
                    self.chunk_left = None;
                }
                Some(left) => {
                    let take = left.min(self.raw.len());
                    if take == 0 {
                        return Ok(());
                    }
                    self.body.extend(self.raw.drain(..take));
                    self.chunk_left = Some(left - take);
                }
            }
        }
    }

    /// The next message: changes, a progress notification, or `Quiet`
    /// when the quiet bound passed without any. Errors end the stream
    /// (a compacted start revision: [`EtcdError::compacted`]; etcd's
    /// history reset: [`EtcdError::reset`]).
    pub(crate) fn next(&mut self) -> Result<WatchItem, EtcdError> {
        loop {
            self.dechunk()?;
            while let Some(end) = self.body.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.body.drain(..=end).collect();
                if let Some(item) = self.message(&line)? {
                    return Ok(item);
                }
            }
            let mut buffer = [0u8; 16 * 1024];
            match self.socket.read(&mut buffer) {
                Ok(0) => return Err(self.error("ended")),
                Ok(n) => self.raw.extend_from_slice(&buffer[..n]),
                Err(e) if is_timeout(&e) => return Ok(WatchItem::Quiet),
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    /// One line of the body; `None` for one that says nothing to act on
    /// (the watch's creation, a blank line).
    fn message(&self, line: &[u8]) -> Result<Option<WatchItem>, EtcdError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let message: Value = serde_json::from_slice(line)
            .map_err(|e| self.error(format!("bad message {}: {e}", String::from_utf8_lossy(line))))?;
        self.client.observe(&self.before, &message)?;
        if let Some(error) = message.get("error") {
            return Err(self.error(error));
        }
        let result = message.get("result").unwrap_or(&message);
        if result.get("canceled").and_then(Value::as_bool) == Some(true) {
            let mut e = self.error(format!("canceled: {result}"));
            let compacted = int_field(result, "compact_revision")?;
            if compacted > 0 {
                e.compacted = Some(compacted);
            }
            return Err(e);
        }
        let events = result.get("events").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        if !events.is_empty() {
            let events = events
                .iter()
                .map(|event| {
                    let deleted = event.get("type").and_then(Value::as_str) == Some("DELETE");
                    Ok((deleted, raw_key_value(event.get("kv").unwrap_or(&Value::Null))?))
                })
                .collect::<Result<_, EtcdError>>()?;
            return Ok(Some(WatchItem::Events(events)));
        }
        // The creation's header may run ahead of events not sent yet (a
        // watch from the past): only a progress notification is a position.
        if result.get("created").and_then(Value::as_bool) == Some(true) {
            return Ok(None);
        }
        let revision = int_field(result.get("header").unwrap_or(&Value::Null), "revision")?;
        Ok(Some(WatchItem::Progress(revision)))
    }
}
