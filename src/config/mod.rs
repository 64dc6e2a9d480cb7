//! Command line (`smg launch …`, SMG's flag names and defaults) and the validated Config.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::time::Duration;

use crate::admission::auth::AuthConfig;
use crate::admission::pd::PdAdmission;
use crate::admission::priority::SchedulerConfig;
use crate::admission::AdmissionConfig;
use crate::budget::config::BudgetConfig;
use crate::contract::Aliases;
use crate::log::LogLevel;
use crate::retry::RetryPolicy;
use crate::routing::{AssignmentMode, PolicyKind, RoutingConfig};
use crate::workers::fleet::{FleetConfig, WorkerSpec};
use crate::workers::WorkerUrl;
use std::sync::Arc;

mod pd;
mod workers;
pub use pd::PdArgs;
pub use workers::WorkerArgs;

#[derive(Parser, Debug)]
#[command(name = "smg", version, about = "Shard-per-core, SMG-compatible LLM inference gateway")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start the gateway in front of inference workers.
    #[command(after_help = "Signals: SIGTERM or SIGINT drains (no new connections; in-flight requests and streams \
finish within --shutdown-grace-period-secs) and exits. SIGUSR2 upgrades without downtime: the binary now at this \
path starts with the same flags, takes over the listening sockets, and once a worker is routable there this \
process drains; no connection is refused or reset. Under systemd: Type=notify, WatchdogSec and socket activation \
(LISTEN_FDS) are supported; see tuning/.")]
    Launch(Box<LaunchArgs>),
    /// Start the gateway with two built-in simulated workers; prints a curl line to try.
    Demo(DemoArgs),
}

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Port the gateway listens on (127.0.0.1).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Model id the simulated workers serve.
    #[arg(long, default_value = "smg-demo-model")]
    pub model: String,
}

