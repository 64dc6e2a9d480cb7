//! A small stderr logger: text or JSON lines, level set once at start.
//!
//! A request logs only when something went wrong (a warning or an error), so a plain locked
//! write to stderr is enough; no logging framework is pulled in.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl std::str::FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Ok(LogLevel::Error),
            "warn" | "warning" => Ok(LogLevel::Warn),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            "trace" => Ok(LogLevel::Trace),
            other => Err(format!("--log-level: unknown level '{other}' (expected trace, debug, info, warn or error)")),
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);
static JSON: AtomicBool = AtomicBool::new(false);

/// Where lines go: stderr, or daily files `<dir>/smg.YYYY-MM-DD` (`--log-dir`).
enum Sink {
    Stderr,
    Dir { dir: std::path::PathBuf, day: i64, file: Option<std::fs::File> },
}

// Only the writer thread (and `init`, before any shard runs) touches the sink: shards hand lines
// to the writer through a channel, so this lock is never taken on a shard.
#[allow(clippy::disallowed_types)]
static SINK: std::sync::Mutex<Sink> = std::sync::Mutex::new(Sink::Stderr);

pub fn init(level: LogLevel, json: bool, dir: Option<&std::path::Path>) -> Result<(), String> {
    LEVEL.store(level as u8, Ordering::Relaxed);
    JSON.store(json, Ordering::Relaxed);
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--log-dir {}: {e}", dir.display()))?;
        *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Sink::Dir { dir: dir.to_path_buf(), day: -1, file: None };
    }
    Ok(())
}

pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Writes whole lines to the sink, opening the next day's file when the date changes. Once
/// the writer thread runs, only it calls this.
fn write_raw(lines: &[u8]) {
    let mut sink = SINK.lock().unwrap_or_else(|e| e.into_inner());
    match &mut *sink {
        Sink::Stderr => {
            let _ = std::io::stderr().lock().write_all(lines);
        }
        Sink::Dir { dir, day, file } => {
            let today = crate::civil::now_unix().div_euclid(86_400);
            if *day != today || file.is_none() {
                let c = crate::civil::from_unix(today * 86_400);
                let path = dir.join(format!("smg.{:04}-{:02}-{:02}", c.year, c.month, c.day));
                *file = std::fs::OpenOptions::new().create(true).append(true).open(path).ok();
                *day = today;
            }
            if let Some(f) = file {
                let _ = f.write_all(lines);
            }
        }
    }
}

#[inline]
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "ERROR",
        LogLevel::Warn => "WARN",
        LogLevel::Info => "INFO",
        LogLevel::Debug => "DEBUG",
        LogLevel::Trace => "TRACE",
    }
}

/// UTC timestamp `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let c = crate::civil::from_unix(now.as_secs() as i64);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        c.year,
        c.month,
        c.day,
        c.hour,
        c.minute,
        c.second,
        now.subsec_millis()
    )
}

pub fn write(level: LogLevel, args: std::fmt::Arguments<'_>) {
    let msg = args.to_string();
    let line = if JSON.load(Ordering::Relaxed) {
        let mut line = format!("{{\"ts\":\"{}\",\"level\":\"{}\",\"msg\":", timestamp(), name(level)).into_bytes();
        smg_wire::json::put_str(&mut line, &msg);
        line.extend_from_slice(b"}\n");
        line
    } else {
        format!("{} {:5} {}\n", timestamp(), name(level), msg).into_bytes()
    };
    match WRITER.get() {
        // Never block the caller (a shard, maybe) on a slow sink: the writer thread owns it.
        Some(tx) => {
            if tx.try_send(line).is_err() {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        None => write_raw(&line),
    }
}

/// Lines bound for the writer thread, once it runs.
static WRITER: std::sync::OnceLock<flume::Sender<Vec<u8>>> = std::sync::OnceLock::new();
/// Log lines dropped because the writer fell behind.
static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Starts the one thread that writes to the sink, and returns the channel it reads (the
/// access log sends its chunks there too). From then on no other thread touches the sink:
/// a slow disk stalls only this thread, and what does not fit in its queue is dropped.
pub fn start_writer() -> flume::Sender<Vec<u8>> {
    let tx = WRITER.get_or_init(|| {
        let (tx, rx) = flume::bounded::<Vec<u8>>(256);
        let spawned = std::thread::Builder::new().name("smg-log".into()).spawn(move || {
            while let Ok(chunk) = rx.recv() {
                WRITING.store(true, Ordering::Release);
                write_raw(&chunk);
                WRITING.store(false, Ordering::Release);
            }
        });
        if let Err(e) = spawned {
            eprintln!("log writer: {e}");
        }
        tx
    });
    tx.clone()
}

static WRITING: AtomicBool = AtomicBool::new(false);

/// Waits (at most a second) until the writer has written everything queued: before exit.
// Runs on the main thread after the shards have stopped; the writer signals nothing to await.
#[allow(clippy::disallowed_methods)]
pub fn flush() {
    let Some(tx) = WRITER.get() else { return };
    for _ in 0..200 {
        if tx.is_empty() && !WRITING.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Log lines (not access lines) dropped so far.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[macro_export]
macro_rules! log_at {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) { $crate::log::write($lvl, format_args!($($arg)*)) }
    };
}
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log_at!($crate::log::LogLevel::Error, $($arg)*) }; }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log_at!($crate::log::LogLevel::Warn, $($arg)*) }; }
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log_at!($crate::log::LogLevel::Info, $($arg)*) }; }
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log_at!($crate::log::LogLevel::Debug, $($arg)*) }; }

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_shape() {
        let t = super::timestamp();
        assert_eq!(t.len(), 24, "{t}");
        let b = t.as_bytes();
        for (i, c) in b.iter().enumerate() {
            match i {
                4 | 7 => assert_eq!(*c, b'-'),
                10 => assert_eq!(*c, b'T'),
                13 | 16 => assert_eq!(*c, b':'),
                19 => assert_eq!(*c, b'.'),
                23 => assert_eq!(*c, b'Z'),
                _ => assert!(c.is_ascii_digit(), "{t}"),
            }
        }
    }
}
