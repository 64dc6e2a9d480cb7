//! A `redis-server` of a test's own on a free loopback port (no persistence), killed on
//! drop: the real Debian package, installed by .ci/run.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, patience, wait_until};

/// A `redis-server` of this test's own (no persistence), killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("smg-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = RedisServer { child: None, port, dir };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is not installed (.ci/run installs the Debian package)");
        self.child = Some(child);
        let port = self.port;
        assert!(wait_until(patience(Duration::from_secs(10)), || pong(port)), "redis-server never answered PING");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Gone at once (a frozen one too): connections broken, new ones refused.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-s", "CONT", &c.id().to_string()]).stderr(Stdio::null()).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn pong(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
