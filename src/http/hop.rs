//! The hop marker: every request this gateway sends a worker names the gateways it has
//! been through in `x-smg-hop` (the ones it arrived with, then this process's id). A
//! request that arrives naming this process has looped — a worker URL that is the gateway
//! itself under another name, or a proxy that sends it back — and is refused with 508
//! instead of being forwarded again (one such request was forwarded 467,000 times in 90 s).
//! Registration already refuses the gateway's own listeners (`workers/fleet.rs`); this
//! catches what an address check cannot see.

use std::sync::OnceLock;

/// Longest chain of gateways accepted: a chain longer than this is a loop of gateways
/// that are not this one, and the header must not grow without end.
const MAX_HOPS: usize = 8;

/// This process's id (a UUIDv7): unique per process, the same on every shard.
fn own() -> &'static str {
    static OWN: OnceLock<String> = OnceLock::new();
    OWN.get_or_init(crate::uuid::uuid_v7)
}

/// The request has been here before, or through too many gateways.
pub fn looped(received: &[u8]) -> bool {
    let own = own().as_bytes();
    let mut hops = 0;
    for id in received.split(|&b| b == b',') {
        hops += 1;
        if hops >= MAX_HOPS || smg_wire::header::trim(id) == own {
            return true;
        }
    }
    false
}

/// Writes the marker line: the hops the request came with, then this gateway.
pub fn write(out: &mut Vec<u8>, received: Option<&[u8]>) {
    out.extend_from_slice(b"x-smg-hop: ");
    if let Some(r) = received {
        out.extend_from_slice(r);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(own().as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_names_this_gateway_has_looped() {
        let mut out = Vec::new();
        write(&mut out, None);
        let first = out[b"x-smg-hop: ".len()..out.len() - 2].to_vec();
        assert!(looped(&first));
        assert!(!looped(b"0190-other-gateway"));
        out.clear();
        write(&mut out, Some(b"a, b"));
        let line = String::from_utf8(out).unwrap();
        assert_eq!(line, format!("x-smg-hop: a, b, {}\r\n", own()));
        assert!(looped(&line.trim_end().as_bytes()["x-smg-hop: ".len()..]));
        assert!(!looped(b"a,b,c,d,e,f,g"), "seven other gateways");
        assert!(looped(b"a,b,c,d,e,f,g,h"), "eight is a loop of others");
    }
}