#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Worker base URLs (http://host:port, grpc://host:port, or a cloud provider's
    /// https://host), probed with GET /health and GET /v1/models.
    #[arg(long, num_args = 1.., value_name = "URL")]
    pub worker_urls: Vec<String>,
    /// What the workers are (SMG's flag). `openai` or `anthropic`: every --worker-urls entry
    /// is that cloud provider's API, its key taken from OPENAI_API_KEY or ANTHROPIC_API_KEY
    /// (never from --api-key: a gateway key is not sent to a provider). The others name
    /// self-hosted engines, found by discovery on HTTP workers.
    #[arg(long, default_value = "sglang", value_parser = ["sglang", "openai", "anthropic", "vllm", "tokenspeed"])]
    pub backend: String,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Routing policy: cache_aware, round_robin, random, power_of_two, consistent_hashing,
    /// prefix_hash, manual, least_load.
    #[arg(long, default_value = "cache_aware")]
    pub policy: String,
    /// cache_aware: a prefix match ratio above this routes to the prefix's worker.
    #[arg(long, default_value_t = 0.3)]
    pub cache_threshold: f32,
    /// cache_aware: spill when a worker's load exceeds the mean by this many requests (and by the relative factor).
    #[arg(long, default_value_t = 64)]
    pub balance_abs_threshold: usize,
    /// cache_aware: spill when a worker's load exceeds the mean by this factor (and by the absolute margin).
    #[arg(long, default_value_t = 1.5)]
    pub balance_rel_threshold: f32,
    /// cache_aware: seconds between tree eviction sweeps.
    #[arg(long, default_value_t = 120)]
    pub eviction_interval: u64,
    /// cache_aware with KV-cache events: milliseconds a request's blocks count as held by the
    /// worker it was sent to, until that worker's events report them (0: off). Set a little
    /// above the engines' event lag.
    #[arg(long, default_value_t = 0)]
    pub selection_accounting_ttl_ms: u64,
    /// cache_aware: budget of each shard's prefix tree, in characters.
    #[arg(long, default_value_t = 67_108_864)]
    pub max_tree_size: usize,
    /// prefix_hash: leading tokens hashed (4 characters each when untokenized).
    #[arg(long, default_value_t = 256)]
    pub prefix_token_count: usize,
    /// prefix_hash: skip a worker loaded above mean × this factor.
    #[arg(long, default_value_t = 1.25)]
    pub prefix_hash_load_factor: f32,
    /// prefix_hash: absolute load margin before a worker is skipped.
    #[arg(long, default_value_t = 10)]
    pub prefix_hash_balance_abs_threshold: usize,
    /// manual / routing-key override: pinned keys idle this long are forgotten (0 = never).
    #[arg(long, default_value_t = 14_400)]
    pub max_idle_secs: u64,
    /// How new routing keys are placed: random, min_load, min_group, delegate.
    #[arg(long)]
    pub assignment_mode: Option<String>,
    /// Pin requests by routing key (body `rid`, else --routing-key-headers) for every policy.
    #[arg(long, alias = "sticky-sessions")]
    pub routing_key_override: bool,
    /// Headers that carry the routing key, in priority order.
    #[arg(long, num_args = 1.., value_name = "HEADER", default_values_t = ["x-smg-routing-key".to_string()])]
    pub routing_key_headers: Vec<String>,
    /// Seconds between polls of each worker's /v1/loads (least_load, overload protection);
    /// also the Retry-After of an overload shed.
    #[arg(long, default_value_t = 10)]
    pub load_monitor_interval: u64,
    /// Accept ALIAS as a model name and route it as CANONICAL (repeatable).
    #[arg(long = "model-alias", value_name = "ALIAS=CANONICAL")]
    pub model_alias: Vec<String>,
    /// Largest request body accepted, in bytes; larger ones get 413 request_body_too_large.
    #[arg(long, default_value_t = 536_870_912)]
    pub max_payload_size: usize,
    /// Longest wait for a worker's response head, in seconds; then 504.
    #[arg(long, default_value_t = 1800)]
    pub request_timeout_secs: u64,
    /// Idle upstream keep-alive connections are closed after this many seconds.
    #[arg(long, default_value_t = 3)]
    pub upstream_pool_idle_timeout_secs: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this many seconds to finish.
    #[arg(long, default_value_t = 180)]
    pub shutdown_grace_period_secs: u64,
    /// Request headers to take the request id from, in order of preference.
    #[arg(long, num_args = 1.., value_name = "HEADER",
          default_values_t = ["x-request-id".to_string(), "x-correlation-id".to_string(), "x-trace-id".to_string(), "request-id".to_string()])]
    pub request_id_headers: Vec<String>,
    /// Log level: trace, debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log one JSON object per line instead of text.
    #[arg(long)]
    pub log_json: bool,
    /// Number of shards (one pinned reactor each); default: every core the process may use.
    #[arg(long)]
    pub cores: Option<usize>,
    #[command(flatten)]
    pub worker_args: WorkerArgs,
    #[command(flatten)]
    pub pd: PdArgs,
    /// An HTTP worker's KV-cache event publisher (ZMQ, vLLM's format), for cache_aware to
    /// route on: WORKER_URL=tcp://HOST:PORT[;replay=tcp://HOST:PORT][;topic=TOPIC]. Repeatable.
    #[arg(long, value_name = "WORKER_URL=ENDPOINT")]
    pub kv_events: Vec<String>,
    /// Keep-alive client connections idle this long are closed.
    #[arg(long, default_value_t = 75)]
    pub client_idle_timeout_secs: u64,
    /// A client must finish its request head within this many seconds of its first byte, and
    /// a body the gateway buffers within this many seconds of its head.
    #[arg(long, default_value_t = 30)]
    pub client_read_timeout_secs: u64,
    /// A streamed request body (see --max-buffered-request-bytes) whose next bytes take this
    /// many seconds gets 408 request_body_stalled; the clock runs only while the gateway
    /// waits on the client. 0 disables. Buffered bodies are held to
    /// --client-read-timeout-secs instead.
    #[arg(long, default_value_t = 300)]
    pub stream_body_stall_timeout_secs: u64,
    /// Most bytes held for a request buffered only to keep it retryable: with retries on, a
    /// body nothing needs to read streams to the worker when larger (one attempt); with
    /// retries off it always streams. 0 never buffers for retries.
    #[arg(long, default_value_t = 1_048_576)]
    pub max_buffered_request_bytes: u64,
    /// Largest gRPC message a worker's Generate call may send, in bytes (its declared
    /// length); a larger one fails the call (502 upstream_response_too_large) before it is
    /// buffered.
    #[arg(long, default_value_t = 67_108_864)]
    pub grpc_max_message_size: usize,
    /// A client that takes none of our bytes for this many seconds is disconnected, and its
    /// worker connection closed (the generation is cancelled).
    #[arg(long, default_value_t = 60)]
    pub client_write_timeout_secs: u64,
    /// A worker that sends no byte of its response body for this many seconds has its
    /// response ended (cut short, connection closed, logged). The head wait is
    /// --request-timeout-secs, which also bounds the whole exchange.
    #[arg(long, default_value_t = 120)]
    pub upstream_read_timeout_secs: u64,
    /// A WebSocket (Realtime) session in which neither side sent a byte for this many
    /// seconds is closed (1001 to the client; nginx's proxy_read_timeout default, 60).
    #[arg(long, default_value_t = 60)]
    pub websocket_idle_timeout_secs: u64,
    /// Most open client connections (all shards together); past it new clients wait in the
    /// kernel's backlog. Default: half of what the descriptor limit leaves after a reserve
    /// for worker connections and probes.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// One shared API key: serving routes then need `Authorization: Bearer KEY`, and admin
    /// routes accept it when no control-plane keys are set. Its callers share one identity.
    #[arg(long)]
    pub api_key: Option<String>,
    /// A tenant's own API key, TENANT:KEY (repeatable); each key is its own tenant. Tenant
    /// keys open serving routes only, never admin routes.
    #[arg(long = "tenant-api-key", value_name = "TENANT:KEY")]
    pub tenant_api_keys: Vec<String>,
    /// Control-plane keys, ID:NAME:ROLE:KEY with ROLE admin or user (repeatable; also
    /// CONTROL_PLANE_API_KEYS, comma-separated). When set, admin routes need an admin key.
    #[arg(
        long = "control-plane-api-keys",
        env = "CONTROL_PLANE_API_KEYS",
        value_delimiter = ',',
        value_name = "ID:NAME:ROLE:KEY"
    )]
    pub control_plane_api_keys: Vec<String>,
    /// Take the tenant from --tenant-header-name when no API key identified the caller.
    #[arg(long)]
    pub trust_tenant_header: bool,
    /// The header --trust-tenant-header reads.
    #[arg(long, default_value = "x-smg-tenant-id")]
    pub tenant_header_name: String,
    /// Most requests at the workers at once, gateway-wide (-1 = no limit). Past it requests
    /// wait in the admission queue, their bodies unread.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_concurrent_requests: i64,
    /// Refill of SMG's admission token bucket, tokens per second (default: the
    /// --max-concurrent-requests value). As in SMG 1.13, a request's token comes back when
    /// it ends, so the refill never admits beyond --max-concurrent-requests.
    #[arg(long)]
    pub rate_limit_tokens_per_second: Option<i64>,
    /// Requests that may wait for admission (0 = reject at once with 429).
    #[arg(long, default_value_t = 100)]
    pub queue_size: usize,
    /// Longest wait for admission before 503 admission_queue_timeout.
    #[arg(long, default_value_t = 60)]
    pub queue_timeout_secs: u64,
    /// Address of the Prometheus metrics listener (GET /metrics).
    #[arg(long, default_value = "0.0.0.0")]
    pub prometheus_host: String,
    /// Port of the Prometheus metrics listener; 0 turns metrics off.
    #[arg(long, default_value_t = 29000)]
    pub prometheus_port: u16,
    /// Bucket bounds of the duration histograms, in seconds (default: SMG's 29 bounds,
    /// 0.001 to 7200).
    #[arg(long, num_args = 0.., value_name = "SECONDS")]
    pub prometheus_duration_buckets: Vec<f64>,
    /// Export a span per request over OTLP/gRPC, continuing the caller's W3C traceparent and
    /// passing the worker a traceparent naming the gateway's span.
    #[arg(long)]
    pub enable_trace: bool,
    /// The OTLP/gRPC collector (host:port) --enable-trace exports to.
    #[arg(long, default_value = "localhost:4317")]
    pub otlp_traces_endpoint: String,
    /// Enable the priority-aware admission scheduler (classes from X-SMG-Priority, reserved
    /// slots, per-class queues, starvation promotion, preemption before the first byte). It
    /// replaces the --max-concurrent-requests limiter; capacity is the sum of the workers'
    /// max_running_requests (64 for a worker that reports none).
    #[arg(long)]
    pub priority_scheduler_enabled: bool,
    /// Max priority class for tenants not listed in the scheduler YAML (system |
    /// interactive | default | bulk).
    #[arg(long, default_value = "default")]
    pub priority_scheduler_default_max_class: String,
    /// Optional path to the priority-scheduler YAML config (SMG's schema). With
    /// --priority-scheduler-enabled, a file that cannot be read, parsed or validated is a
    /// start-up error; without a path the built-in class defaults apply.
    #[arg(long, value_name = "PATH")]
    pub priority_scheduler_config: Option<std::path::PathBuf>,
    /// Cap on per-tenant scheduler metric label cardinality (accepted for SMG
    /// compatibility; this gateway has no per-tenant scheduler metrics yet).
    #[arg(long, default_value_t = 32)]
    pub priority_scheduler_tenant_metric_top_n: u32,
    /// Write the log (and the access log) to daily files DIR/smg.YYYY-MM-DD instead of stderr.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<std::path::PathBuf>,
    /// Per-tenant token and request budgets (SMG's tenant rate limiting), on every
    /// inference endpoint.
    #[arg(long)]
    pub tenant_rate_limit_enabled: bool,
    /// The budgets' YAML (SMG's schema). A file that cannot be read or validated is logged
    /// at error level and the gateway starts without budgets, as SMG does.
    #[arg(long, value_name = "PATH")]
    pub tenant_rate_limit_config: Option<std::path::PathBuf>,
    /// Share tenant budgets with every replica through this Redis (redis://host:port), and
    /// with `--history-backend redis`, the stored responses and conversations.
    #[arg(long, value_name = "URL", env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Where the Responses API's stored responses and conversations live.
    #[arg(long, default_value = "memory", value_parser = ["memory", "none", "oracle", "postgres", "redis"])]
    pub history_backend: String,
    /// Most stored responses the memory backend keeps (the oldest go first).
    #[arg(long, default_value_t = 10_000)]
    pub history_memory_max_responses: usize,
    /// Most conversation items the memory backend keeps (the oldest go first).
    #[arg(long, default_value_t = 100_000)]
    pub history_memory_max_items: usize,
    /// How long the memory backend keeps a record, in seconds (0: until a count bound drops it).
    #[arg(long, default_value_t = 86_400)]
    pub history_memory_retention_secs: u64,
    /// Request headers copied into a stored response's context: HEADER=CONTEXT_KEY.
    #[arg(long, num_args = 0.., value_name = "HEADER=KEY")]
    pub storage_context_headers: Vec<String>,
    /// PostgreSQL for `--history-backend postgres` (postgres://user:pass@host:port/db).
    #[arg(long, value_name = "URL", env = "POSTGRES_DB_URL")]
    pub postgres_db_url: Option<String>,
    /// Accepted for SMG compatibility: one multiplexed connection serves every call.
    #[arg(long, default_value_t = 16, env = "POSTGRES_POOL_MAX")]
    pub postgres_pool_max: u32,
    /// Bound on each call to the PostgreSQL store; past it, 503 storage_unavailable.
    #[arg(long, default_value_t = 5, env = "POSTGRES_OP_TIMEOUT_SECS")]
    pub postgres_op_timeout_secs: u64,
    /// Accepted for SMG compatibility: one multiplexed connection serves every call.
    #[arg(long, default_value_t = 16, env = "REDIS_POOL_MAX")]
    pub redis_pool_max: u32,
    /// Redis history retention in days (at least 1; -1 keeps records).
    #[arg(long, default_value_t = 30, env = "REDIS_RETENTION_DAYS", allow_negative_numbers = true)]
    pub redis_retention_days: i64,
    /// Bound on each call to the Redis store; past it, 503 storage_unavailable.
    #[arg(long, default_value_t = 5, env = "REDIS_OP_TIMEOUT_SECS")]
    pub redis_op_timeout_secs: u64,
    /// MCP servers a Responses request may name by label (SMG's YAML).
    #[arg(long, value_name = "PATH")]
    pub mcp_config_path: Option<std::path::PathBuf>,
}

