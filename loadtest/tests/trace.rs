//! Trace replay through sockets: smg-load replays the shipped sample traces; a recording server
//! checks every send time against the trace's offsets and every request's lengths, and smg-sim
//! checks token counters and the Mooncake prefix sharing as cached tokens.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use smg_loadtest::load::trace::Trace;
use smg_loadtest::sim::request::{self, Api};
use sonic_rs::JsonValueTrait;

/// The two tests take turns: the timing one measures to 1 ms on a small box.
static SERIAL: Mutex<()> = Mutex::new(());

/// CPU time the hypervisor took from this virtual machine's runnable cores so far (the
/// `steal` column of /proc/stat; zero on bare metal). While a core is taken, nothing on it
/// runs, a send included.
fn stolen() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 =
        stat.lines().next().and_then(|l| l.split_whitespace().nth(8)).and_then(|t| t.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

fn sample(name: &str) -> String {
    format!("{}/traces/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// (arrival of the request's first byte, in ns of the realtime clock, body) per request.
type Log = Arc<Mutex<Vec<(i128, Vec<u8>)>>>;

/// One read with the kernel's receive timestamp of its first byte (`SO_TIMESTAMPNS`): when the
/// bytes reached this socket, whenever this thread gets to run. On a busy box a woken reader
/// may start milliseconds late; that delay is the recorder's, not the load generator's.
fn recv_stamped(s: &std::net::TcpStream, buf: &mut [u8]) -> std::io::Result<(usize, Option<i128>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: fd is open; msg points at live buffers.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let t: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                stamp = Some(t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, stamp))
}

/// Now on the realtime clock, in ns (what receive timestamps are in).
fn realtime_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128
}

/// A keep-alive HTTP server that records when each request starts arriving and answers `{}`.
fn recording_server() -> (u16, Log) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let log = log2.clone();
            std::thread::spawn(move || {
                s.set_nodelay(true).ok();
                let on: libc::c_int = 1;
                // SAFETY: setting an int socket option on an open socket.
                let rc = unsafe {
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&s),
                        libc::SOL_SOCKET,
                        libc::SO_TIMESTAMPNS,
                        (&on as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as _,
                    )
                };
                assert_eq!(rc, 0, "SO_TIMESTAMPNS: {}", std::io::Error::last_os_error());
                let mut buf: Vec<u8> = Vec::new();
                let mut chunk = vec![0u8; 1 << 16];
                let mut started: Option<i128> = None;
                loop {
                    // Whole requests already buffered (pipelining is not used, but be safe).
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .split("content-length: ")
                            .nth(1)
                            .and_then(|r| r.split("\r\n").next())
                            .and_then(|n| n.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            let body = buf[end + 4..end + 4 + len].to_vec();
                            buf.drain(..end + 4 + len);
                            log.lock().unwrap().push((started.take().unwrap_or_else(realtime_ns), body));
                            let resp =
                                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                            if s.write_all(resp).is_err() {
                                return;
                            }
                            if !buf.is_empty() {
                                started = Some(realtime_ns());
                            }
                            continue;
                        }
                    }
                    match recv_stamped(&s, &mut chunk) {
                        Ok((0, _)) | Err(_) => return,
                        Ok((n, stamp)) => {
                            if buf.is_empty() && started.is_none() {
                                started = Some(stamp.unwrap_or_else(realtime_ns));
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                    }
                }
            });
        }
    });
    (port, log)
}

