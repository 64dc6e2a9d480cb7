//! The HTTP `Date` header value (IMF-fixdate, RFC 9110 §5.6.7), formatted once per second.

use crate::civil;

/// `Sun, 06 Nov 1994 08:49:37 GMT`: always 29 bytes.
pub const LEN: usize = 29;

pub fn imf_fixdate(unix_secs: i64) -> [u8; LEN] {
    const DAYS: [&[u8; 3]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
    const MONTHS: [&[u8; 3]; 12] =
        [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
    let c = civil::from_unix(unix_secs);
    let mut out = *b"Sun, 00 Jan 0000 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[c.weekday as usize]);
    let two = |out: &mut [u8; LEN], at: usize, v: u32| {
        out[at] = b'0' + (v / 10) as u8;
        out[at + 1] = b'0' + (v % 10) as u8;
    };
    two(&mut out, 5, c.day);
    out[8..11].copy_from_slice(MONTHS[c.month as usize - 1]);
    let y = c.year.clamp(0, 9999) as u32;
    two(&mut out, 12, y / 100);
    two(&mut out, 14, y % 100);
    two(&mut out, 17, c.hour);
    two(&mut out, 20, c.minute);
    two(&mut out, 23, c.second);
    out
}

/// One shard's current `Date` value. The shard's ticker refreshes it every 100 ms, so a
/// response costs no clock read for it (nginx likewise caches its time per loop turn); the
/// header may lag the second's turn by up to one tick.
pub struct DateCache {
    secs: std::cell::Cell<i64>,
    text: std::cell::Cell<[u8; LEN]>,
}

impl Default for DateCache {
    fn default() -> Self {
        let now = civil::now_unix();
        Self { secs: std::cell::Cell::new(now), text: std::cell::Cell::new(imf_fixdate(now)) }
    }
}

impl DateCache {
    /// The value as of the last refresh.
    pub fn get(&self) -> [u8; LEN] {
        self.text.get()
    }

    /// Re-reads the clock; re-formats when the second changed.
    pub fn refresh(&self) {
        let now = civil::now_unix();
        if now != self.secs.get() {
            self.secs.set(now);
            self.text.set(imf_fixdate(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_example_and_edges() {
        assert_eq!(&imf_fixdate(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&imf_fixdate(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&imf_fixdate(1_798_761_599), b"Thu, 31 Dec 2026 23:59:59 GMT");
    }
}
