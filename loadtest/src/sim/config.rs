//! smg-sim command line: which workers to serve (ports, models, runtimes) and their timing and fault knobs.

use clap::{Parser, ValueEnum};

use crate::sim::pd::{PdProtocol, PdRole, PdSpec};
use crate::sim::profile::{Profile, DEFAULTS};
use crate::sim::zmq_events::{self, ZmqFormat, ZmqSpec};

/// Which engine's HTTP surface a simulated worker presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Runtime {
    Sglang,
    Vllm,
}

// === impl Runtime ===

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Sglang => "sglang",
            Runtime::Vllm => "vllm",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sglang" => Ok(Runtime::Sglang),
            "vllm" => Ok(Runtime::Vllm),
            other => Err(format!("unknown runtime {other:?} (sglang or vllm)")),
        }
    }
}

/// Simulated inference workers (SGLang / vLLM HTTP surface) for gateway tests and benchmarks.
#[derive(Parser, Debug, Clone)]
#[command(name = "smg-sim", version)]
pub struct SimArgs {
    /// Ports to serve, one worker each: "18001-18016,18020". Port 0 picks a free port (printed at start).
    #[arg(long)]
    pub ports: Option<String>,
    /// Model served by the --ports workers.
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Engine surface of the --ports workers.
    #[arg(long, value_enum, default_value = "sglang")]
    pub runtime: Runtime,
    /// Extra workers with their own model and runtime: "PORTS:MODEL[:RUNTIME]", repeatable.
    #[arg(long = "worker", value_name = "PORTS:MODEL[:RUNTIME]")]
    pub workers: Vec<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Runtime threads; workers are spread over them, each worker owned by one thread.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Cores to pin the threads to ("0", "0-3"); unpinned when absent.
    #[arg(long)]
    pub cores: Option<String>,

