//! A PostgreSQL of a test's own: a fresh cluster (`initdb`) in a temporary directory, served
//! on a free loopback port (no Unix socket), stopped on drop. The real Debian package,
//! installed by .ci/run. PostgreSQL refuses to run as root: when the tests run as root, the
//! cluster belongs to the `postgres` user (or `nobody`) and both programs run as it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, patience, wait_until};

/// A PostgreSQL server of this test's own, stopped (immediate shutdown) on drop.
pub struct PostgresServer {
    pub port: u16,
    dir: PathBuf,
    /// (uid, gid) the server runs as, when this process is root.
    owner: Option<(u32, u32)>,
    child: Option<Child>,
}

impl PostgresServer {
    /// `initdb` (trust authentication, no fsync), then `postgres`; returns once it accepts
    /// connections.
    pub fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("smg-postgres-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let owner = unprivileged_owner();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let mut pg = PostgresServer { port, dir, owner, child: None };
        let log = File::create(pg.dir.join("initdb.log")).unwrap();
        let ok = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .expect("initdb does not run (.ci/run installs PostgreSQL)")
            .success();
        assert!(ok, "initdb failed: {}", pg.log("initdb.log"));
        pg.spawn();
        pg
    }

    /// What `--postgres-db-url` takes.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Runs `sql` with `psql` (one statement, unaligned, tuples only) and returns its output,
    /// trimmed; panics when psql fails.
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new(pg_bin("psql"))
            .args(["-X", "-w", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres"])
            .args(["-p", &self.port.to_string(), "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .output()
            .expect("psql does not run (.ci/run installs PostgreSQL)");
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// One of PostgreSQL's server programs, run as the cluster's owner.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(pg_bin(program));
        c.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.owner {
            // std drops the supplementary groups too when root sets a uid.
            c.uid(uid).gid(gid);
        }
        c
    }

    fn spawn(&mut self) {
        let log = File::create(self.dir.join("postgres.log")).unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories=", "-c", "fsync=off"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=20"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres does not run (.ci/run installs PostgreSQL)");
        let pid = child.id();
        self.child = Some(child);
        let (pidfile, port) = (self.data().join("postmaster.pid"), self.port);
        let mut exited = false;
        let child = self.child.as_mut().unwrap();
        let up = wait_until(patience(Duration::from_secs(60)), || {
            exited = matches!(child.try_wait(), Ok(Some(_)));
            exited || ready(&pidfile, pid, port)
        });
        assert!(up && !exited, "postgres never became ready: {}", self.log("postgres.log"));
    }

    /// Stops answering (SIGSTOP), connections held open: the postmaster first (it forks no
    /// more), then its children (each backend is a session of its own: a process group's
    /// signal would miss them).
    pub fn freeze(&self) {
        for pid in family(self.pid()) {
            signal("STOP", pid);
        }
    }

    pub fn thaw(&self) {
        for pid in family(self.pid()) {
            signal("CONT", pid);
        }
    }

    /// Immediate shutdown (SIGQUIT), a frozen server too: the postmaster ends its backends and
    /// exits at once, as a crash would (the next start recovers from the WAL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            for pid in family(c.id()) {
                signal("CONT", pid);
            }
            signal("QUIT", c.id());
            let _ = c.wait();
        }
    }

    /// Up again on the same port and data, once it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// `kill -s <sig> <pid>`.
fn signal(sig: &str, pid: u32) {
    // A child may have exited already: nothing to say about it.
    let _ = Command::new("kill").args(["-s", sig, &pid.to_string()]).stderr(Stdio::null()).status();
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// postmaster.pid names this postmaster and says it accepts connections (its 8th line), and
/// the port answers.
fn ready(pidfile: &Path, pid: u32, port: u16) -> bool {
    let Ok(s) = std::fs::read_to_string(pidfile) else { return false };
    let lines: Vec<&str> = s.lines().collect();
    lines.first() == Some(&pid.to_string().as_str())
        && lines.get(7).is_some_and(|l| l.trim() == "ready")
        && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The postmaster `pid` and its children (from /proc: the field after the parenthesised name
/// and the state is the parent).
fn family(pid: u32) -> Vec<u32> {
    let children = std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| {
        let child: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let parent: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        (parent == pid).then_some(child)
    });
    std::iter::once(pid).chain(children).collect()
}

/// Root's stand-in: the `postgres` user (or `nobody`). None when not root.
fn unprivileged_owner() -> Option<(u32, u32)> {
    if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let user = |name: &str| {
        passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() > 3 && f[0] == name {
                Some((f[2].parse().ok()?, f[3].parse().ok()?))
            } else {
                None
            }
        })
    };
    Some(user("postgres").or_else(|| user("nobody")).expect("root, and no postgres or nobody user to run PostgreSQL"))
}

/// A PostgreSQL program: on PATH, else the newest in Debian's /usr/lib/postgresql/<v>/bin
/// (the package keeps the server's programs off PATH).
fn pg_bin(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()));
    if let Some(p) = on_path {
        return p;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin").join(name))))
        .filter(|(_, p)| p.is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).unwrap_or_else(|| PathBuf::from(name))
}
