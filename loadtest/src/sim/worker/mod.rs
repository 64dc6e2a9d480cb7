//! One simulated worker's state on its owning thread: knobs, batch slots, prefix cache, health, counters, canned bodies
//! (and, in `grpc`, what the --grpc mode remembers).

pub mod grpc;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::rc::Rc;

use crate::rng::Rng;
use crate::sim::admission::Gate;
use crate::sim::config::{FaultPlan, GrpcSpec, Runtime, Timing, WorkerSpec};
use crate::sim::faults::Health;
use crate::sim::kv_events::{self, KvEventLog};
use crate::sim::pd::PdState;
use crate::sim::prefix_cache::{CacheResult, PrefixCache};
use crate::sim::render::put_json_str;
use crate::sim::zmq_events::{BoundEndpoints, ZmqPublisher};
use crate::sync::Event;
use grpc::GrpcState;

/// Counters reported by /sim/stats and /v1/loads.
#[derive(Default)]
pub struct Stats {
    pub requests: Cell<u64>,
    pub inference: Cell<u64>,
    pub completed: Cell<u64>,
    pub failed: Cell<u64>,
    pub hung: Cell<u64>,
    pub truncated: Cell<u64>,
    pub prompt_tokens: Cell<u64>,
    pub cached_tokens: Cell<u64>,
    pub output_tokens: Cell<u64>,
    /// Prompt plus output tokens of requests now holding a slot (SGLang's num_used_tokens).
    pub used_tokens: Cell<u64>,
    /// Inference requests that named a "data_parallel_rank", per rank (length --dp-size).
    pub dp_rank_requests: Vec<Cell<u64>>,
    /// Prefill: rooms handed to a decode (bootstrap answers 200).
    pub handoffs_served: Cell<u64>,
    /// Decode: rooms whose KV arrived.
    pub handoffs_waited: Cell<u64>,
    /// Decode: rooms whose KV never arrived (each failed a request with a 500).
    pub handoffs_failed: Cell<u64>,
    /// Decode: time requests spent waiting for KV, in µs.
    pub handoff_wait_us: Cell<u64>,
}

/// Adds `n` to a counter cell.
pub fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// A worker lives on exactly one thread, so its batch and cache accounting is exact and lock-free.
pub struct Worker {
    pub port: u16,
    pub model: String,
    /// The model name as a quoted JSON string, escaped once.
    pub model_json: String,
    pub runtime: Runtime,
    /// Header lines added to every response (`x-sim-port`), so tests can see which worker answered.
    pub extra_headers: Vec<u8>,
    pub timing: Cell<Timing>,
    pub faults: Cell<FaultPlan>,
    pub health: Health,
    /// Batch slots and KV-cache tokens; requests wait here for both (FIFO).
    pub gate: Rc<Gate>,
    pub max_running: usize,
    pub profile: Option<&'static str>,
    pub cache: RefCell<PrefixCache>,
    pub rng: Rng,
    /// Fired when the worker dies (--die-after, or /sim/control "die"): the accept loop stops and connections close.
    pub died: Event,
    pub max_body: usize,
    /// Unix seconds at start, used as `created`.
    pub created: u64,
    pub next_id: Cell<u64>,
    pub stats: Stats,
    pub models_body: Vec<u8>,
    pub model_info_body: Vec<u8>,
    pub server_info_body: Vec<u8>,
    pub embedding_json: String,
    /// Length of the vectors embeddings return (HTTP `/v1/embeddings`, gRPC Embed).
    pub embedding_dim: usize,
    /// Open connections by id, so a dying worker can shut them all down like a crashed process would.
    pub conns: RefCell<HashMap<u64, RawFd>>,
    /// Cancels the accept loop's pending accept when the worker dies.
    accept_cancel: RefCell<monoio::io::Canceller>,
    pub next_conn: Cell<u64>,
    /// The gRPC mode (tokenizer location); None serves HTTP.
    pub grpc: Option<GrpcSpec>,
    /// gRPC-only bookkeeping (requests in flight by id, aborts seen).
    pub grpc_state: GrpcState,
    /// A gRPC worker's KV-cache events (`SubscribeKvEvents`); None on HTTP workers.
    pub kv_events: Option<KvEventLog>,
    /// An HTTP worker's KV-cache events over ZMQ (--kv-events-endpoint); None without.
    pub zmq_events: Option<ZmqPublisher>,
    /// The prefill or decode role of a PD pair (--pd-role); None serves whole requests.
    pub(crate) pd: Option<PdState>,
    /// --tokenize-http: HTTP prompts are counted and cached in the simulated model's tokens.
    pub tokenize_http: bool,
    /// What it was sent (`/sim/requests`).
    pub requests: crate::sim::request_log::RequestLog,
    /// `--provider-keys`: it answers as the provider its requests' Host names (provider.rs).
    pub providers: Option<std::sync::Arc<crate::sim::provider::ProviderKeys>>,
    /// `/sim/control` `provider_fail`.
    pub provider_fail: Cell<Option<crate::sim::provider::ProviderFail>>,
    /// `/sim/connects`: the CONNECT proxy's log.
    pub connects: crate::sim::tls::ConnectLog,
}