    /// Engine preset: timing, batch and KV capacity of a real engine on a real GPU (sources in
    /// src/sim/profile.rs and the README). Flags given explicitly win over the preset.
    #[arg(long, value_enum)]
    pub profile: Option<Profile>,
    /// Base time to first token, in ms [default: 0].
    #[arg(long)]
    pub ttft_ms: Option<f64>,
    /// Time between output tokens at batch 1, in ms [default: 0].
    #[arg(long)]
    pub itl_ms: Option<f64>,
    /// Prefill cost per prompt token not found in the prefix cache, in µs (added to TTFT) [default: 0].
    #[arg(long)]
    pub prefill_us_per_token: Option<f64>,
    /// ITL grows by this fraction when every batch slot is busy (linear in between): decode slows
    /// with batch size. Streams re-read the batch at every token [default: 0].
    #[arg(long)]
    pub itl_batch_factor: Option<f64>,
    /// Prefill grows by this fraction when every batch slot is busy (linear in between): prefill
    /// shares the GPU with the running decodes [default: 0].
    #[arg(long)]
    pub prefill_batch_factor: Option<f64>,
    /// Output tokens when the request gives no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub output_tokens: u32,
    /// Upper bound on output tokens whatever the request asks.
    #[arg(long, default_value_t = 32_768)]
    pub max_output_tokens: u32,
    /// Continuous-batching slots per worker; further requests wait in a FIFO queue [default: 256].
    #[arg(long)]
    pub max_running: Option<usize>,
    /// KV-cache capacity per worker in tokens: a request is admitted only when its prompt plus
    /// output tokens fit beside the running ones, else it waits (num_waiting_reqs); 0 is unlimited
    /// [default: 0].
    #[arg(long)]
    pub kv_cache_tokens: Option<u64>,
    /// Prefix cache size per worker in tokens (0 disables the cache).
    #[arg(long, default_value_t = 1 << 20)]
    pub cache_tokens: usize,
    /// Prefix cache block size in tokens (only whole blocks are cached, as in paged KV caches).
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// Write every stream event with its own write even when no ITL separates them, as an
    /// engine flushing each token does; without it back-to-back events leave in one write.
    #[arg(long)]
    pub write_each_event: bool,
    /// Prompt bytes per token when counting tokens (the simulator has no tokenizer).
    #[arg(long, default_value_t = 4)]
    pub bytes_per_token: usize,
    /// Every worker also serves HTTPS, as a cloud provider does: a CA made at start is written
    /// to DIR/ca.pem, and the certificate (signed by it) names api.openai.com,
    /// api.anthropic.com, generativelanguage.googleapis.com, api.x.ai, localhost and 127.0.0.1.
    /// Each `listening` line ends with tls=HOST:PORT. Not with --grpc.
    #[arg(long, value_name = "DIR", conflicts_with = "grpc")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// Every worker answers as the cloud provider its request's Host names (api.openai.com,
    /// api.anthropic.com, generativelanguage.googleapis.com, api.x.ai; others: OpenAI): FILE is
    /// {"KEY": {"provider": "openai|anthropic|gemini|xai", "models": [...]}}; a request needs a
    /// key of that provider in its style, else 401 in its error shape; /v1/models lists the
    /// key's models. Not with --grpc.
    #[arg(long, value_name = "FILE", conflicts_with = "grpc")]
    pub provider_keys: Option<std::path::PathBuf>,
    /// With --tls-dir: an HTTP CONNECT proxy on this port (a client's HTTPS_PROXY), whose every
    /// tunnel leads to the first worker's TLS port whatever host it asks for; GET /sim/connects
    /// on any worker lists the targets asked (and any Proxy-Authorization). 0 picks a free port,
    /// printed as `proxy HOST:PORT` before `ready`.
    #[arg(long, requires = "tls_dir")]
    pub connect_proxy_port: Option<u16>,
    /// With --tls-dir: worker i serves HTTPS on PORT+i; 0 picks a free port for each [default: 0].
    #[arg(long, requires = "tls_dir")]
    pub tls_port: Option<u16>,
    /// HTTP workers count and cache prompts in the simulated model's tokens, as an engine does:
    /// a chat rendered with its ChatML template (generation prompt included) and encoded with
    /// its byte-level BPE, a prompt string encoded, prompt ids taken as they are. The tokenizer
    /// files are written to --tokenizer-dir (a gateway's --tokenizer-path then computes the
    /// same ids), and KV-cache events carry these ids. Without it, --bytes-per-token counts.
    #[arg(long)]
    pub tokenize_http: bool,
    /// Length of the vectors /v1/embeddings returns.
    #[arg(long, default_value_t = 16)]
    pub embedding_dim: usize,

    /// Fraction of inference requests answered with --fail-status.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Status of injected failures.
    #[arg(long, default_value_t = 500)]
    pub fail_status: u16,
    /// Fraction of inference requests that never get an answer (the connection stays open until the client leaves).
    #[arg(long, default_value_t = 0.0)]
    pub hang_rate: f64,
    /// Fraction of inference responses cut off mid-body (streams stop without the final chunk).
    #[arg(long, default_value_t = 0.0)]
    pub truncate_rate: f64,
    /// Tokens sent before a truncated stream stops (default: half the output).
    #[arg(long)]
    pub truncate_after_tokens: Option<u32>,
    /// The worker dies (closes its port and connections) after serving this many inference requests.
    #[arg(long)]
    pub die_after: Option<u64>,
    /// Delay before each accept, in ms (a worker slow to take connections).
    #[arg(long, default_value_t = 0)]
    pub accept_delay_ms: u64,
    /// /health answers 503 for this long after start, in ms.
    #[arg(long, default_value_t = 0)]
    pub unhealthy_for_ms: u64,
    /// /health answers 503 until POST /sim/control sets {"healthy": true}.
    #[arg(long)]
    pub start_unhealthy: bool,
    /// /health alternates between 200 and 503 every this many ms, starting healthy (after any
    /// --unhealthy-for-ms grace); 0 is off. A /sim/control "healthy" override wins.
    #[arg(long, default_value_t = 0)]
    pub flap_health_ms: u64,
    /// Every response carries `Connection: close` and the worker closes the connection after it
    /// (a server that never keeps connections alive).
    #[arg(long)]
    pub close_after_response: bool,
    /// Data-parallel ranks the worker claims (`dp_size` in /server_info); requests may carry a
    /// top-level "data_parallel_rank" in 0..N, counted per rank in /sim/stats.
    #[arg(long, default_value_t = 1)]
    pub dp_size: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_body: usize,