/// The Responses API's storage (`--history-backend`, `--storage-context-headers`).
#[derive(Debug, Clone)]
pub struct HistoryConfig {
    pub backend: crate::responses::store::Backend,
    /// Each storage call's bound.
    pub within: Duration,
    /// (lowercased request header, context key).
    pub context_headers: Vec<(String, String)>,
}

/// What the configuration needs to know about the machine it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Host {
    /// Cores this process may run on.
    pub cores: usize,
    /// The descriptor limit (RLIMIT_NOFILE) in force.
    pub descriptors: u64,
}

/// Descriptors kept for worker connections, health probes and the process itself.
const DESCRIPTOR_RESERVE: u64 = 128;

impl Host {
    /// Every client connection may need a worker connection too, so clients get half of
    /// what the reserve leaves.
    fn default_max_connections(&self) -> usize {
        (self.descriptors.saturating_sub(DESCRIPTOR_RESERVE) / 2).max(16) as usize
    }
}

/// The validated configuration every shard reads (shared read-only behind an Arc).
#[derive(Debug, Clone)]
pub struct Config {
    /// `--worker-urls` (regular workers), then `--prefill` and `--decode` workers.
    pub workers: Vec<WorkerSpec>,
    pub listen: SocketAddr,
    /// Regular and decode workers' routing; prefill workers have their own.
    pub routing: RoutingConfig,
    pub prefill_routing: RoutingConfig,
    pub aliases: Aliases,
    pub load_interval: Duration,
    pub max_payload_size: usize,
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub shutdown_grace: Duration,
    /// Lowercased header names.
    pub request_id_headers: Vec<String>,
    pub log_level: LogLevel,
    pub log_json: bool,
    pub cores: usize,
    /// How the control thread looks after workers.
    pub fleet: FleetConfig,
    /// None: one attempt per request (`--disable-retries`).
    pub retry: Option<RetryPolicy>,
    /// `--worker-overload-shed`.
    pub overload_shed: bool,
    pub client_idle_timeout: Duration,
    pub client_read_timeout: Duration,
    /// Streamed bodies' stall limit; None: none.
    pub stream_body_stall: Option<Duration>,
    pub max_buffered_request_bytes: u64,
    /// `--grpc-max-message-size`.
    pub grpc_max_message: usize,
    pub client_write_timeout: Duration,
    pub upstream_read_timeout: Duration,
    pub websocket_idle_timeout: Duration,
    pub max_connections: usize,
    pub auth: AuthConfig,
    /// None: no admission limit.
    pub admission: Option<AdmissionConfig>,
    /// `--priority-scheduler-enabled`: replaces `admission`.
    pub priority: Option<SchedulerConfig>,
    /// Admission per role of a prefill/decode pair.
    pub pd_admission: PdAdmission,
    /// None: metrics off (`--prometheus-port 0`).
    pub metrics: Option<MetricsConfig>,
    pub log_dir: Option<std::path::PathBuf>,
    /// Tenant budgets, when enabled and their file loaded.
    pub budgets: Option<Arc<BudgetConfig>>,
    pub redis_url: Option<String>,
    pub history: HistoryConfig,
    /// `--mcp-config-path`: MCP servers a Responses request may name by label.
    pub mcp: Option<Arc<crate::responses::mcp::McpConfig>>,
    /// Problems found while configuring that do not stop the start (logged once the log runs).
    pub startup_errors: Vec<String>,
    /// The OTLP collector, with --enable-trace.
    pub trace_endpoint: Option<String>,
}

