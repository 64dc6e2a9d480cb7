//! smg-sim: many simulated SGLang / vLLM workers in one process, thread-per-core on monoio.
//!
//! Each worker (one port) is owned by one runtime thread, so its batch slots, waiting queue and
//! prefix cache are exact and need no locks; workers are spread round-robin over `--threads`.
//! Listeners use SO_REUSEPORT so a restarted simulator can rebind at once.
//!
//! Boot order: every thread binds its ports, reports them, then the main thread prints one
//! `listening` line per worker followed by `ready` (scripts wait for that line; a caller in this
//! process takes the ports from [`start`]'s answer).
//!
//! With `--grpc` the ports speak SGLang's scheduler gRPC API instead (grpc/mod.rs). With
//! `--pd-role` the workers are prefill or decode servers of PD pairs, in SGLang's or vLLM's shape
//! by their runtime (pd/mod.rs); a prefill worker also binds its bootstrap port here, and its
//! `listening` line says where. With `--kv-events-endpoint` HTTP workers publish their KV-cache
//! events over ZMQ from a thread of their own (zmq_events.rs), bound before any worker starts.

pub mod admission;
pub mod bootstrap;
pub mod config;
pub mod engine;
pub mod faults;
pub mod grpc;
pub mod handoff;
pub mod http;
pub mod kv_events;
pub mod pace;
pub mod pd;
pub mod prefix_cache;
pub mod profile;
pub mod provider;
pub mod provider_responses;
pub mod realtime;
pub mod render;
pub mod request;
pub mod request_log;
pub mod routes;
pub mod systemone;
pub mod timing;
pub mod tls;
pub mod tokenizer;
pub mod worker;
pub mod zmq_events;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use monoio::net::TcpListener;

use crate::rt;
use config::{SimArgs, WorkerSpec};
use worker::Worker;

/// Starts all workers and blocks until every one of them has died (or forever).
pub fn run(args: SimArgs) -> Result<(), String> {
    start(args)?.wait();
    Ok(())
}

/// A started simulator: where its workers listen, and their threads.
pub struct Started {
    /// One per worker, in the order of the flags that named them.
    pub bound: Vec<Bound>,
    /// With `--tls-dir`: each worker's TLS port, in the same order.
    pub tls: Vec<u16>,
    /// With `--connect-proxy-port`: the proxy's port.
    pub proxy: Option<u16>,
    joins: Vec<std::thread::JoinHandle<()>>,
}

impl Started {
    /// Blocks until every worker has died (or forever).
    pub fn wait(self) {
        for j in self.joins {
            let _ = j.join();
        }
    }
}