    /// Serve SGLang's scheduler gRPC API (`sglang.grpc.scheduler.SglangScheduler`, HTTP/2) on
    /// every port instead of the HTTP API; /sim/stats and /sim/control stay reachable on the same
    /// port over HTTP/1.1. Injected failures become gRPC statuses (--fail-status mapped as gRPC
    /// maps HTTP: 400 INVALID_ARGUMENT, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, ...).
    #[arg(long)]
    pub grpc: bool,
    /// Directory the --grpc workers write their tokenizer to and name in GetModelInfo
    /// (default: a directory of this process under the system temp dir).
    #[arg(long)]
    pub tokenizer_dir: Option<std::path::PathBuf>,
    /// The tokenizer_path (and model_path) GetModelInfo reports instead of --tokenizer-dir: a
    /// path the gateway cannot read makes it download the files with GetTokenizer.
    #[arg(long)]
    pub advertise_tokenizer_path: Option<String>,
    /// With --grpc: serve Generate with a real model, through the llama.cpp server at this
    /// `http://host:port` (prompt token ids in, sampled token ids out); pair it with
    /// --advertise-tokenizer-path naming that model's tokenizer.
    #[arg(long, requires = "grpc")]
    pub llama_url: Option<String>,
    /// With --grpc: every answer opens with a think block in this reasoning family's markup
    /// (qwen3, deepseek_r1, kimi, glm45, minimax, step3, …), so the gateway's reasoning parser
    /// has work: sweeps and tests of `reasoning_content`.
    #[arg(long, requires = "grpc")]
    pub reasoning_markup: Option<String>,
    /// With --grpc: every answer ends with a call of `get_weather` (one `city` argument) in
    /// this tool-call family's markup (qwen, kimik2, glm45_moe, pythonic, …). Requests that
    /// offer a `get_weather` tool get it back as `tool_calls` from a gateway with that parser.
    #[arg(long, requires = "grpc")]
    pub tool_call_markup: Option<String>,
    /// With --grpc: an embedding model, as SGLang's `--is-embedding` serves one. GetModelInfo
    /// says `is_generation: false`, the Embed RPC answers a vector of --embedding-dim floats
    /// (reproducible from the input ids: `embed::vector`), and Generate is refused.
    #[arg(long, requires = "grpc")]
    pub is_embedding: bool,
    /// With --grpc: SubscribeKvEvents answers UNIMPLEMENTED, as an engine started without KV
    /// events does; the workers publish nothing.
    #[arg(long, requires = "grpc")]
    pub no_kv_events: bool,

    /// HTTP workers publish their prefix cache's changes as KV-cache events over ZMQ, in vLLM's
    /// wire format (vLLM's and SGLang's `--kv-events-config`): a PUB socket bound at
    /// `tcp://HOST:PORT`. With several workers (--ports, --worker), worker i (in the order
    /// listed, --ports first) binds PORT+i; port 0 picks a free port for each. The `listening`
    /// lines end with kv_events=ENDPOINT. Refused with --grpc (gRPC workers publish
    /// SubscribeKvEvents).
    #[arg(long, value_name = "tcp://HOST:PORT")]
    pub kv_events_endpoint: Option<String>,
    /// With --kv-events-endpoint: a ROUTER socket answering replay requests from a sequence
    /// number (the last 4096 batches are kept). Worker i binds PORT+i, as above; listed as
    /// kv_events_replay=ENDPOINT.
    #[arg(long, value_name = "tcp://HOST:PORT")]
    pub kv_events_replay_endpoint: Option<String>,
    /// With --kv-events-endpoint: the topic, the first frame of every message [default: empty].
    #[arg(long, value_name = "TOPIC")]
    pub kv_events_topic: Option<String>,
    /// With --kv-events-endpoint: events as vLLM's positional arrays, or as maps with their
    /// fields by name [default: array].
    #[arg(long, value_enum)]
    pub kv_events_format: Option<ZmqFormat>,