#[derive(Debug, Clone)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// Ascending bucket bounds, seconds.
    pub buckets: Vec<f64>,
}

fn positive(flag: &str, v: u64) -> Result<Duration, String> {
    crate::duration::secs(flag, v, 1)
}

/// Validated, lowercased header names.
fn header_names(flag: &str, names: &[String]) -> Result<Vec<String>, String> {
    names
        .iter()
        .map(|h| {
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(format!("{flag}: '{h}' is not a header name"));
            }
            Ok(h.to_ascii_lowercase())
        })
        .collect()
}

fn unit_range(flag: &str, v: f32) -> Result<f32, String> {
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{flag}: must be between 0 and 1"));
    }
    Ok(v)
}

fn at_least_one(flag: &str, v: f32) -> Result<f32, String> {
    if !(v >= 1.0 && v.is_finite()) {
        return Err(format!("{flag}: must be at least 1"));
    }
    Ok(v)
}

impl LaunchArgs {
    fn routing_config(&self) -> Result<RoutingConfig, String> {
        let policy: PolicyKind = self.policy.parse().map_err(|e| format!("--policy: {e}"))?;
        let assignment_mode = match &self.assignment_mode {
            Some(m) => m.parse().map_err(|e| format!("--assignment-mode: {e}"))?,
            None => AssignmentMode::default_for(policy),
        };
        let headers = header_names("--routing-key-headers", &self.routing_key_headers)?;
        if self.max_tree_size == 0 {
            return Err("--max-tree-size: must be at least 1".into());
        }
        if self.prefix_token_count == 0 {
            return Err("--prefix-token-count: must be at least 1".into());
        }
        Ok(RoutingConfig {
            policy,
            cache_threshold: unit_range("--cache-threshold", self.cache_threshold)?,
            balance_abs_threshold: self.balance_abs_threshold,
            balance_rel_threshold: at_least_one("--balance-rel-threshold", self.balance_rel_threshold)?,
            eviction_interval_secs: positive("--eviction-interval", self.eviction_interval)?.as_secs(),
            max_tree_size: self.max_tree_size,
            prefix_token_count: self.prefix_token_count,
            prefix_hash_load_factor: at_least_one("--prefix-hash-load-factor", self.prefix_hash_load_factor)?,
            prefix_hash_balance_abs_threshold: self.prefix_hash_balance_abs_threshold,
            max_idle_secs: crate::duration::secs("--max-idle-secs", self.max_idle_secs, 0)?.as_secs(),
            assignment_mode,
            routing_key_override: self.routing_key_override,
            routing_key_headers: headers,
            selection_accounting_ttl: std::time::Duration::from_millis(self.selection_accounting_ttl_ms),
        })
    }

