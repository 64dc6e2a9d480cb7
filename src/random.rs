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

/// Kernel random bytes drawn in blocks: one getrandom(2) per 256 bytes per thread instead of
/// one per id (a Responses turn names three to five records). The bytes are the kernel's,
/// each handed out once.
pub fn buffered<const N: usize>() -> [u8; N] {
    use std::cell::RefCell;
    const BLOCK: usize = 256;
    thread_local! {
        static POOL: RefCell<([u8; BLOCK], usize)> = const { RefCell::new(([0; BLOCK], BLOCK)) };
    }
    let mut out = [0u8; N];
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let mut filled = 0;
        while filled < N {
            if p.1 == BLOCK {
                p.0 = bytes::<BLOCK>();
                p.1 = 0;
            }
            let take = (N - filled).min(BLOCK - p.1);
            let at = p.1;
            out[filled..filled + take].copy_from_slice(&p.0[at..at + take]);
            p.0[at..at + take].fill(0);
            p.1 += take;
            filled += take;
        }
    });
    out
}
