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
    pub endpoint: String,
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
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("reconq-etcd-{}-{client}", std::process::id()));
        let endpoint = format!("http://127.0.0.1:{client}");
        let child = Self::spawn(&dir, &endpoint, peer);
        let etcd = Etcd { child, dir, peer, endpoint };
        etcd.wait_healthy();
        etcd
    }

    fn spawn(dir: &std::path::Path, endpoint: &str, peer: u16) -> Child {
        let peer_url = format!("http://127.0.0.1:{peer}");
        Command::new("etcd")
            .args(["--name", "test", "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", endpoint, "--advertise-client-urls", endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("test={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the etcd binary (Debian's etcd-server; .ci/run installs it)")
    }

    /// Kills etcd, lets `change` do what it will to its data directory,
    /// and starts it again on the same ports.
    fn restart_with(&mut self, change: impl FnOnce(&std::path::Path)) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        change(&self.dir);
        self.child = Self::spawn(&self.dir, &self.endpoint, self.peer);
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

    /// Wipes etcd's history: stops it, deletes its data directory, starts
    /// it again on the same ports (same member and cluster ids, revisions
    /// starting over).
    pub fn wipe(&mut self) {
        self.restart_with(|dir| std::fs::remove_dir_all(dir).unwrap());
    }

    /// Puts `key` = `value`.
    pub fn put(&self, key: &str, value: &str) {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(value));
        ureq::post(format!("{}/v3/kv/put", self.endpoint)).send(&body).unwrap();
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
