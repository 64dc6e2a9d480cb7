//! Durations that come from outside — flags, `/workers` JSON, the scheduler's YAML — all
//! pass one range check at the edge, so no clock arithmetic inside can overflow:
//! `Instant + Duration` panics past the clock's range, and one `u64::MAX` in
//! `health.check_interval_secs` used to stop the control thread for good.

use std::time::Duration;

/// The longest duration accepted anywhere: a year. Longer means "never" in practice, and a
/// year from now is far inside every clock's and timer's range.
pub const MAX_SECS: u64 = 365 * 24 * 3600;

/// `v` seconds, refused unless `min <= v <= MAX_SECS`, with `what` (a flag, a JSON field) named.
pub fn secs(what: &str, v: u64, min: u64) -> Result<Duration, String> {
    if v < min || v > MAX_SECS {
        return Err(format!("{what}: must be between {min} and {MAX_SECS} seconds, got {v}"));
    }
    Ok(Duration::from_secs(v))
}

/// `v` milliseconds, refused past [`MAX_SECS`].
pub fn millis(what: &str, v: u64) -> Result<Duration, String> {
    if v > MAX_SECS * 1000 {
        return Err(format!("{what}: must be at most {} milliseconds, got {v}", MAX_SECS * 1000));
    }
    Ok(Duration::from_millis(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_holds_at_both_ends() {
        assert_eq!(secs("--x", 1, 1), Ok(Duration::from_secs(1)));
        assert_eq!(secs("--x", 0, 0), Ok(Duration::ZERO));
        assert_eq!(secs("--x", MAX_SECS, 1), Ok(Duration::from_secs(MAX_SECS)));
        assert!(secs("--x", 0, 1).unwrap_err().starts_with("--x: must be between 1 and"));
        assert!(secs("--x", u64::MAX, 1).is_err());
        assert!(millis("--y", u64::MAX).unwrap_err().starts_with("--y: must be at most"));
        // The longest accepted duration can be added to any instant this process will see.
        assert!(crate::clock::now().checked_add(Duration::from_secs(MAX_SECS)).is_some());
    }
}
