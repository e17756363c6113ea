//! A TCP proxy in front of a server, for faults between a client and it:
//! cut every connection and refuse new ones, or freeze the connections
//! open now (they stay open and forward nothing: a silent stream), while
//! the server itself runs on.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use parking_lot::Mutex;

struct Connection {
    client: TcpStream,
    server: TcpStream,
    frozen: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    refusing: bool,
    connections: Vec<Connection>,
}

pub struct Proxy {
    /// `http://127.0.0.1:port`, to give clients instead of the server's.
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

impl Proxy {
    /// A proxy to `target` (`http://host:port`).
    pub fn to(target: &str) -> Self {
        let target = target.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let accepting = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let mut state = accepting.lock();
                if state.refusing {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                let frozen = Arc::new(AtomicBool::new(false));
                pump(&client, &server, &frozen);
                pump(&server, &client, &frozen);
                state.connections.push(Connection { client, server, frozen });
            }
        });
        Self { endpoint, state }
    }

    /// Closes every connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        let mut state = self.state.lock();
        state.refusing = true;
        for c in state.connections.drain(..) {
            let _ = c.client.shutdown(Shutdown::Both);
            let _ = c.server.shutdown(Shutdown::Both);
        }
    }

    /// The connections open now forward nothing more, and stay open; new
    /// ones work.
    pub fn freeze(&self) {
        for c in self.state.lock().connections.drain(..) {
            c.frozen.store(true, Ordering::SeqCst);
        }
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.state.lock().refusing = false;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Copies `from` to `to` on a thread of its own until either closes;
/// once `frozen`, drops what it reads.
fn pump(from: &TcpStream, to: &TcpStream, frozen: &Arc<AtomicBool>) {
    let (mut from, mut to, frozen) = (from.try_clone().unwrap(), to.try_clone().unwrap(), Arc::clone(frozen));
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) if frozen.load(Ordering::SeqCst) => {}
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