/// Binds every worker's ports, prints the `listening` and `ready` lines and returns without
/// waiting. A port given as 0 is the kernel's pick, and [`Started::bound`] says which: a
/// caller in the same process (a test) learns its ports from the sockets themselves, instead
/// of picking a free one first and racing anyone else for it until the bind.
pub fn start(args: SimArgs) -> Result<Started, String> {
    let mut specs = args.worker_specs()?;
    if args.tokenize_http && !args.grpc {
        tokenizer::ensure_dir(args.tokenizer_dir.as_deref())
            .map_err(|e| format!("writing the simulated tokenizer: {e}"))?;
    }
    if args.grpc {
        let dir = tokenizer::ensure_dir(args.tokenizer_dir.as_deref())
            .map_err(|e| format!("writing the simulated tokenizer: {e}"))?;
        let advertised_path =
            args.advertise_tokenizer_path.clone().unwrap_or_else(|| dir.to_string_lossy().into_owned());
        let llama = args.llama_url.as_deref().map(grpc::llama::parse_url).transpose()?;
        let markup = (args.reasoning_markup.clone(), args.tool_call_markup.clone());
        grpc::markup::check(&markup)?;
        for s in &mut specs {
            let (tokenizer_dir, advertised_path) = (dir.clone(), advertised_path.clone());
            s.grpc = Some(config::GrpcSpec {
                tokenizer_dir,
                advertised_path,
                llama,
                markup: markup.clone(),
                embedding: args.is_embedding,
                kv_events: !args.no_kv_events,
            });
        }
    }
    // The KV events' ZMQ sockets are bound before any worker starts, so `ready` means a
    // subscriber can connect.
    let zmq = start_zmq(&mut specs)?;
    let threads = args.threads.clamp(1, specs.len());
    let cores = args.cores.as_deref().map(rt::parse_cores).transpose()?;
    let host: IpAddr = args.host.parse().map_err(|_| format!("bad --host {:?}", args.host))?;
    let (tx, rx) = mpsc::channel::<Result<Vec<Bound>, String>>();
    let mut joins = Vec::new();
    for t in 0..threads {
        let mine: Vec<(usize, WorkerSpec)> =
            specs.iter().cloned().enumerate().filter(|(i, _)| i % threads == t).collect();
        let core = cores.as_ref().map(|c| c[t % c.len()]);
        let tx = tx.clone();
        let join = std::thread::Builder::new()
            .name(format!("smg-sim-{t}"))
            .spawn(move || {
                if let Some(c) = core {
                    if !rt::pin_to(c) {
                        eprintln!("smg-sim: could not pin thread {t} to core {c}");
                    }
                }
                let res = rt::block_on(serve_thread(host, mine, tx.clone()));
                if let Err(e) = res {
                    let _ = tx.send(Err(format!("runtime: {e}")));
                }
            })
            .map_err(|e| format!("spawn: {e}"))?;
        joins.push(join);
    }
    drop(tx);
    // Only the workers hold their KV event channels now: a dead worker's ends, and the ZMQ
    // thread closes its sockets.
    for s in &mut specs {
        if let Some(z) = s.kv_events_zmq.as_mut() {
            z.sink = None;
        }
    }
    let mut bound: Vec<Bound> = Vec::new();
    for _ in 0..threads {
        match rx.recv() {
            Ok(Ok(b)) => bound.extend(b),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a simulator thread exited during start-up".into()),
        }
    }
    bound.sort_unstable_by_key(|b| b.index);
    let (tls_ports, proxy_port) = match &args.tls_dir {
        Some(dir) => {
            let config = tls::server_config(dir)?;
            let plain: Vec<u16> = bound.iter().map(|b| b.port).collect();
            let proxy = args.connect_proxy_port.map(|p| (p, specs[0].connects.clone()));
            tls::start(config, host, args.tls_port.unwrap_or(0), &plain, proxy)?
        }
        None => (Vec::new(), None),
    };
    for (n, b) in bound.iter().enumerate() {
        let s = &specs[b.index];
        let proto = if s.grpc.is_some() { " protocol=grpc" } else { "" };
        // Appended after the older fields: scripts parse this line's prefix.
        let pd = match (&s.pd, b.bootstrap) {
            (Some(pd), Some(bport)) => format!(" role={} bootstrap={host}:{bport}", pd.role.name()),
            (Some(pd), None) => format!(" role={}", pd.role.name()),
            (None, _) => String::new(),
        };
        let kv = match zmq.get(&b.index) {
            Some(z) => match &z.replay {
                Some(r) => format!(" kv_events={} kv_events_replay={r}", z.endpoint),
                None => format!(" kv_events={}", z.endpoint),
            },
            None => String::new(),
        };
        let tls = tls_ports.get(n).map(|p| format!(" tls={host}:{p}")).unwrap_or_default();
        println!("listening {host}:{} model={} runtime={}{proto}{pd}{kv}{tls}", b.port, s.model, s.runtime.name());
    }
    if let Some(p) = proxy_port {
        println!("proxy {host}:{p}");
    }
    println!("ready driver={} threads={threads}", rt::driver_name());
    Ok(Started { bound, tls: tls_ports, proxy: proxy_port, joins })
}

/// Starts the ZMQ thread for the workers publishing KV events over ZMQ (none: no thread) and
/// gives each its channel; returns where each one's sockets were bound, by spec index.
fn start_zmq(specs: &mut [WorkerSpec]) -> Result<HashMap<usize, zmq_events::BoundEndpoints>, String> {
    let mut bindings = Vec::new();
    let mut publishing = Vec::new();
    for (i, s) in specs.iter_mut().enumerate() {
        if let Some(z) = s.kv_events_zmq.as_mut() {
            let (tx, rx) = flume::bounded(zmq_events::CHANNEL_BATCHES);
            z.sink = Some(tx);
            bindings.push(zmq_events::Binding {
                endpoint: z.endpoint.clone(),
                replay: z.replay.clone(),
                topic: z.topic.clone(),
                format: z.format,
                batches: rx,
            });
            publishing.push(i);
        }
    }
    if bindings.is_empty() {
        return Ok(HashMap::new());
    }
    let bound = zmq_events::start(bindings)?;
    let mut out = HashMap::new();
    for (i, at) in publishing.into_iter().zip(bound) {
        if let Some(z) = specs[i].kv_events_zmq.as_mut() {
            // The ports bound (a port 0 resolved), for /sim/stats.
            z.endpoint.clone_from(&at.endpoint);
            z.replay.clone_from(&at.replay);
        }
        out.insert(i, at);
    }
    Ok(out)
}

