//! A closed-loop WebSocket load: N sessions on one pinned thread, each sending one text
//! message of a fixed size and waiting for its echo, over and over, for the duration. What
//! it measures: messages per second, the round trip per message, and the CPU the target's
//! process tree spent per message in the measured window (from /proc, as `compare` does
//! for requests).
//!
//! Every message is the same pre-masked frame (masking is per frame, and a fixed key is
//! a valid one), so the generator does no per-message work beyond the write and the read.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use smg_wire::ws;

use crate::load::cpu::{self, Ticks};
use crate::load::report::{new_histogram, Percentiles};
use crate::rt;

/// One WebSocket load run.
#[derive(Debug, Clone)]
pub struct WsPlan {
    pub addr: SocketAddr,
    /// The upgrade request's target, e.g. `/v1/realtime?model=m`.
    pub target: String,
    pub sessions: usize,
    /// Payload bytes of each text message.
    pub message: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub core: Option<usize>,
    /// Processes whose CPU is measured (the system under test).
    pub target_pids: Vec<u32>,
    /// Header lines sent with the upgrade ("Name: value").
    pub headers: Vec<String>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct WsResult {
    pub messages: u64,
    pub errors: u64,
    pub seconds: f64,
    pub latency_ms: Option<Percentiles>,
    /// The target's CPU in the window, when a pid was given.
    pub cpu: Option<Ticks>,
}

impl WsResult {
    pub fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.messages as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// CPU µs per message (total, system).
    pub fn cpu_us_per_message(&self) -> Option<(f64, f64)> {
        let t = self.cpu?;
        let n = self.messages.max(1) as f64;
        Some((cpu::ticks_to_us(t.total()) / n, cpu::ticks_to_us(t.system) / n))
    }
}

/// Where the run is; read by every session between messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
    Stop,
}

struct Shared {
    phase: Cell<Phase>,
    messages: Cell<u64>,
    errors: Cell<u64>,
    latency: RefCell<Histogram<u64>>,
}

/// Runs `plan` on a thread of its own and returns what it measured.
pub fn run(plan: &WsPlan) -> Result<WsResult, String> {
    let plan = plan.clone();
    let t = std::thread::spawn(move || {
        if let Some(c) = plan.core {
            rt::pin_to(c);
        }
        rt::block_on(drive(plan)).map_err(|e| format!("runtime: {e}"))?
    });
    t.join().map_err(|_| "ws load thread panicked".to_string())?
}

fn tree_ticks(pids: &[u32]) -> Option<Ticks> {
    let mut total = Ticks::default();
    for &p in pids {
        let t = cpu::tree_ticks(p)?;
        total.user += t.user;
        total.system += t.system;
    }
    (!pids.is_empty()).then_some(total)
}

async fn drive(plan: WsPlan) -> Result<WsResult, String> {
    let shared = Rc::new(Shared {
        phase: Cell::new(Phase::Warmup),
        messages: Cell::new(0),
        errors: Cell::new(0),
        latency: RefCell::new(new_histogram()),
    });
    let frame = Rc::new(message_frame(plan.message));
    let request = Rc::new(upgrade_request(&plan));
    let mut joins = Vec::with_capacity(plan.sessions);
    for i in 0..plan.sessions {
        let (s, f, r) = (Rc::clone(&shared), Rc::clone(&frame), Rc::clone(&request));
        let addr = plan.addr;
        let len = plan.message;
        joins.push(monoio::spawn(async move {
            if let Err(e) = session(addr, &r, &f, len, &s).await {
                if s.phase.get() != Phase::Stop {
                    s.errors.set(s.errors.get() + 1);
                    if i == 0 {
                        eprintln!("ws session: {e}");
                    }
                }
            }
        }));
    }
    monoio::time::sleep(plan.warmup).await;
    let before = tree_ticks(&plan.target_pids);
    let start = Instant::now();
    shared.phase.set(Phase::Measure);
    monoio::time::sleep(plan.duration).await;
    shared.phase.set(Phase::Stop);
    let seconds = start.elapsed().as_secs_f64();
    let after = tree_ticks(&plan.target_pids);
    // Sessions still waiting for an echo are dropped with the runtime, not awaited.
    drop(joins);
    let latency = Percentiles::of(&shared.latency.borrow());
    Ok(WsResult {
        messages: shared.messages.get(),
        errors: shared.errors.get(),
        seconds,
        latency_ms: latency,
        cpu: before.zip(after).map(|(b, a)| a.since(b)),
    })
}

fn upgrade_request(plan: &WsPlan) -> Vec<u8> {
    let mut r = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        plan.target, plan.addr
    );
    for h in &plan.headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// One masked text frame of `len` payload bytes (printable, like an event's JSON).
fn message_frame(len: usize) -> Vec<u8> {
    let mask = [0x5a, 0x17, 0xc3, 0x09];
    let mut f = Vec::with_capacity(len + ws::MAX_HEAD);
    ws::put_head(&mut f, true, ws::OP_TEXT, len as u64, Some(mask));
    let at = f.len();
    f.extend((0..len).map(|i| b'a' + (i % 26) as u8));
    ws::apply_mask(&mut f[at..], mask, 0);
    f
}

async fn read_some(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    let len = buf.len();
    let (res, slice) = s.read(std::mem::take(buf).slice_mut(len..)).await;
    *buf = slice.into_inner();
    match res {
        Ok(0) => Err("connection closed".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads until a whole frame is at the front of `buf`; returns its head.
async fn next_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<ws::FrameHead, String> {
    loop {
        if let Some(h) = ws::parse_head(buf) {
            if buf.len() as u64 >= h.head_len as u64 + h.len {
                return Ok(h);
            }
        }
        read_some(s, buf).await?;
    }
}

async fn session(addr: SocketAddr, request: &[u8], frame: &[u8], len: usize, sh: &Shared) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    let (res, _) = s.write_all(request.to_vec()).await;
    res.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(16 * 1024);
    let head_end = loop {
        if let Some(p) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            break p + 4;
        }
        read_some(&mut s, &mut buf).await?;
    };
    if !buf.starts_with(b"HTTP/1.1 101") {
        return Err(format!("no upgrade: {}", String::from_utf8_lossy(&buf[..head_end.min(80)])));
    }
    buf.drain(..head_end);
    let mut out = frame.to_vec();
    loop {
        if sh.phase.get() == Phase::Stop {
            return Ok(());
        }
        let sent = Instant::now();
        let (res, b) = s.write_all(out).await;
        out = b;
        res.map_err(|e| format!("write: {e}"))?;
        // The echo of our message; anything else first (the worker's session.created) is skipped.
        loop {
            let h = next_frame(&mut s, &mut buf).await?;
            let end = h.head_len + h.len as usize;
            let echo = h.opcode == ws::OP_TEXT && h.len as usize == len;
            buf.drain(..end);
            if echo {
                break;
            }
            if h.opcode == ws::OP_CLOSE {
                return Err("closed by the peer".into());
            }
        }
        if sh.phase.get() == Phase::Measure {
            sh.messages.set(sh.messages.get() + 1);
            let _ = sh.latency.borrow_mut().record(sent.elapsed().as_micros() as u64);
        }
    }
}