/// One replay of the Azure sample against a recording server: the lengths must be exact
/// (panics otherwise); the send times are judged and returned as a verdict, because a replay
/// can lose to the host (below) where a second one does not.
fn replay_azure(trace: &Trace, legacy: bool) -> Result<String, String> {
    let n = trace.entries.len();
    let (port, log) = recording_server();
    let url = format!("http://127.0.0.1:{port}");
    let steal_before = stolen();
    let r = smg_load(&["run", "--url", &url, "--trace", &sample("azure-sample.csv"), "--json"], legacy);
    let steal = stolen().saturating_sub(steal_before);
    assert_eq!(r["requests"].as_u64(), Some(n as u64), "{r:?}");
    assert_eq!(r["ok"].as_u64(), Some(n as u64));
    let mut got = log.lock().unwrap().clone();
    assert_eq!(got.len(), n);
    got.sort_by_key(|(t, _)| *t);
    // Lengths, exactly: the simulator's token count (raw prompt JSON bytes / 4) and max_tokens.
    let mut seen: Vec<(u64, u64)> = got
        .iter()
        .map(|(_, b)| {
            let q = request::parse(Api::Chat, b).unwrap();
            (q.prompt.len().div_ceil(4) as u64, q.max_tokens.unwrap())
        })
        .collect();
    let mut want: Vec<(u64, u64)> = trace.entries.iter().map(|e| (e.input_tokens, e.output_tokens)).collect();
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(seen, want);
    // Send times against the trace's offsets. The server cannot see the run's start, so the
    // anchor is the request sent earliest against its offset: every error is then lateness.
    let t0 = got.iter().zip(&trace.entries).map(|((t, _), e)| *t - e.offset_us as i128 * 1000).min().unwrap();
    let errs: Vec<i64> =
        got.iter().zip(&trace.entries).map(|((t, _), e)| ((*t - t0) / 1000) as i64 - e.offset_us as i64).collect();
    if std::env::var("TRACE_DEBUG").is_ok() {
        for (i, e) in errs.iter().enumerate() {
            eprintln!("DBG {i} err {e} offset {}", trace.entries[i].offset_us);
        }
    }
    // Sends land within 1 ms of the trace, measured by the kernel's receive timestamps.
    // Bounded, not all: no sender avoids the time it is not on a core. On a virtual machine
    // the host takes a core for milliseconds at a time (steal), and on a busy box (a CI run
    // with a release build beside it) other processes hold both cores while the sender is
    // ready (its run-queue wait, which smg-load reports from its threads' schedstat). What that
    // lost time can explain, at most: each send due while the sender was off a core, and, for
    // each other late send, a wait of its own longer than 1 ms, so one per millisecond lost.
    // (A fresh-clone CI run beside a release build lost 128 ms and had 49 of 300 late, most by
    // 3-4 ms, one scheduler slice each: more than the sends due in that time, 28, allowed.) A
    // timer that is wrong is late whatever the host does (the 2 ms busy-wait it replaced: 60-75
    // of 300 on an idle box, where a few ms are lost).
    let late: Vec<(usize, i64)> = errs.iter().copied().enumerate().filter(|(_, e)| e.unsigned_abs() > 1000).collect();
    let span = trace.entries.last().map_or(1, |e| e.offset_us.max(1)) as u128;
    let waited = Duration::from_secs_f64(r["sender_cpu_wait_ms"].as_f64().unwrap_or(0.0) / 1000.0);
    let lost = steal + waited;
    let allowed = n / 20 + (lost.as_micros() * n as u128).div_ceil(span) as usize + lost.as_millis() as usize;
    let mut sorted: Vec<u64> = errs.iter().map(|e| e.unsigned_abs()).collect();
    sorted.sort_unstable();
    let figures = format!(
        "send-time error p50 {} µs, p99 {} µs, worst {} µs, {} of {n} over 1 ms (allowed {allowed}), host stole {steal:?}, the sender waited for a CPU {waited:?}",
        sorted[n / 2],
        sorted[n * 99 / 100],
        sorted[n - 1],
        late.len()
    );
    if late.len() > allowed || sorted[n / 2] >= 250 {
        return Err(format!("{figures}; late (index, µs): {late:?}"));
    }
    Ok(figures)
}

#[test]
fn azure_arrivals_and_lengths_are_reproduced() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let trace = Trace::load(&sample("azure-sample.csv")).unwrap();
    // Up to three replays per driver, and one within bounds passes. Late sends from the host
    // come in bursts (a fresh-clone CI run saw 32 of 300 late in 10 ms runs while /proc/stat
    // showed 160 ms stolen, one over the bound); a sender whose timer is wrong is late in every
    // replay (the 2 ms busy-wait this timer replaced had 60-75 of 300 late, every time).
    // Measured on a 2-core VM: median 50-110 µs, 0-6 of 300 over 1 ms.
    for legacy in DRIVERS {
        let mut failed = Vec::new();
        let passed = (0..3).find_map(|_| match replay_azure(&trace, legacy) {
            Ok(figures) => Some(figures),
            Err(why) => {
                eprintln!("azure sample, legacy={legacy}: replay out of bounds: {why}");
                failed.push(why);
                None
            }
        });
        let Some(figures) = passed else { panic!("three replays out of bounds, legacy={legacy}: {failed:#?}") };
        eprintln!("azure sample, legacy={legacy}: {figures} ({} replays out of bounds first)", failed.len());
    }
}

#[test]
fn mooncake_prefix_sharing_shows_as_cached_tokens() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let trace = Trace::load(&sample("mooncake-sample.jsonl")).unwrap();
    let e = &trace.entries;
    // What a prefix cache should find: for each request, its longest token prefix in common
    // with any earlier request (same leading hash ids; a shorter request's partial last block is
    // a prefix of the same block in full).
    let mut expected = 0u64;
    for (i, r) in e.iter().enumerate() {
        let best = e[..i]
            .iter()
            .map(|q| {
                let c = r.hash_ids.iter().zip(&q.hash_ids).take_while(|(a, b)| a == b).count() as u64;
                (c * 512).min(r.input_tokens).min(q.input_tokens)
            })
            .max()
            .unwrap_or(0);
        expected += best;
    }
    let prompt: u64 = e.iter().map(|x| x.input_tokens).sum();
    let output: u64 = e.iter().map(|x| x.output_tokens).sum();
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--cache-tokens", "8000000"], legacy);
        let url = format!("http://127.0.0.1:{}", sim.port());
        let r = smg_load(
            &["run", "--url", &url, "--trace", &sample("mooncake-sample.jsonl"), "--speedup", "4", "--json"],
            legacy,
        );
        assert_eq!(r["ok"].as_u64(), Some(e.len() as u64), "{r:?}");
        let st = http(sim.port(), "GET", "/sim/stats", "").json();
        assert_eq!(st["prompt_tokens"].as_u64(), Some(prompt));
        assert_eq!(st["output_tokens"].as_u64(), Some(output));
        let cached = st["cached_tokens"].as_u64().unwrap();
        // Chat's 27-byte message opening shifts the text against the simulator's 16-token blocks:
        // each request may lose its last partly-shared block.
        let slack = 16 * e.len() as u64;
        assert!(cached <= expected && cached + slack >= expected, "cached {cached}, expected ~{expected}");
        assert!(cached > prompt / 3, "sample shares most of its prompts: {cached} of {prompt}");
        eprintln!("mooncake sample: cached {cached} of {prompt} prompt tokens (block model {expected})");
    }
}