    fn metrics_config(&self) -> Result<Option<MetricsConfig>, String> {
        if self.prometheus_port == 0 {
            return Ok(None);
        }
        let ip: std::net::IpAddr = match self.prometheus_host.as_str() {
            "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
            h => h.parse().map_err(|_| format!("--prometheus-host: '{h}' is not an IP address"))?,
        };
        let mut buckets = if self.prometheus_duration_buckets.is_empty() {
            crate::metrics::DEFAULT_BUCKETS.to_vec()
        } else {
            self.prometheus_duration_buckets.clone()
        };
        if buckets.iter().any(|b| !b.is_finite() || *b <= 0.0) {
            return Err("--prometheus-duration-buckets: bounds must be positive numbers".into());
        }
        buckets.sort_by(f64::total_cmp);
        buckets.dedup();
        Ok(Some(MetricsConfig { listen: SocketAddr::new(ip, self.prometheus_port), buckets }))
    }

    fn history_config(&self) -> Result<HistoryConfig, String> {
        use crate::responses::store::{Backend, MemoryLimits};
        let (backend, within) = match self.history_backend.as_str() {
            "memory" => (
                Backend::Memory(MemoryLimits {
                    max_responses: self.history_memory_max_responses.max(1),
                    max_items: self.history_memory_max_items.max(1),
                    retention_secs: self.history_memory_retention_secs,
                }),
                Duration::from_secs(5),
            ),
            "none" => (Backend::None, Duration::from_secs(5)),
            "redis" => {
                let url = self.redis_url.clone().ok_or("--history-backend redis needs --redis-url")?;
                if self.redis_retention_days == 0 || self.redis_retention_days < -1 {
                    return Err("--redis-retention-days: at least 1, or -1 to keep records".into());
                }
                let within = positive("--redis-op-timeout-secs", self.redis_op_timeout_secs)?;
                (Backend::Redis { url, retention_days: self.redis_retention_days }, within)
            }
            "postgres" => {
                let url = self.postgres_db_url.clone().ok_or("--history-backend postgres needs --postgres-db-url")?;
                let within = positive("--postgres-op-timeout-secs", self.postgres_op_timeout_secs)?;
                (Backend::Postgres { url }, within)
            }
            other => return Err(format!("--history-backend {other}: not supported by this gateway")),
        };
        let context_headers = self
            .storage_context_headers
            .iter()
            .map(|e| match e.split_once('=') {
                Some((h, k)) if !h.is_empty() && !k.is_empty() => {
                    Ok((h.trim().to_ascii_lowercase(), k.trim().to_string()))
                }
                _ => Err(format!("--storage-context-headers: '{e}' is not HEADER=CONTEXT_KEY")),
            })
            .collect::<Result<_, String>>()?;
        Ok(HistoryConfig { backend, within, context_headers })
    }