    /// Prefill/decode disaggregation: every worker of this process is a prefill or a decode
    /// server of a PD pair, in its runtime's shape: sglang workers read bootstrap_host,
    /// bootstrap_port and bootstrap_room; vllm workers read and answer vLLM's
    /// kv_transfer_params. With --grpc (sglang workers only) Generate's disaggregated_params
    /// carry the same three. See src/sim/pd/mod.rs and the README.
    #[arg(long, value_enum)]
    pub pd_role: Option<PdRole>,
    /// With --pd-role prefill: port of each worker's bootstrap listener, where decode workers
    /// fetch the KV. 0 picks a free port per worker; with several workers, worker k gets PORT+k.
    /// Printed in the `listening` lines as bootstrap=HOST:PORT [default: 0].
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// With --pd-role decode: how long a request waits for its KV before it fails with a 500
    /// (gRPC: INTERNAL) saying "KV transfer failed".
    #[arg(long, default_value_t = 10_000)]
    pub handoff_timeout_ms: u64,
}

/// The --grpc mode of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcSpec {
    /// Where the tokenizer files were written (GetTokenizer zips them from here).
    pub tokenizer_dir: std::path::PathBuf,
    /// What GetModelInfo reports as tokenizer_path and model_path.
    pub advertised_path: String,
    /// `--llama-url`: Generate goes to this llama.cpp server.
    pub llama: Option<std::net::SocketAddr>,
    /// `--reasoning-markup` / `--tool-call-markup`: the families answers are written in.
    pub markup: (Option<String>, Option<String>),
    /// `--is-embedding`.
    pub embedding: bool,
    /// SubscribeKvEvents is served (false: `--no-kv-events`, UNIMPLEMENTED).
    pub kv_events: bool,
}

/// Timing knobs of one worker; `Copy` so the control endpoint can swap them in a `Cell`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub ttft_us: u64,
    pub itl_us: u64,
    pub prefill_ns_per_token: u64,
    pub itl_batch_factor: f64,
    pub prefill_batch_factor: f64,
    pub output_tokens: u32,
    pub max_output_tokens: u32,
    pub write_each_event: bool,
}

/// Fault knobs of one worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultPlan {
    pub fail_rate: f64,
    pub fail_status: u16,
    pub hang_rate: f64,
    pub truncate_rate: f64,
    pub truncate_after_tokens: Option<u32>,
    pub die_after: Option<u64>,
    pub accept_delay_ms: u64,
    /// Answer with `Connection: close` and close after every response.
    pub close_after_response: bool,
    /// Requests (running plus waiting) /v1/loads, /get_load and /load report instead of the real
    /// figures; None reports the real ones. Run-time only (/sim/control "reported_load").
    pub reported_load: Option<u64>,
}

/// Everything one simulated worker needs to start.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    pub port: u16,
    pub model: String,
    pub runtime: Runtime,
    pub timing: Timing,
    pub faults: FaultPlan,
    pub max_running: usize,
    /// KV-cache capacity in tokens (0: unlimited).
    pub kv_cache_tokens: u64,
    /// The --profile preset, reported in /sim/stats.
    pub profile: Option<&'static str>,
    pub cache_tokens: usize,
    pub block_tokens: usize,
    pub bytes_per_token: usize,
    pub embedding_dim: usize,
    pub unhealthy_for_ms: u64,
    pub start_unhealthy: bool,
    pub flap_health_ms: u64,
    pub dp_size: usize,
    pub max_body: usize,
    /// Serve the gRPC scheduler API instead of HTTP.
    pub grpc: Option<GrpcSpec>,
    /// A prefill or decode server of a PD pair (--pd-role); None serves whole requests.
    pub pd: Option<PdSpec>,
    /// KV-cache events over ZMQ (--kv-events-endpoint); None publishes none.
    pub kv_events_zmq: Option<ZmqSpec>,
    /// --tokenize-http.
    pub tokenize_http: bool,
    /// --provider-keys, loaded.
    pub providers: Option<std::sync::Arc<crate::sim::provider::ProviderKeys>>,
    /// The CONNECT proxy's log (--connect-proxy-port), shared by every worker of the process.
    pub connects: crate::sim::tls::ConnectLog,
}

