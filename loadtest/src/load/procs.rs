//! The child processes the measuring commands start (simulators, gateways, nginx): spawning them
//! pinned, waiting until they answer, and stopping them when their guard drops. Shared by
//! `compare`, `sweep`, `failover` and the WebSocket compare.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A started child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) _dir: Option<TempDir>,
}

// === impl Proc ===

impl Proc {
    pub(crate) fn new(child: Child) -> Self {
        Self { child, _dir: None }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet (so the pid
        // cannot have been reused); it only sends a signal.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> std::io::Result<Self> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let p = std::env::temp_dir().join(format!("smg-compare-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Prefix with `taskset -c CORE` when taskset exists, so the child starts pinned.
pub(crate) fn pinned(core: usize, program: &Path) -> Command {
    match on_path("taskset") {
        Some(ts) => {
            let mut c = Command::new(ts);
            c.arg("-c").arg(core.to_string()).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Sends one request with blocking I/O and returns the status code.
fn probe(addr: SocketAddr, req: &[u8]) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(req).ok()?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let r = s.read(&mut buf[n..]).ok()?;
        if r == 0 {
            return None;
        }
        n += r;
    }
    std::str::from_utf8(&buf[9..12]).ok()?.parse().ok()
}

pub(crate) fn wait_ready(addr: SocketAddr, req: &[u8], child: &mut Child, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("exited during start-up ({st})"));
        }
        if probe(addr, req) == Some(200) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("not ready within {within:?}"))
}

/// The smg-sim binary: the one given, else the one next to this executable.
pub(crate) fn sim_bin(given: Option<&Path>) -> Result<PathBuf, String> {
    match given {
        Some(b) => Ok(b.to_path_buf()),
        None => Ok(std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("smg-sim")),
    }
}

/// Spawns a prepared smg-sim command and returns it with its ports, once it printed `ready`.
pub(crate) fn spawn_sim(cmd: Command, bin: &Path) -> Result<(Proc, Vec<u16>), String> {
    let (proc_, lines) = spawn_sim_lines(cmd, bin)?;
    let ports = lines.iter().map(|l| listening_port(l).ok_or_else(|| format!("bad sim line {l:?}")));
    Ok((proc_, ports.collect::<Result<_, _>>()?))
}

/// As [`spawn_sim`], with each worker's whole `listening` line (what follows `listening `):
/// its address first, then `key=value` fields such as a PD prefill's `bootstrap=HOST:PORT`.
pub(crate) fn spawn_sim_lines(mut cmd: Command, bin: &Path) -> Result<(Proc, Vec<String>), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().ok_or("no sim stdout")?;
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| e.to_string())?;
        if let Some(rest) = line.strip_prefix("listening ") {
            lines.push(rest.to_string());
        } else if line.starts_with("ready") {
            break;
        }
    }
    if lines.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        return Err("smg-sim did not start".into());
    }
    Ok((Proc { child, _dir: None }, lines))
}

/// The port of a `listening` line's leading `HOST:PORT`.
pub(crate) fn listening_port(line: &str) -> Option<u16> {
    line.split_whitespace().next()?.rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines() {
        assert_eq!(listening_port("127.0.0.1:18001 model=m runtime=sglang"), Some(18001));
        assert_eq!(listening_port("127.0.0.1:x model=m"), None);
        assert_eq!(listening_port(""), None);
    }
}