    fn admission_config(&self) -> Result<Option<AdmissionConfig>, String> {
        if self.max_concurrent_requests <= 0 {
            return Ok(None);
        }
        let permits = self.max_concurrent_requests as usize;
        // Validated as SMG does; it admits nothing beyond the permits (admission/permits.rs).
        if self.rate_limit_tokens_per_second.is_some_and(|r| r < 0) {
            return Err("--rate-limit-tokens-per-second: must be 0 or more".into());
        }
        Ok(Some(AdmissionConfig {
            permits,
            queue_size: self.queue_size,
            queue_timeout: positive("--queue-timeout-secs", self.queue_timeout_secs)?,
        }))
    }

    pub fn into_config(self, host: Host) -> Result<Config, String> {
        let mut workers = Vec::with_capacity(self.worker_urls.len());
        let provider = crate::workers::provider::Provider::parse(&self.backend);
        for u in &self.worker_urls {
            WorkerUrl::parse(u).map_err(|e| format!("--worker-urls: {e}"))?;
            let mut spec = WorkerSpec::from_url(u);
            if let Some(p) = provider {
                spec.provider = Some(p);
                spec.api_key = crate::workers::provider::key_from_env(p).map(crate::secret::Secret::new);
            }
            workers.push(spec);
        }
        workers.extend(self.pd.workers()?);
        for v in &self.kv_events {
            let (url, src) = crate::workers::kv_events_source::KvEventsSource::parse_flag(v)?;
            let w = workers.iter_mut().find(|w| w.url.trim_end_matches('/') == url);
            let w =
                w.ok_or_else(|| format!("--kv-events: {url} is not a worker (--worker-urls, --prefill, --decode)"))?;
            w.kv_events = Some(src);
        }
        let assignment_mode = match &self.assignment_mode {
            Some(m) => Some(m.parse().map_err(|e| format!("--assignment-mode: {e}"))?),
            None => None,
        };
        let (routing, prefill_routing) = self.pd.role_routing(self.routing_config()?, assignment_mode)?;
        let ip: std::net::IpAddr = match self.host.as_str() {
            "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
            h => h.parse().map_err(|_| format!("--host: '{h}' is not an IP address"))?,
        };
        if self.max_payload_size == 0 {
            return Err("--max-payload-size: must be at least 1".into());
        }
        let cores = match self.cores {
            Some(0) => return Err("--cores: must be at least 1".into()),
            Some(n) if n > 1024 => return Err("--cores: at most 1024".into()),
            Some(n) => n,
            None => host.cores,
        };
        let max_connections = match self.max_connections {
            Some(0) => return Err("--max-connections: must be at least 1".into()),
            Some(n) => n,
            None => host.default_max_connections(),
        };
        header_names("--request-id-headers", &self.request_id_headers)?;
        let mut startup_errors = Vec::new();
        let budgets = match (self.tenant_rate_limit_enabled, &self.tenant_rate_limit_config) {
            (false, _) => None,
            (true, None) => {
                startup_errors.push("--tenant-rate-limit-enabled without --tenant-rate-limit-config; starting without tenant rate limits".into());
                None
            }
            (true, Some(path)) => match BudgetConfig::load(path) {
                Ok(c) => Some(c),
                Err(e) => {
                    startup_errors.push(format!("--tenant-rate-limit-config {e}; starting without tenant rate limits"));
                    None
                }
            },
        };
        if let Some(u) = &self.redis_url {
            if !u.starts_with("redis://") {
                return Err(format!("--redis-url: '{u}' is not a redis:// URL"));
            }
        }
        Ok(Config {
            workers,
            listen: SocketAddr::new(ip, self.port),
            routing,
            prefill_routing,
            aliases: Aliases::parse(&self.model_alias)?,
            load_interval: positive("--load-monitor-interval", self.load_monitor_interval)?,
            max_payload_size: self.max_payload_size,
            request_timeout: positive("--request-timeout-secs", self.request_timeout_secs)?,
            pool_idle_timeout: positive("--upstream-pool-idle-timeout-secs", self.upstream_pool_idle_timeout_secs)?,
            shutdown_grace: crate::duration::secs("--shutdown-grace-period-secs", self.shutdown_grace_period_secs, 0)?,
            request_id_headers: header_names("--request-id-headers", &self.request_id_headers)?,
            log_level: self.log_level.parse()?,
            log_json: self.log_json,
            cores,
            fleet: {
                let mut fleet =
                    self.worker_args.fleet(positive("--load-monitor-interval", self.load_monitor_interval)?, cores)?;
                let metrics = self.metrics_config()?.map(|m| m.listen);
                fleet.own_listeners = std::iter::once(SocketAddr::new(ip, self.port)).chain(metrics).collect();
                fleet
            },
            retry: self.worker_args.retry()?,
            overload_shed: self.worker_args.worker_overload_shed,
            client_idle_timeout: positive("--client-idle-timeout-secs", self.client_idle_timeout_secs)?,
            client_read_timeout: positive("--client-read-timeout-secs", self.client_read_timeout_secs)?,
            stream_body_stall: (self.stream_body_stall_timeout_secs > 0)
                .then(|| positive("--stream-body-stall-timeout-secs", self.stream_body_stall_timeout_secs))
                .transpose()?,
            max_buffered_request_bytes: self.max_buffered_request_bytes,
            grpc_max_message: match self.grpc_max_message_size {
                0 => return Err("--grpc-max-message-size: must be at least 1".into()),
                n => n,
            },
            client_write_timeout: positive("--client-write-timeout-secs", self.client_write_timeout_secs)?,
            upstream_read_timeout: positive("--upstream-read-timeout-secs", self.upstream_read_timeout_secs)?,
            websocket_idle_timeout: positive("--websocket-idle-timeout-secs", self.websocket_idle_timeout_secs)?,
            max_connections,
            auth: AuthConfig::parse(
                self.api_key.as_deref(),
                &self.tenant_api_keys,
                &self.control_plane_api_keys,
                self.trust_tenant_header.then(|| self.tenant_header_name.to_ascii_lowercase()),
            )?,
            admission: if self.priority_scheduler_enabled { None } else { self.admission_config()? },
            priority: match self.priority_scheduler_enabled {
                true => Some(SchedulerConfig::new(
                    &self.priority_scheduler_default_max_class,
                    self.priority_scheduler_config.as_deref(),
                    self.max_concurrent_requests,
                )?),
                false => None,
            },
            pd_admission: self.pd.admission()?,
            metrics: self.metrics_config()?,
            log_dir: self.log_dir.clone(),
            budgets: budgets.map(Arc::new),
            redis_url: self.redis_url.clone(),
            history: self.history_config()?,
            mcp: match &self.mcp_config_path {
                Some(p) => Some(Arc::new(crate::responses::mcp::McpConfig::load(p)?)),
                None => None,
            },
            startup_errors,
            trace_endpoint: self.enable_trace.then(|| {
                let e = self.otlp_traces_endpoint.trim();
                e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/').to_string()
            }),
        })
    }
}