// === impl SimArgs ===

impl SimArgs {
    /// Expands --ports and --worker into one spec per port.
    pub fn worker_specs(&self) -> Result<Vec<WorkerSpec>, String> {
        let providers = match &self.provider_keys {
            Some(path) => Some(std::sync::Arc::new(crate::sim::provider::ProviderKeys::load(path)?)),
            None => None,
        };
        let connects = crate::sim::tls::ConnectLog::default();
        let mut groups: Vec<(Vec<u16>, String, Runtime)> = Vec::new();
        if let Some(p) = &self.ports {
            groups.push((crate::rt::parse_ports(p)?, self.model.clone(), self.runtime));
        }
        for w in &self.workers {
            let mut parts = w.splitn(3, ':');
            let ports = crate::rt::parse_ports(parts.next().unwrap_or(""))?;
            let model = parts.next().filter(|m| !m.is_empty()).map_or_else(|| self.model.clone(), str::to_string);
            let runtime = match parts.next() {
                Some(r) => Runtime::parse(r)?,
                None => self.runtime,
            };
            groups.push((ports, model, runtime));
        }
        if groups.is_empty() {
            groups.push((vec![18001], self.model.clone(), self.runtime));
        }
        let p = self.profile.map_or(DEFAULTS, Profile::preset);
        let max_running = self.max_running.unwrap_or(p.max_running);
        if max_running == 0 {
            return Err("--max-running must be at least 1".into());
        }
        if self.bytes_per_token == 0 || self.block_tokens == 0 {
            return Err("--bytes-per-token and --block-tokens must be at least 1".into());
        }
        if self.dp_size == 0 {
            return Err("--dp-size must be at least 1".into());
        }
        let timing = Timing {
            ttft_us: ms_to_us(self.ttft_ms.unwrap_or(p.ttft_ms)),
            itl_us: ms_to_us(self.itl_ms.unwrap_or(p.itl_ms)),
            prefill_ns_per_token: (self.prefill_us_per_token.unwrap_or(p.prefill_us_per_token).max(0.0) * 1000.0)
                as u64,
            itl_batch_factor: self.itl_batch_factor.unwrap_or(p.itl_batch_factor).max(0.0),
            prefill_batch_factor: self.prefill_batch_factor.unwrap_or(p.prefill_batch_factor).max(0.0),
            output_tokens: self.output_tokens.max(1),
            max_output_tokens: self.max_output_tokens.max(1),
            write_each_event: self.write_each_event,
        };
        let faults = FaultPlan {
            fail_rate: self.fail_rate,
            fail_status: self.fail_status,
            hang_rate: self.hang_rate,
            truncate_rate: self.truncate_rate,
            truncate_after_tokens: self.truncate_after_tokens,
            die_after: self.die_after,
            accept_delay_ms: self.accept_delay_ms,
            close_after_response: self.close_after_response,
            reported_load: None,
        };
        self.check_pd(&groups)?;
        self.check_kv_events()?;
        let mut specs = Vec::new();
        for (ports, model, runtime) in groups {
            for port in ports {
                let pd = self.pd_role.map(|role| PdSpec {
                    role,
                    protocol: match runtime {
                        Runtime::Sglang => PdProtocol::Sglang,
                        Runtime::Vllm => PdProtocol::Vllm,
                    },
                    bootstrap_port: match self.bootstrap_port.unwrap_or(0) {
                        0 => 0,
                        // Checked by check_pd: every PORT+k fits.
                        base => base + specs.len() as u16,
                    },
                    bootstrap_addr: None,
                    handoff_timeout: std::time::Duration::from_millis(self.handoff_timeout_ms),
                });
                specs.push(WorkerSpec {
                    port,
                    model: model.clone(),
                    runtime,
                    timing,
                    faults,
                    max_running,
                    kv_cache_tokens: self.kv_cache_tokens.unwrap_or(p.kv_cache_tokens),
                    profile: self.profile.map(Profile::name),
                    cache_tokens: self.cache_tokens,
                    block_tokens: self.block_tokens,
                    bytes_per_token: self.bytes_per_token,
                    embedding_dim: self.embedding_dim,
                    unhealthy_for_ms: self.unhealthy_for_ms,
                    start_unhealthy: self.start_unhealthy,
                    flap_health_ms: self.flap_health_ms,
                    dp_size: self.dp_size,
                    max_body: self.max_body,
                    grpc: None,
                    pd,
                    kv_events_zmq: self.zmq_spec(specs.len())?,
                    tokenize_http: self.tokenize_http && !self.grpc,
                    providers: providers.clone(),
                    connects: connects.clone(),
                });
            }
        }
        Ok(specs)
    }

