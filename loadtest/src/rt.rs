//! Runtime plumbing shared by both tools: one monoio runtime per thread, core pinning, SO_REUSEPORT listeners, buffered
//! writes, list parsing.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use monoio::io::AsyncWriteRentExt;
use monoio::net::{ListenerOpts, TcpListener, TcpStream};

/// Builds this thread's runtime (io_uring when the kernel allows, else epoll) and runs `fut` to completion.
///
/// The fusion driver honours `MONOIO_FORCE_LEGACY_DRIVER=1`, which is how tests cover both drivers.
pub fn block_on<F: Future>(fut: F) -> io::Result<F::Output> {
    // COOP_TASKRUN + SINGLE_ISSUER, as the gateway does (src/runtime/mod.rs has the
    // measurement): each thread is its ring's only submitter, so the kernel need not
    // interrupt it to run completions. A kernel that refuses the flags gets a plain ring.
    let mut tuned = io_uring::IoUring::builder();
    tuned.setup_coop_taskrun().setup_single_issuer();
    let base = || monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer();
    let mut rt = base().uring_builder(tuned).build().or_else(|_| base().build())?;
    Ok(rt.block_on(fut))
}

/// Which driver the fusion builder will pick on this machine, for logs and reports.
pub fn driver_name() -> &'static str {
    if monoio::utils::detect_uring() {
        "io_uring"
    } else {
        "epoll"
    }
}

/// Pins the calling thread to `core`; returns false when the core does not exist or pinning is refused.
pub fn pin_to(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Writes and clears `out`, keeping its allocation (the simulator's connections reuse one
/// output buffer for every response).
pub async fn write_out(stream: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let buf = std::mem::take(out);
    let (res, mut buf) = stream.write_all(buf).await;
    buf.clear();
    *out = buf;
    res.map(|_| ())
}

/// A listener that shares its port with other threads (SO_REUSEPORT) so the kernel spreads connections.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let opts = ListenerOpts::new().reuse_port(true).reuse_addr(true).backlog(4096);
    TcpListener::bind_with_config(addr, &opts)
}

/// Parses "18001-18004,18010" into every number it names, in order.
pub fn parse_list(spec: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u64 = a.trim().parse().map_err(|_| format!("bad number in {part:?}"))?;
                let b: u64 = b.trim().parse().map_err(|_| format!("bad number in {part:?}"))?;
                if b < a || b - a > 65_535 {
                    return Err(format!("bad range {part:?}"));
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| format!("bad number {part:?}"))?),
        }
    }
    if out.is_empty() {
        return Err(format!("empty list {spec:?}"));
    }
    Ok(out)
}

/// Parses a port list ("18001-18016").
pub fn parse_ports(spec: &str) -> Result<Vec<u16>, String> {
    parse_list(spec)?.into_iter().map(|p| u16::try_from(p).map_err(|_| format!("port {p} out of range"))).collect()
}

/// Parses a core list ("0", "0-3,6").
pub fn parse_cores(spec: &str) -> Result<Vec<usize>, String> {
    Ok(parse_list(spec)?.into_iter().map(|c| c as usize).collect())
}

/// Parses "500ms", "10s", "2m" or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(v) = s.strip_suffix("ms") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60.0)
    } else {
        (s, 1.0)
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(n >= 0.0 && n.is_finite()) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(std::time::Duration::from_secs_f64(n * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_ports("18001-18003,18010").unwrap(), vec![18001, 18002, 18003, 18010]);
        assert_eq!(parse_cores("1").unwrap(), vec![1]);
        assert!(parse_ports("5-3").is_err());
        assert!(parse_ports("70000").is_err());
        assert!(parse_ports("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        assert_eq!(parse_duration("3s").unwrap().as_secs(), 3);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("1.5").unwrap().as_millis(), 1500);
        assert!(parse_duration("x").is_err());
    }
}