/// A worker's bound ports, reported by its thread for the `listening` lines.
pub struct Bound {
    /// Index into the specs.
    index: usize,
    pub port: u16,
    /// A PD prefill worker's bootstrap port.
    pub bootstrap: Option<u16>,
}

async fn serve_thread(host: IpAddr, mine: Vec<(usize, WorkerSpec)>, tx: mpsc::Sender<Result<Vec<Bound>, String>>) {
    let bind = |port: u16| {
        let addr = SocketAddr::new(host, port);
        let l = rt::listen(addr).map_err(|e| format!("bind {addr}: {e}"))?;
        let bound = l.local_addr().map(|a| a.port()).unwrap_or(port);
        Ok::<_, String>((l, bound))
    };
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for (index, mut spec) in mine {
        let (l, port) = match bind(spec.port) {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let bootstrap = match &spec.pd {
            Some(pd) if pd.role == pd::PdRole::Prefill => match bind(pd.bootstrap_port) {
                Ok(b) => Some(b),
                Err(e) => {
                    let _ = tx.send(Err(format!("bootstrap: {e}")));
                    return;
                }
            },
            _ => None,
        };
        if let (Some(pd), Some((_, bport))) = (spec.pd.as_mut(), bootstrap.as_ref()) {
            // A vLLM prefill names where its KV can be fetched in every answer: the real port.
            pd.bootstrap_addr = Some(SocketAddr::new(host, *bport));
        }
        bound.push(Bound { index, port, bootstrap: bootstrap.as_ref().map(|b| b.1) });
        listeners.push((Worker::new(&spec, port), l, bootstrap.map(|b| b.0)));
    }
    let _ = tx.send(Ok(bound));
    let mut handles = Vec::new();
    for (w, l, bootstrap) in listeners {
        if let Some(b) = bootstrap {
            handles.push(monoio::spawn(bootstrap::serve(w.clone(), b)));
        }
        handles.push(monoio::spawn(accept_loop(w, l)));
    }
    for h in handles {
        h.await;
    }
}

/// Accepts until the worker dies; dropping the listener then closes the port.
#[allow(unsafe_code)]
async fn accept_loop(w: Rc<Worker>, listener: TcpListener) {
    while !w.died.is_fired() {
        let delay = w.faults.get().accept_delay_ms;
        if delay > 0 {
            monoio::time::sleep(Duration::from_millis(delay)).await;
            if w.died.is_fired() {
                break;
            }
        }
        // Cancelled by the worker's death rather than dropped: an accept the kernel completed
        // as the worker died still comes back here. A dropped one would leak its connection,
        // open and never read, and the gateway on it would wait for an answer forever.
        match listener.cancelable_accept(w.accept_handle()).await {
            Ok((stream, _)) => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                if w.died.is_fired() {
                    // Accepted as the worker died: cut at once, as a dead process's would be.
                    // SAFETY: `stream` owns the fd and is alive; shutdown(2) does not close it.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    break;
                }
                // Listed before its task first runs, so a death in between shuts it down too.
                let guard = w.track(fd);
                if w.grpc.is_some() {
                    monoio::spawn(grpc::serve(w.clone(), stream, guard));
                } else {
                    monoio::spawn(http::serve(w.clone(), stream, guard));
                }
            }
            Err(_) if w.died.is_fired() => break,
            Err(e) => {
                // Out of fds or similar: back off instead of spinning.
                eprintln!("smg-sim: accept on port {}: {e}", w.port);
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // Dropping the listener is not enough when the simulator runs inside another process (a
    // test): on io_uring the close is queued on a ring that may never be entered again, and
    // the port would keep completing handshakes. shutdown() stops listening at once, whoever
    // else holds the socket.
    // SAFETY: the fd belongs to `listener`, alive until the end of this function.
    unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&listener), libc::SHUT_RDWR) };
}
