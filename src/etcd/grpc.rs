//! Unary gRPC calls to etcd on a blocking libcurl handle: what
//! EtcdSource's list is read with (`paged.rs`), because etcd serves a
//! Range over gRPC at a seventh to a ninth of the CPU its JSON gateway
//! costs (docs/benchmarks.md, W14's list over gRPC). Everything else the
//! crate asks of etcd stays on the gateway (`mod.rs`): small calls, and a
//! watch stream that a unary call cannot be.
//!
//! libcurl speaks the HTTP/2 (cleartext, with prior knowledge: etcd's client
//! port serves gRPC and HTTP/1.1 on one port and needs no upgrade); this
//! module adds only gRPC's framing of one message (a byte saying it is not
//! compressed, its length in 4 big-endian bytes) and reads the call's
//! status, which etcd sends as trailers after the reply, or, for an error,
//! in the headers of a reply without a body ("trailers-only"): libcurl hands
//! both to the header callback. A reply without a status (a stream reset,
//! a connection cut) is a failure, never a success.
//!
//! One handle serves one list, on the list's thread: libcurl keeps its
//! connection between the pages, and nothing is shared between threads.

use std::sync::Arc;
use std::time::Duration;

use curl::easy::{Easy2, Handler, HttpVersion, List, WriteError};
use prost::Message;
use prost::bytes::Bytes;

use super::EtcdError;

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the caller gave up on its calls: asked by libcurl's progress
/// callback, at least once a second while a call waits and at each read
/// while it transfers, so a call in flight ends within about a second of
/// it (a page of a million keys may otherwise take its whole timeout,
/// 105 s, when etcd stalls).
pub(crate) type Abandoned = Arc<dyn Fn() -> bool + Send + Sync>;

/// What one call gave back.
pub(super) enum Unary<M> {
    /// The reply, and its size (protobuf).
    Reply(M, usize),
    /// The reply passed the handle's bound (`max_reply_bytes`); it was
    /// dropped unread.
    TooLarge,
}

/// A blocking gRPC client: one libcurl handle, its connections kept
/// between calls.
pub(super) struct Grpc {
    easy: Easy2<Collect>,
}

impl Grpc {
    /// A client whose replies are bounded to `max_reply_bytes` (beyond it
    /// a call gives [`Unary::TooLarge`]), whose calls fail soon after
    /// `abandoned` says so.
    pub(super) fn new(max_reply_bytes: usize, abandoned: Abandoned) -> Result<Self, EtcdError> {
        let mut easy = Easy2::new(Collect {
            body: Vec::new(),
            status: None,
            message: None,
            max_bytes: max_reply_bytes,
            too_large: false,
            abandoned,
        });
        easy.progress(true).map_err(setup)?;
        let mut headers = List::new();
        headers.append("content-type: application/grpc").map_err(setup)?;
        // gRPC's servers refuse a call whose client does not say it reads trailers.
        headers.append("te: trailers").map_err(setup)?;
        easy.http_headers(headers).map_err(setup)?;
        easy.http_version(HttpVersion::V2PriorKnowledge).map_err(setup)?;
        easy.post(true).map_err(setup)?;
        // No signals for timeouts: the caller's is one thread of many.
        easy.signal(false).map_err(setup)?;
        easy.connect_timeout(CONNECT_TIMEOUT).map_err(setup)?;
        // Through a proxy from the environment (as ureq goes for the
        // gateway's calls), HTTP/2 needs a tunnel: a proxy forwards HTTP/1.1.
        easy.http_proxy_tunnel(true).map_err(setup)?;
        Ok(Self { easy })
    }

    /// Calls `method` (`/package.Service/Method`) at `endpoint`
    /// (`http://host:port`) with `request`, giving up after `timeout`:
    /// the reply, or an error saying what went wrong (the connection, the
    /// HTTP/2 stream, or the call's gRPC status and message).
    pub(super) fn unary<M: Message + Default>(
        &mut self,
        endpoint: &str,
        method: &str,
        request: &impl Message,
        timeout: Duration,
    ) -> Result<Unary<M>, EtcdError> {
        let described = |what: String| format!("etcd at {endpoint}: {method}: {what}");
        let at = |what: String| EtcdError::new(described(what));
        self.easy.get_mut().clear();
        self.easy.url(&format!("{endpoint}{method}")).map_err(setup)?;
        self.easy.post_fields_copy(&frame(request)).map_err(setup)?;
        self.easy.timeout(timeout).map_err(setup)?;
        let performed = self.easy.perform();
        let reply = self.easy.get_ref();
        if reply.too_large {
            return Ok(Unary::TooLarge);
        }
        if performed.is_err() && self.abandoned() {
            return Err(at("abandoned by its caller".to_owned()));
        }
        performed.map_err(|e| at(e.to_string()))?;
        let code = self.easy.response_code().map_err(setup)?;
        if code != 200 {
            return Err(at(format!("HTTP status {code}, not a gRPC reply")));
        }
        match reply.status.as_deref() {
            Some("0") => {}
            Some(status) => {
                let message = percent_decoded(reply.message.as_deref().unwrap_or(""));
                return Err(EtcdError::refused(
                    described(format!("gRPC status {}: {message}", status_name(status))),
                    &message,
                ));
            }
            None => return Err(at("no gRPC status: the stream ended without one".to_owned())),
        }
        let (reply, size) = decoded(std::mem::take(&mut self.easy.get_mut().body)).map_err(at)?;
        Ok(Unary::Reply(reply, size))
    }