// === impl Worker ===

impl Worker {
    pub fn new(spec: &WorkerSpec, port: u16) -> Rc<Self> {
        let mut model_json = Vec::new();
        put_json_str(&mut model_json, &spec.model);
        let model_json = String::from_utf8(model_json).unwrap_or_else(|_| "\"\"".into());
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let cache = PrefixCache::new(spec.cache_tokens, spec.block_tokens, spec.bytes_per_token);
        let m = &model_json;
        let models_body = format!(
            "{{\"object\":\"list\",\"data\":[{{\"id\":{m},\"object\":\"model\",\"created\":{created},\"owned_by\":\"{}\",\"root\":{m},\"parent\":null,\"max_model_len\":32768}}]}}",
            spec.runtime.name()
        )
        .into_bytes();
        let model_info_body = format!(
            "{{\"model_path\":{m},\"tokenizer_path\":{m},\"is_generation\":true,\"preferred_sampling_params\":null,\"weight_version\":\"default\",\"has_image_understanding\":false,\"has_audio_understanding\":false,\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"]}}"
        )
        .into_bytes();
        let server_info_body = format!(
            "{{\"model_path\":{m},\"tokenizer_path\":{m},\"served_model_name\":{m},\"port\":{port},\"tp_size\":1,\"dp_size\":{},\"max_running_requests\":{},\"max_total_num_tokens\":{},\"context_length\":32768,\"page_size\":{},\"version\":\"0.0.0-smg-sim\",\"internal_states\":[{{\"last_gen_throughput\":0.0}}]}}",
            spec.dp_size,
            spec.max_running,
            if spec.kv_cache_tokens > 0 { spec.kv_cache_tokens } else { cache.capacity_tokens() },
            spec.block_tokens
        )
        .into_bytes();
        let embedding_json = {
            let dim = spec.embedding_dim.max(1);
            let parts: Vec<String> = (0..dim)
                .map(|i| format!("{:.4}", ((i + 1) as f64 / dim as f64).sqrt() / (dim as f64).sqrt()))
                .collect();
            format!("[{}]", parts.join(","))
        };
        Rc::new(Self {
            port,
            model: spec.model.clone(),
            model_json,
            runtime: spec.runtime,
            extra_headers: format!("x-sim-port: {port}\r\n").into_bytes(),
            timing: Cell::new(spec.timing),
            faults: Cell::new(spec.faults),
            health: Health::new(spec.unhealthy_for_ms, spec.start_unhealthy, spec.flap_health_ms),
            gate: Gate::new(spec.max_running, spec.kv_cache_tokens),
            max_running: spec.max_running,
            profile: spec.profile,
            cache: RefCell::new(cache),
            rng: Rng::from_entropy(),
            died: Event::default(),
            max_body: spec.max_body,
            created,
            next_id: Cell::new(0),
            stats: Stats { dp_rank_requests: (0..spec.dp_size).map(|_| Cell::new(0)).collect(), ..Stats::default() },
            models_body,
            model_info_body,
            server_info_body,
            embedding_json,
            embedding_dim: spec.embedding_dim.max(1),
            conns: RefCell::new(HashMap::new()),
            accept_cancel: RefCell::new(monoio::io::Canceller::new()),
            next_conn: Cell::new(0),
            grpc: spec.grpc.clone(),
            grpc_state: GrpcState::default(),
            kv_events: spec.grpc.as_ref().is_some_and(|g| g.kv_events).then(KvEventLog::default),
            zmq_events: spec.kv_events_zmq.as_ref().and_then(|z| {
                let at = BoundEndpoints { endpoint: z.endpoint.clone(), replay: z.replay.clone() };
                z.sink.clone().map(|sink| ZmqPublisher::new(sink, at))
            }),
            pd: spec.pd.as_ref().map(PdState::new),
            tokenize_http: spec.tokenize_http,
            requests: Default::default(),
            providers: spec.providers.clone(),
            provider_fail: Cell::new(None),
            connects: spec.connects.clone(),
        })
    }

    pub fn running(&self) -> usize {
        self.gate.running()
    }

    pub fn waiting(&self) -> usize {
        self.gate.waiting()
    }

    /// (running, waiting) as the load endpoints report them: the real figures, or the
    /// "reported_load" override split as an engine holding that many requests would (slots
    /// first, the rest queued).
    pub fn reported_load(&self) -> (usize, usize) {
        match self.faults.get().reported_load {
            Some(n) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let running = n.min(self.max_running);
                (running, n - running)
            }
            None => (self.running(), self.waiting()),
        }
    }

    /// SGLang's max_total_num_tokens: the KV capacity when limited, else the prefix cache's.
    pub fn max_total_tokens(&self) -> u64 {
        match self.gate.capacity_tokens() {
            0 => self.cache.borrow().capacity_tokens(),
            n => n,
        }
    }

    /// Looks a prompt up in the prefix cache, storing its blocks (`key`: its cache bytes,
    /// `bytes_per_token` per token); a worker publishing KV events (gRPC, or ZMQ) publishes
    /// what that changed. `ids`: the prompt's token ids; None (an HTTP prompt) reads them from
    /// the bytes ([`kv_events::ids_from_bytes`]).
    pub fn cache_prompt(&self, key: &[u8], ids: Option<&[u32]>) -> CacheResult {
        let scratch = match (&self.kv_events, &self.zmq_events) {
            (Some(log), _) => &log.scratch,
            (None, Some(z)) => &z.scratch,
            (None, None) => return self.cache.borrow_mut().lookup_insert(key),
        };
        let mut changes = scratch.borrow_mut();
        let mut cache = self.cache.borrow_mut();
        let result = cache.lookup_insert_tracked(key, &mut changes);
        let (bt, bpt) = (cache.block_tokens(), cache.bytes_per_token());
        drop(cache);
        let ids_of = |i: usize| match ids {
            Some(ids) => ids[i * bt..(i + 1) * bt].to_vec(),
            None => kv_events::ids_from_bytes(&key[i * bt * bpt..(i + 1) * bt * bpt], bpt),
        };
        if let Some(log) = &self.kv_events {
            log.publish_changes(&changes, bt, ids_of);
        }
        if let Some(z) = &self.zmq_events {
            z.publish_changes(&changes, bt, ids_of);
        }
        result
    }

    /// Drops the whole prefix cache (a worker publishing KV events publishes that).
    pub fn flush_cache(&self) {
        self.cache.borrow_mut().flush();
        if let Some(log) = &self.kv_events {
            log.publish_cleared();
        }
        if let Some(z) = &self.zmq_events {
            z.publish_cleared();
        }
    }

    /// `kv_events_skip`: the next KV event batch is numbered `n` higher than it would be;
    /// false when the worker publishes no KV events.
    pub fn skip_kv_events(&self, n: u64) -> bool {
        match (&self.kv_events, &self.zmq_events) {
            (Some(log), _) => log.skip(n),
            (None, Some(z)) => z.skip(n),
            (None, None) => return false,
        }
        true
    }

    /// The `kv_events_skip` not yet applied; None when the worker publishes no KV events.
    pub fn kv_events_pending_skip(&self) -> Option<u64> {
        match (&self.kv_events, &self.zmq_events) {
            (Some(log), _) => Some(log.pending_skip()),
            (None, Some(z)) => Some(z.pending_skip()),
            (None, None) => None,
        }
    }

    /// The `"kv_events"` member of /sim/stats; None when the worker publishes no KV events.
    pub fn kv_events_stats(&self) -> Option<String> {
        match (&self.kv_events, &self.zmq_events) {
            (Some(log), _) => Some(log.stats_json()),
            (None, Some(z)) => Some(z.stats_json()),
            (None, None) => None,
        }
    }

    pub fn next_id(&self) -> u64 {
        let id = self.next_id.get() + 1;
        self.next_id.set(id);
        id
    }

    /// Registers an open connection; the guard unregisters it when dropped.
    pub fn track(self: &Rc<Self>, fd: RawFd) -> ConnGuard {
        let id = self.next_conn.get() + 1;
        self.next_conn.set(id);
        self.conns.borrow_mut().insert(id, fd);
        ConnGuard { worker: self.clone(), id }
    }

    /// For the accept loop's accept: cancelled when the worker dies.
    pub fn accept_handle(&self) -> monoio::io::CancelHandle {
        self.accept_cancel.borrow().handle()
    }

    /// Dies: the accept loop stops (the port closes), every open connection is shut down and
    /// the KV events' ZMQ sockets close.
    ///
    /// Connections in the middle of a stream are cut there: shutdown sends the peer FIN at once
    /// (it sees a chunked body without its last chunk), and the task's next write fails, so the
    /// stream is never finished. A task sleeping until its next token stops when it wakes.
    pub fn die(&self) {
        self.die_except(None);
    }

    /// Dies but leaves connection `spare` open, so the /sim/control request that asked for the
    /// death still gets its answer (its connection closes right after).
    #[allow(unsafe_code)]
    pub fn die_except(&self, spare: Option<u64>) {
        self.died.fire();
        if let Some(z) = &self.zmq_events {
            z.close();
        }
        let accept = std::mem::take(&mut *self.accept_cancel.borrow_mut());
        drop(accept.cancel());
        let mut conns = self.conns.borrow_mut();
        let kept = spare.and_then(|id| conns.remove(&id).map(|fd| (id, fd)));
        for (_, fd) in conns.drain() {
            // SAFETY: the fd belongs to a live connection: a ConnGuard removes its entry before the
            // stream that owns the fd is dropped. shutdown(2) does not close the fd, so the owner
            // still closes it exactly once; it only makes pending reads return EOF and writes fail.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
        if let Some((id, fd)) = kept {
            conns.insert(id, fd);
        }
    }

    /// Output tokens per second since start: SGLang's gen_throughput, averaged.
    pub fn gen_throughput(&self) -> f64 {
        let secs = self.health_uptime_secs();
        if secs <= 0.0 {
            0.0
        } else {
            self.stats.output_tokens.get() as f64 / secs
        }
    }

    fn health_uptime_secs(&self) -> f64 {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        (now - self.created as f64).max(1.0)
    }

    /// True once --die-after inference requests have been taken: the worker should die after finishing them.
    pub fn reached_die_after(&self) -> bool {
        match self.faults.get().die_after {
            Some(n) => self.stats.inference.get() >= n,
            None => false,
        }
    }
}

/// Keeps a connection listed in [`Worker::conns`] while it lives.
pub struct ConnGuard {
    worker: Rc<Worker>,
    id: u64,
}

// === impl ConnGuard ===

impl ConnGuard {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.worker.conns.borrow_mut().remove(&self.id);
    }
}
