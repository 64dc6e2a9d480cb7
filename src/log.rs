//! A small stderr logger: text or JSON lines, level set once at start.
//!
//! Logging is off the request path except for warnings and errors, so a plain locked
//! write to stderr is enough; no logging framework is pulled in.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);
static JSON: AtomicBool = AtomicBool::new(false);

pub fn init(level: LogLevel, json: bool) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    JSON.store(json, Ordering::Relaxed);
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

/// UTC timestamp `YYYY-MM-DDTHH:MM:SS.mmmZ` (civil-from-days, no time crate needed).
fn timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem / 60 % 60, rem % 60, now.subsec_millis())
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
    let _ = std::io::stderr().lock().write_all(&line);
}

#[macro_export]
macro_rules! log_at {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) { $crate::log::write($lvl, format_args!($($arg)*)) }
    };
}
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Error, $($arg)*) }; }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Warn, $($arg)*) }; }
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Info, $($arg)*) }; }
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log_at!($crate::config::LogLevel::Debug, $($arg)*) }; }

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_shape() {
        let t = super::timestamp();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }
}
