//! The flags that look after workers (SMG's names and defaults): health checks, circuit
//! breakers, retries, data parallelism, load monitoring and overload protection.

use clap::Args;
use std::time::Duration;

use crate::retry::RetryPolicy;
use crate::workers::breaker::BreakerConfig;
use crate::workers::fleet::{FleetConfig, OverloadThresholds};
use crate::workers::status::Thresholds;

#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Seconds between health checks of Ready workers (others are checked every second).
    #[arg(long, default_value_t = 60)]
    pub health_check_interval_secs: u64,
    /// Seconds a health check or discovery probe may take.
    #[arg(long, default_value_t = 5)]
    pub health_check_timeout_secs: u64,
    /// Consecutive failed checks that take a Ready worker to NotReady.
    #[arg(long, default_value_t = 3)]
    pub health_failure_threshold: u32,
    /// Consecutive passed checks that make a worker Ready.
    #[arg(long, default_value_t = 2)]
    pub health_success_threshold: u32,
    /// The path health checks GET.
    #[arg(long, default_value = "/health")]
    pub health_check_endpoint: String,
    /// No health checks: a worker is Ready once its model is known.
    #[arg(long)]
    pub disable_health_check: bool,
    /// Remove workers that reach Failed instead of checking them until they come back.
    #[arg(long)]
    pub remove_unhealthy_workers: bool,
    /// Seconds a removed (DELETE) worker stays Draining before it can be removed; it is
    /// removed once its in-flight requests have finished too.
    #[arg(long, default_value_t = 5)]
    pub drain_settle_secs: u64,

    /// Consecutive failures (408, 5xx, transport errors) that open a worker's breaker.
    #[arg(long, default_value_t = 10)]
    pub cb_failure_threshold: u32,
    /// Consecutive successes that close a half-open breaker.
    #[arg(long, default_value_t = 3)]
    pub cb_success_threshold: u32,
    /// Seconds an open breaker waits before letting requests through again (half-open).
    #[arg(long, default_value_t = 60)]
    pub cb_timeout_duration_secs: u64,
    /// Accepted for SMG compatibility; failures are counted consecutively, as SMG does.
    #[arg(long, default_value_t = 120)]
    pub cb_window_duration_secs: u64,
    #[arg(long)]
    pub disable_circuit_breaker: bool,

    /// Attempts per request in all, the first included.
    #[arg(long, default_value_t = 5)]
    pub retry_max_retries: u32,
    #[arg(long, default_value_t = 50)]
    pub retry_initial_backoff_ms: u64,
    #[arg(long, default_value_t = 30_000)]
    pub retry_max_backoff_ms: u64,
    #[arg(long, default_value_t = 1.5)]
    pub retry_backoff_multiplier: f64,
    /// Each backoff moves by up to this fraction of itself, either way.
    #[arg(long, default_value_t = 0.2)]
    pub retry_jitter_factor: f64,
    /// One attempt per request.
    #[arg(long)]
    pub disable_retries: bool,

    /// A worker reporting dp_size N becomes N routed workers url@0…url@N-1; requests carry
    /// their `data_parallel_rank`.
    #[arg(long)]
    pub dp_aware: bool,
    /// Never poll workers' /v1/loads (least_load then uses in-flight counts alone, and
    /// overload protection has nothing to go on).
    #[arg(long)]
    pub disable_load_monitoring: bool,
    /// A worker with this many waiting requests (summed over its ranks) is overloaded.
    #[arg(long, default_value_t = 8)]
    pub worker_overload_waiting_requests: u64,
    /// A worker whose mean KV token usage reaches this is overloaded.
    #[arg(long, default_value_t = 0.8)]
    pub worker_overload_token_usage: f64,
    /// Keeps overload protection on (the default).
    #[arg(long, conflicts_with = "disable_worker_overload_protection")]
    pub worker_overload_protection: bool,
    #[arg(long)]
    pub disable_worker_overload_protection: bool,
    /// When every eligible worker is overloaded, answer 503 worker_overload_protection_shed
    /// instead of sending the request to the least loaded of them.
    #[arg(long)]
    pub worker_overload_shed: bool,

    /// gRPC workers: the model directory (or tokenizer.json, or GGUF) whose tokenizer and
    /// chat template the gateway uses, instead of what each worker advertises.
    #[arg(long, alias = "model")]
    pub model_path: Option<std::path::PathBuf>,
    /// gRPC workers: the tokenizer, overriding --model-path's.
    #[arg(long)]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// gRPC workers: the parser that splits the model's reasoning into `reasoning_content`
    /// (qwen3, deepseek_r1, deepseek_v31, kimi, glm45, minimax, step3, …). Default: chosen by
    /// the model's name.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// gRPC workers: the parser that turns the model's tool-call markup into `tool_calls`
    /// (qwen, qwen_coder, deepseek, deepseek31, kimik2, glm45_moe, llama, pythonic, mistral,
    /// minimax_m2, step3, json). Default: chosen by the model's name.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
}