    /// The KV events flags' rules: the others need --kv-events-endpoint, and --grpc workers
    /// publish over SubscribeKvEvents instead.
    fn check_kv_events(&self) -> Result<(), String> {
        let others = self.kv_events_replay_endpoint.is_some()
            || self.kv_events_topic.is_some()
            || self.kv_events_format.is_some();
        match (&self.kv_events_endpoint, self.grpc) {
            (Some(_), true) => Err("--kv-events-endpoint is for HTTP workers: --grpc workers publish their KV events \
                                    over SubscribeKvEvents"
                .into()),
            (None, _) if others => {
                Err("--kv-events-replay-endpoint, --kv-events-topic and --kv-events-format need --kv-events-endpoint"
                    .into())
            }
            _ => Ok(()),
        }
    }

    /// Worker `i`'s ZMQ publisher: the endpoints at PORT+i.
    fn zmq_spec(&self, i: usize) -> Result<Option<ZmqSpec>, String> {
        let Some(endpoint) = &self.kv_events_endpoint else { return Ok(None) };
        Ok(Some(ZmqSpec {
            endpoint: zmq_events::nth_endpoint(endpoint, i)?,
            replay: self.kv_events_replay_endpoint.as_deref().map(|r| zmq_events::nth_endpoint(r, i)).transpose()?,
            topic: self.kv_events_topic.clone().unwrap_or_default(),
            format: self.kv_events_format.unwrap_or(ZmqFormat::Array),
            sink: None,
        }))
    }

    /// The PD flags' rules: with --grpc, SGLang's scheduler API of the simulator's own model
    /// only (vLLM has no gRPC PD shape here, and a --llama-url model or an embedding model no
    /// PD role); a bootstrap port only for prefill, and room for one bootstrap port per worker
    /// above --bootstrap-port.
    fn check_pd(&self, groups: &[(Vec<u16>, String, Runtime)]) -> Result<(), String> {
        let Some(role) = self.pd_role else {
            return match self.bootstrap_port {
                Some(_) => Err("--bootstrap-port needs --pd-role prefill".into()),
                None => Ok(()),
            };
        };
        if self.grpc {
            if groups.iter().any(|g| g.2 == Runtime::Vllm) {
                return Err("--pd-role with --grpc plays SGLang's scheduler API (disaggregated_params): \
                            every worker's runtime must be sglang"
                    .into());
            }
            if self.llama_url.is_some() || self.is_embedding {
                return Err("--pd-role does not combine with --llama-url or --is-embedding".into());
            }
        }
        if self.bootstrap_port.is_some() && role != PdRole::Prefill {
            return Err("--bootstrap-port needs --pd-role prefill".into());
        }
        let workers: usize = groups.iter().map(|g| g.0.len()).sum();
        if let Some(base) = self.bootstrap_port.filter(|p| *p > 0) {
            if base as usize + workers - 1 > u16::MAX as usize {
                return Err(format!("--bootstrap-port {base}: no room for {workers} ports above it"));
            }
        }
        Ok(())
    }
}

