//! CPU time of a target process tree from /proc: utime+stime of the process (all its threads) and its descendants.

use std::fs;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of /proc/PID/stat times.
#[allow(unsafe_code)]
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// CPU ticks split as the kernel accounts them: in the process (user) and in the kernel on
/// its behalf (system: syscalls, and on loopback the peer's TCP receive work too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticks {
    pub user: u64,
    pub system: u64,
}

impl Ticks {
    pub fn total(self) -> u64 {
        self.user + self.system
    }

    pub fn since(self, before: Ticks) -> Ticks {
        Ticks { user: self.user.saturating_sub(before.user), system: self.system.saturating_sub(before.system) }
    }
}

/// (ppid, utime and stime in ticks) of one process. The comm field may contain spaces and
/// parentheses, so fields are counted from the last ')'.
fn stat_of(pid: u32) -> Option<(u32, Ticks)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state(0) ppid(1) ... utime(11) stime(12).
    let ppid = f.get(1)?.parse().ok()?;
    let user: u64 = f.get(11)?.parse().ok()?;
    let system: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, Ticks { user, system }))
}

/// CPU ticks used so far by `pid` and every live descendant (nginx workers, Python children).
pub fn tree_ticks(pid: u32) -> Option<Ticks> {
    let (_, own) = stat_of(pid)?;
    let mut procs = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if let Some((ppid, t)) = stat_of(p) {
                    procs.push((p, ppid, t));
                }
            }
        }
    }
    let mut total = own;
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, ppid, t) in &procs {
            if ppid == parent && p != pid {
                total.user += t.user;
                total.system += t.system;
                frontier.push(p);
            }
        }
    }
    Some(total)
}

/// Converts ticks to microseconds.
/// Nanoseconds the calling thread has spent runnable but waiting on a run queue (the second
/// field of /proc/thread-self/schedstat); None where the kernel keeps no schedstat.
pub fn thread_cpu_wait_ns() -> Option<u64> {
    let s = fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// Whether this kernel reports run-queue waits.
pub fn schedstat_available() -> bool {
    thread_cpu_wait_ns().is_some()
}

pub fn ticks_to_us(ticks: u64) -> f64 {
    ticks as f64 * 1_000_000.0 / ticks_per_second() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu() {
        let me = std::process::id();
        let before = tree_ticks(me).unwrap();
        // Burn a little CPU so the counter can move.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let after = tree_ticks(me).unwrap();
        assert!(after.total() >= before.total());
        assert_eq!(after.since(before).total(), after.total() - before.total());
        assert!(ticks_per_second() > 0);
        assert!(tree_ticks(u32::MAX).is_none());
    }
}