fn at_least_one(flag: &str, v: u32) -> Result<u32, String> {
    if v == 0 {
        return Err(format!("{flag}: must be at least 1"));
    }
    Ok(v)
}

fn secs(flag: &str, v: u64) -> Result<Duration, String> {
    crate::duration::secs(flag, v, 1)
}

// === impl WorkerArgs ===

impl WorkerArgs {
    pub fn fleet(&self, load_interval: Duration, shards: usize) -> Result<FleetConfig, String> {
        let breaker = if self.disable_circuit_breaker {
            None
        } else {
            Some(BreakerConfig {
                failure_threshold: at_least_one("--cb-failure-threshold", self.cb_failure_threshold)?,
                success_threshold: at_least_one("--cb-success-threshold", self.cb_success_threshold)?,
                timeout: secs("--cb-timeout-duration-secs", self.cb_timeout_duration_secs)?,
            })
        };
        if self.worker_overload_waiting_requests == 0 {
            return Err("--worker-overload-waiting-requests: must be at least 1".into());
        }
        let usage = self.worker_overload_token_usage;
        if !(usage > 0.0 && usage <= 1.0) {
            return Err("--worker-overload-token-usage: must be in (0, 1]".into());
        }
        use crate::grpc::output::check_name;
        if let Some(n) = &self.reasoning_parser {
            check_name("--reasoning-parser", n, smg_parsers::reasoning::NAMES)?;
        }
        if let Some(n) = &self.tool_call_parser {
            check_name("--tool-call-parser", n, smg_parsers::tools::NAMES)?;
        }
        if !self.health_check_endpoint.starts_with('/') {
            return Err("--health-check-endpoint: must start with /".into());
        }
        Ok(FleetConfig {
            health_interval: secs("--health-check-interval-secs", self.health_check_interval_secs)?,
            health_timeout: secs("--health-check-timeout-secs", self.health_check_timeout_secs)?,
            health_endpoint: self.health_check_endpoint.clone(),
            thresholds: Thresholds {
                failures: at_least_one("--health-failure-threshold", self.health_failure_threshold)?,
                successes: at_least_one("--health-success-threshold", self.health_success_threshold)?,
            },
            health_checks: !self.disable_health_check,
            remove_unhealthy: self.remove_unhealthy_workers,
            drain_settle: crate::duration::secs("--drain-settle-secs", self.drain_settle_secs, 0)?,
            breaker,
            load_interval: (!self.disable_load_monitoring).then_some(load_interval),
            overload: (!self.disable_worker_overload_protection)
                .then_some(OverloadThresholds { waiting: self.worker_overload_waiting_requests, token_usage: usage }),
            dp_aware: self.dp_aware,
            shards,
            own_listeners: Vec::new(),
            tokenizer: crate::grpc::model::ModelSource {
                path: self.tokenizer_path.clone().or_else(|| self.model_path.clone()),
                reasoning_parser: self.reasoning_parser.clone(),
                tool_parser: self.tool_call_parser.clone(),
            },
        })
    }

    /// None: one attempt per request.
    pub fn retry(&self) -> Result<Option<RetryPolicy>, String> {
        if self.disable_retries || self.retry_max_retries <= 1 {
            return Ok(None);
        }
        if self.retry_backoff_multiplier.is_nan() || self.retry_backoff_multiplier < 1.0 {
            return Err("--retry-backoff-multiplier: must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.retry_jitter_factor) {
            return Err("--retry-jitter-factor: must be between 0 and 1".into());
        }
        Ok(Some(RetryPolicy {
            max_attempts: self.retry_max_retries,
            initial: crate::duration::millis("--retry-initial-backoff-ms", self.retry_initial_backoff_ms)?,
            max: crate::duration::millis("--retry-max-backoff-ms", self.retry_max_backoff_ms)?
                .max(Duration::from_millis(self.retry_initial_backoff_ms)),
            multiplier: self.retry_backoff_multiplier,
            jitter: self.retry_jitter_factor,
        }))
    }
}