pub fn ms_to_us(ms: f64) -> u64 {
    (ms.max(0.0) * 1000.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_expand_per_port() {
        let args = SimArgs::parse_from([
            "smg-sim",
            "--ports",
            "18001-18002",
            "--model",
            "a",
            "--worker",
            "18010:b:vllm",
            "--worker",
            "18011",
        ]);
        let specs = args.worker_specs().unwrap();
        let got: Vec<_> = specs.iter().map(|s| (s.port, s.model.as_str(), s.runtime)).collect();
        assert_eq!(
            got,
            vec![
                (18001, "a", Runtime::Sglang),
                (18002, "a", Runtime::Sglang),
                (18010, "b", Runtime::Vllm),
                (18011, "a", Runtime::Sglang),
            ]
        );
        assert!(SimArgs::parse_from(["smg-sim", "--worker", "1:m:tgi"]).worker_specs().is_err());
    }

    #[test]
    fn fault_flags_reach_the_spec() {
        let args =
            SimArgs::parse_from(["smg-sim", "--flap-health-ms", "250", "--close-after-response", "--dp-size", "4"]);
        let s = &args.worker_specs().unwrap()[0];
        assert_eq!((s.flap_health_ms, s.dp_size), (250, 4));
        assert!(s.faults.close_after_response);
        assert_eq!(s.faults.reported_load, None);
        let s = &SimArgs::parse_from(["smg-sim"]).worker_specs().unwrap()[0];
        assert_eq!((s.flap_health_ms, s.dp_size, s.faults.close_after_response), (0, 1, false));
        assert!(SimArgs::parse_from(["smg-sim", "--dp-size", "0"]).worker_specs().is_err());
    }

    #[test]
    fn pd_flags() {
        let specs =
            SimArgs::parse_from(["smg-sim", "--ports", "0,0", "--pd-role", "prefill", "--bootstrap-port", "9000"])
                .worker_specs()
                .unwrap();
        let got: Vec<_> = specs.iter().map(|s| s.pd.as_ref().map(|p| (p.role, p.bootstrap_port))).collect();
        assert_eq!(got, [Some((PdRole::Prefill, 9000)), Some((PdRole::Prefill, 9001))]);
        let s = &SimArgs::parse_from(["smg-sim", "--pd-role", "prefill"]).worker_specs().unwrap()[0];
        assert_eq!(s.pd.as_ref().map(|p| p.bootstrap_port), Some(0));
        let s = &SimArgs::parse_from(["smg-sim", "--pd-role", "decode", "--handoff-timeout-ms", "250"])
            .worker_specs()
            .unwrap()[0];
        let pd = s.pd.as_ref().unwrap();
        assert_eq!((pd.role, pd.handoff_timeout), (PdRole::Decode, std::time::Duration::from_millis(250)));
        assert_eq!(SimArgs::parse_from(["smg-sim"]).worker_specs().unwrap()[0].pd, None);
        // Each worker speaks its own runtime's PD protocol.
        let specs = SimArgs::parse_from(["smg-sim", "--ports", "1", "--worker", "2::vllm", "--pd-role", "prefill"])
            .worker_specs()
            .unwrap();
        let got: Vec<_> = specs.iter().map(|s| s.pd.as_ref().map(|p| p.protocol)).collect();
        assert_eq!(got, [Some(PdProtocol::Sglang), Some(PdProtocol::Vllm)]);
        // gRPC workers play SGLang's PD shape.
        let s = &SimArgs::parse_from(["smg-sim", "--pd-role", "decode", "--grpc"]).worker_specs().unwrap()[0];
        assert_eq!(s.pd.as_ref().map(|p| (p.role, p.protocol)), Some((PdRole::Decode, PdProtocol::Sglang)));
        for bad in [
            &["--pd-role", "prefill", "--grpc", "--runtime", "vllm"][..],
            &["--pd-role", "prefill", "--grpc", "--worker", "2::vllm"],
            &["--pd-role", "decode", "--grpc", "--llama-url", "http://127.0.0.1:1"],
            &["--pd-role", "prefill", "--grpc", "--is-embedding"],
            &["--pd-role", "decode", "--bootstrap-port", "9000"],
            &["--bootstrap-port", "9000"],
            &["--pd-role", "prefill", "--ports", "1,2", "--bootstrap-port", "65535"],
        ] {
            let args = SimArgs::parse_from(["smg-sim"].iter().chain(bad));
            assert!(args.worker_specs().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn kv_events_flags() {
        use crate::sim::zmq_events::ZmqFormat;
        let specs = SimArgs::parse_from([
            "smg-sim",
            "--ports",
            "1,2",
            "--worker",
            "3:m:vllm",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:5557",
            "--kv-events-replay-endpoint",
            "tcp://127.0.0.1:6000",
            "--kv-events-topic",
            "kv",
            "--kv-events-format",
            "map",
        ])
        .worker_specs()
        .unwrap();
        let got: Vec<_> = specs
            .iter()
            .map(|s| {
                let z = s.kv_events_zmq.as_ref().unwrap();
                (z.endpoint.as_str(), z.replay.as_deref(), z.topic.as_str(), z.format, z.sink.is_none())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("tcp://127.0.0.1:5557", Some("tcp://127.0.0.1:6000"), "kv", ZmqFormat::Map, true),
                ("tcp://127.0.0.1:5558", Some("tcp://127.0.0.1:6001"), "kv", ZmqFormat::Map, true),
                ("tcp://127.0.0.1:5559", Some("tcp://127.0.0.1:6002"), "kv", ZmqFormat::Map, true),
            ]
        );
        let s =
            &SimArgs::parse_from(["smg-sim", "--kv-events-endpoint", "tcp://127.0.0.1:0"]).worker_specs().unwrap()[0];
        let z = s.kv_events_zmq.as_ref().unwrap();
        assert_eq!((z.replay.as_deref(), z.topic.as_str(), z.format), (None, "", ZmqFormat::Array));
        assert!(SimArgs::parse_from(["smg-sim"]).worker_specs().unwrap()[0].kv_events_zmq.is_none());
        for bad in [
            &["--grpc", "--kv-events-endpoint", "tcp://127.0.0.1:5557"][..],
            &["--kv-events-topic", "kv"],
            &["--kv-events-format", "map"],
            &["--kv-events-replay-endpoint", "tcp://127.0.0.1:6000"],
            &["--kv-events-endpoint", "ipc:///tmp/kv"],
            &["--ports", "1,2", "--kv-events-endpoint", "tcp://127.0.0.1:65535"],
        ] {
            let args = SimArgs::parse_from(["smg-sim"].iter().chain(bad));
            assert!(args.worker_specs().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn profile_fills_what_flags_leave() {
        let s = &SimArgs::parse_from(["smg-sim", "--profile", "llama3.1-8b-h100", "--itl-ms", "9"])
            .worker_specs()
            .unwrap()[0];
        assert_eq!((s.timing.itl_us, s.timing.ttft_us, s.timing.prefill_ns_per_token), (9_000, 8_000, 32_000));
        assert_eq!((s.max_running, s.kv_cache_tokens, s.profile), (256, 400_000, Some("llama3.1-8b-h100")));
        let s = &SimArgs::parse_from(["smg-sim", "--max-running", "4"]).worker_specs().unwrap()[0];
        assert_eq!((s.max_running, s.kv_cache_tokens, s.timing.itl_us, s.profile), (4, 0, 0, None));
    }
}