    /// Whether the caller gave up on this client's calls.
    pub(super) fn abandoned(&self) -> bool {
        (self.easy.get_ref().abandoned)()
    }
}

/// Failing to set a libcurl option: a build of libcurl without it.
fn setup(e: curl::Error) -> EtcdError {
    EtcdError::new(format!("etcd: libcurl: {e}"))
}

/// `message` as gRPC sends one: not compressed (a zero byte), its length
/// in 4 big-endian bytes, then the message.
fn frame(message: &impl Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + len);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message.encode(&mut framed).expect("a Vec grows to any message");
    framed
}

/// The message a unary call's reply `body` holds, and its size. Decoded
/// from a `Bytes` of the body, the message's `bytes = "bytes"` fields
/// (`RawKeyValue`'s) are slices of the body, not copies.
fn decoded<M: Message + Default>(body: Vec<u8>) -> Result<(M, usize), String> {
    let message = unframe(Bytes::from(body))?;
    let size = message.len();
    let reply = M::decode(message).map_err(|e| format!("bad reply: {e}"))?;
    Ok((reply, size))
}

/// The one message of a unary call's reply.
fn unframe(body: Bytes) -> Result<Bytes, String> {
    let Some((&[compressed, a, b, c, d], message)) = body.split_first_chunk::<5>() else {
        return Err(format!("a reply of {} bytes, shorter than gRPC's frame", body.len()));
    };
    if compressed != 0 {
        // Never asked for (no `grpc-accept-encoding` is sent).
        return Err("a compressed reply".to_owned());
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if message.len() != len {
        return Err(format!("one message of {len} bytes announced, {} bytes sent", message.len()));
    }
    Ok(body.slice(5..))
}

/// A status code's name (grpc's `codes.proto`), for the error's message.
fn status_name(code: &str) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    match code.parse::<usize>().ok().and_then(|n| NAMES.get(n)) {
        Some(name) => format!("{code} ({name})"),
        None => code.to_owned(),
    }
}

/// `grpc-message` is percent-encoded (gRPC's HTTP/2 protocol: any byte
/// outside printable ASCII, and `%`).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What libcurl hands over of one call: the body, and the gRPC status and
/// message from the headers or the trailers (both come to the header
/// callback, trailers after the body).
struct Collect {
    body: Vec<u8>,
    status: Option<String>,
    message: Option<String>,
    /// The body's bound; past it the transfer is aborted.
    max_bytes: usize,
    too_large: bool,
    abandoned: Abandoned,
}

impl Collect {
    fn clear(&mut self) {
        self.body = Vec::new();
        self.status = None;
        self.message = None;
        self.too_large = false;
    }
}

impl Handler for Collect {
    fn write(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        if self.body.len() + data.len() > self.max_bytes {
            self.too_large = true;
            // Fewer bytes taken than given: libcurl aborts the transfer.
            return Ok(0);
        }
        self.body.extend_from_slice(data);
        Ok(data.len())
    }

    /// `false` aborts the transfer.
    fn progress(&mut self, _: f64, _: f64, _: f64, _: f64) -> bool {
        !(self.abandoned)()
    }

    fn header(&mut self, line: &[u8]) -> bool {
        let line = String::from_utf8_lossy(line);
        if let Some((name, value)) = line.split_once(':') {
            let value = Some(value.trim().to_owned());
            match name.trim().to_ascii_lowercase().as_str() {
                "grpc-status" => self.status = value,
                "grpc-message" => self.message = value,
                _ => {}
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::range_proto::{RangeRequest, RangeResponse, RawKeyValue};

    #[test]
    fn a_message_is_framed_and_unframed() {
        let request = RangeRequest { key: b"/p/".to_vec(), ..RangeRequest::default() };
        let framed = frame(&request);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 5]);
        let framed = Bytes::from(framed);
        assert_eq!(unframe(framed.clone()), Ok(request.encode_to_vec().into()));
        assert!(unframe(framed.slice(..4)).is_err(), "shorter than the frame");
        assert!(unframe(framed.slice(..7)).is_err(), "cut short");
        assert!(unframe(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err(), "compressed");
    }

    /// A page's keys and values point into its reply: no allocation of
    /// their own, which a list of a million keys left behind as holes in
    /// the heap (resident memory the process kept).
    #[test]
    fn a_reply_s_keys_and_values_are_slices_of_its_body() {
        let kv = |key: &str, value: &str| RawKeyValue {
            key: key.to_owned().into(),
            value: value.to_owned().into(),
            ..RawKeyValue::default()
        };
        let page = RangeResponse { kvs: vec![kv("/p/a", "1"), kv("/p/b", "22")], count: 2, ..RangeResponse::default() };
        let body = frame(&page);
        let within = body.as_ptr_range();
        let (decoded, size) = decoded::<RangeResponse>(body).unwrap();
        assert_eq!((&decoded, size), (&page, page.encoded_len()));
        for kv in &decoded.kvs {
            for field in [&kv.key, &kv.value] {
                assert!(within.contains(&field.as_ptr()), "{field:?} copied out of the reply");
            }
        }
    }

    #[test]
    fn a_status_message_is_percent_decoded() {
        assert_eq!(percent_decoded("a b%25c%E2%9C%93"), "a b%c\u{2713}");
        assert_eq!(percent_decoded("100%"), "100%", "a % without two hex digits is itself");
        assert_eq!(status_name("11"), "11 (OUT_OF_RANGE)");
        assert_eq!(status_name("99"), "99");
    }
}
