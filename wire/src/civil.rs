//! UTC calendar fields from Unix seconds (Howard Hinnant's civil-from-days), for log
//! timestamps and the HTTP `Date` header; no time crate needed.

/// A UTC instant broken into calendar fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

pub fn from_unix(secs: i64) -> Civil {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    Civil {
        year,
        month,
        day,
        hour: (rem / 3600) as u32,
        minute: (rem / 60 % 60) as u32,
        second: (rem % 60) as u32,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as u32,
    }
}

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        // date -u -d @0, @951782400 (leap day 2000), @1798761599 (end of 2026), @4107542400.
        let c =
            |y, mo, d, h, mi, s, w| Civil { year: y, month: mo, day: d, hour: h, minute: mi, second: s, weekday: w };
        assert_eq!(from_unix(0), c(1970, 1, 1, 0, 0, 0, 4));
        assert_eq!(from_unix(951_782_400), c(2000, 2, 29, 0, 0, 0, 2));
        assert_eq!(from_unix(1_798_761_599), c(2026, 12, 31, 23, 59, 59, 4));
        assert_eq!(from_unix(4_107_542_400), c(2100, 3, 1, 0, 0, 0, 1));
        assert_eq!(from_unix(-1), c(1969, 12, 31, 23, 59, 59, 3));
    }

    #[test]
    fn every_day_follows_the_last() {
        // Walk 1,000 years day by day: fields stay in range and advance by exactly one day.
        let mut prev = from_unix(0);
        for d in 1..365_250i64 {
            let c = from_unix(d * 86_400);
            assert!((1..=12).contains(&c.month) && (1..=31).contains(&c.day), "{c:?}");
            assert_eq!(c.weekday, (prev.weekday + 1) % 7);
            if c.day != prev.day + 1 {
                assert_eq!(c.day, 1, "{prev:?} -> {c:?}");
                assert!(c.month == prev.month % 12 + 1);
            }
            prev = c;
        }
    }
}
