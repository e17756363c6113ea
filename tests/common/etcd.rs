//! A real etcd for tests: started on free loopback ports with a temporary
//! data directory, stopped and removed on drop. A missing `etcd` binary
//! fails the test (`.ci/run` installs Debian's `etcd-server`); it never
//! skips.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    child: Child,
    dir: PathBuf,
    peer: u16,
    /// Flags beyond the ports and the data directory, kept for restarts.
    flags: Vec<String>,
    pub endpoint: String,
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An endpoint where no etcd is: nothing listens on a free port once its
/// listener is dropped.
pub fn unreachable_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

impl Etcd {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts etcd with `flags` too (kept for restarts).
    pub fn start_with(flags: &[&str]) -> Self {
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("reconq-etcd-{}-{client}", std::process::id()));
        let endpoint = format!("http://127.0.0.1:{client}");
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        let child = Self::spawn(&dir, &endpoint, peer, &flags);
        let etcd = Etcd { child, dir, peer, flags, endpoint };
        etcd.wait_healthy();
        etcd
    }

    fn spawn(dir: &std::path::Path, endpoint: &str, peer: u16, flags: &[String]) -> Child {
        let peer_url = format!("http://127.0.0.1:{peer}");
        Command::new("etcd")
            .args(["--name", "test", "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", endpoint, "--advertise-client-urls", endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the etcd binary (Debian's etcd-server; .ci/run installs it)")
    }

    /// Kills etcd, lets `change` do what it will to its data directory,
    /// and starts it again on the same ports.
    fn restart_with(&mut self, change: impl FnOnce(&std::path::Path)) {
        self.kill();
        change(&self.dir);
        self.revive();
    }

    /// Kills etcd (SIGKILL); its data stays.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a killed etcd again on the same ports and data.
    pub fn revive(&mut self) {
        self.child = Self::spawn(&self.dir, &self.endpoint, self.peer, &self.flags);
        self.wait_healthy();
    }

    /// An etcd 50 revisions into its history, for tests that wipe it: the
    /// tokens (revisions) of that old history lie above the new history's
    /// first revisions, as after a real reset.
    pub fn start_with_history() -> Self {
        let etcd = Self::start();
        etcd.bump("/filler", 50);
        etcd
    }

    /// One call to etcd's JSON gateway; its reply.
    fn call(&self, path: &str, body: &str) -> serde_json::Value {
        let mut reply = ureq::post(format!("{}/v3/{path}", self.endpoint)).send(body).unwrap();
        serde_json::from_str(&reply.body_mut().read_to_string().unwrap()).unwrap()
    }

    /// Deletes `key`.
    pub fn delete(&self, key: &str) {
        self.call("kv/deleterange", &format!(r#"{{"key":"{}"}}"#, b64(key)));
    }

    /// The store's revision now.
    pub fn revision(&self) -> i64 {
        let reply = self.call("kv/range", &format!(r#"{{"key":"{}"}}"#, b64("/")));
        reply["header"]["revision"].as_str().unwrap().parse().unwrap()
    }

    /// Compacts the history up to the revision now.
    pub fn compact(&self) {
        self.call("kv/compaction", &format!(r#"{{"revision":"{}","physical":true}}"#, self.revision()));
    }

    /// Every key under `prefix` (without it) and its value: etcd's own
    /// listing, to compare a cache with.
    pub fn list(&self, prefix: &str) -> std::collections::BTreeMap<String, String> {
        use base64::Engine as _;
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let engine = base64::engine::general_purpose::STANDARD;
        let body = format!(r#"{{"key":"{}","range_end":"{}"}}"#, b64(prefix), engine.encode(end));
        let reply = self.call("kv/range", &body);
        let text = |field: &serde_json::Value| {
            String::from_utf8(engine.decode(field.as_str().unwrap_or("")).unwrap()).unwrap()
        };
        let kvs = reply["kvs"].as_array().cloned().unwrap_or_default();
        kvs.iter().map(|kv| (text(&kv["key"])[prefix.len()..].to_owned(), text(&kv["value"]))).collect()
    }

    /// Wipes etcd's history: stops it, deletes its data directory, starts
    /// it again on the same ports (same member and cluster ids, revisions
    /// starting over).
    pub fn wipe(&mut self) {
        self.restart_with(|dir| std::fs::remove_dir_all(dir).unwrap());
    }

    /// Puts `key` = `value`.
    pub fn put(&self, key: &str, value: &str) {
        self.call("kv/put", &format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(value)));
    }

    /// Puts every `(key, value)` of `kvs`, `per_txn` to a transaction
    /// (etcd refuses more than 128 operations, or 1.5 MB, in one).
    pub fn put_all(&self, kvs: &[(String, String)], per_txn: usize) {
        for chunk in kvs.chunks(per_txn) {
            let puts: Vec<String> = chunk
                .iter()
                .map(|(k, v)| format!(r#"{{"requestPut":{{"key":"{}","value":"{}"}}}}"#, b64(k), b64(v)))
                .collect();
            self.call("kv/txn", &format!(r#"{{"success":[{}]}}"#, puts.join(",")));
        }
    }

    /// Puts `key` `times` times: the store's revision grows by `times`.
    pub fn bump(&self, key: &str, times: usize) {
        for _ in 0..times {
            self.put(key, "x");
        }
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("{}/health", self.endpoint);
        loop {
            if let Ok(mut response) = ureq::get(&url).call()
                && response.body_mut().read_to_string().is_ok_and(|body| body.contains("true"))
            {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy at {}", self.endpoint);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// gRPC messages etcd has received so far, by method (`Range`, `Txn`,
    /// `LeaseGrant`, `LeaseKeepAlive`, `Watch`, ...), from its /metrics:
    /// what our client asked of it, whatever the JSON gateway made of it.
    pub fn requests(&self) -> std::collections::HashMap<String, u64> {
        let url = format!("{}/metrics", self.endpoint);
        let text = ureq::get(&url).call().unwrap().body_mut().read_to_string().unwrap();
        let mut out = std::collections::HashMap::new();
        for line in text.lines().filter(|l| l.starts_with("grpc_server_msg_received_total{")) {
            let method = line.split("grpc_method=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap();
            let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            *out.entry(method.to_owned()).or_default() += value as u64;
        }
        out
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Freezes etcd (SIGSTOP): calls to it hang until they time out.
    pub fn pause(&self) {
        // SAFETY: sends a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGSTOP) }, 0);
    }

    pub fn resume(&self) {
        // SAFETY: as in `pause`.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGCONT) }, 0);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
