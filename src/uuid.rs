//! UUIDv7 strings: the admin API's worker ids (as SMG hands out) and the process id of
//! the hop marker (`http/hop.rs`).

/// A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits (the uuid crate,
/// over the kernel's getrandom).
pub fn uuid_v7() -> String {
    uuid::Uuid::now_v7().to_string()
}
