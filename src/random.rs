//! Unpredictable bytes, from the kernel's random source: what a peer must not be able to
//! guess (a WebSocket frame mask, RFC 6455 §5.3; a handshake key, §4.1; the random bits of a
//! UUIDv7). Cheap choices that only spread load (`routing/rng.rs`, the shard's request-id
//! generator) stay on their own fast generators.

/// `N` random bytes. getrandom(2) fails only before the kernel's pool is first seeded, long
/// before a gateway is serving; were it to fail, this panics inside one request's isolation.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the kernel's random source");
    b
}
