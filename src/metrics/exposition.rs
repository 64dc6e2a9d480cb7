//! The Prometheus text format (version 0.0.4) of merged shard counts and the gauges read at
//! scrape time.

use std::fmt::Write;

use super::shard::{Counts, Hist, RouterStats};
use crate::workers::fleet::FleetStats;
use crate::workers::Snapshot;

/// The gauges a scrape reads besides the counts.
pub struct Gauges<'a> {
    pub snapshot: &'a Snapshot,
    /// In-flight requests, all shards.
    pub inflight: usize,
    /// In-flight requests per worker id, all shards.
    pub worker_loads: &'a [usize],
    /// Each shard's routing state.
    pub routers: &'a [crate::routing::RouterStats],
    /// Admission, all shards: (queued, permits free); None when the limit is off.
    pub admission: Option<(usize, usize)>,
    /// Trace spans dropped, all shards.
    pub spans_dropped: u64,
    /// The priority scheduler per class, all shards (None: off).
    pub scheduler: Option<[(usize, usize, u64); 4]>,
    /// Tenant budgets, all shards (None: off).
    pub budget: Option<crate::budget::shard::BudgetCounts>,
    /// The control thread's figures (breakers, health checks); None if it did not answer.
    pub fleet: Option<&'a FleetStats>,
    /// (shard, ticks run) of each shard that answered, by shard.
    pub shard_ticks: &'a [(usize, u64)],
    /// The KV-cache events index every shard has applied: (worker, blocks, events flow).
    pub kv: &'a [(crate::worker_id::WorkerId, usize, bool)],
}

/// Circuit breakers, health checks and overload, from the control thread.
fn fleet_families(out: &mut String, f: &FleetStats) {
    family(out, "smg_worker_cb_state", "gauge", "Circuit breaker state per worker (0=closed, 1=open, 2=half_open)");
    for w in &f.workers {
        let _ = writeln!(out, "smg_worker_cb_state{} {}", labels(&[("worker", &w.url)]), w.breaker.gauge());
    }
    family(out, "smg_worker_cb_transitions_total", "counter", "Circuit breaker state transitions per worker");
    for (url, from, to, n) in &f.transitions {
        let l = labels(&[("worker", url), ("from", from.as_str()), ("to", to.as_str())]);
        let _ = writeln!(out, "smg_worker_cb_transitions_total{l} {n}");
    }
    family(out, "smg_worker_cb_outcomes_total", "counter", "Request outcomes recorded by the circuit breaker");
    for w in &f.workers {
        for (outcome, n) in [("success", w.successes), ("failure", w.failures)] {
            let l = labels(&[("worker", &w.url), ("outcome", outcome)]);
            let _ = writeln!(out, "smg_worker_cb_outcomes_total{l} {n}");
        }
    }
    family(out, "smg_worker_cb_consecutive_failures", "gauge", "Consecutive failures counted by the breaker");
    for w in &f.workers {
        let _ = writeln!(out, "smg_worker_cb_consecutive_failures{} {}", labels(&[("worker", &w.url)]), w.consecutive);
    }
    family(out, "smg_worker_health_checks_total", "counter", "Health checks by worker_type and result");
    for (result, n) in [("success", f.health_checks[0]), ("failure", f.health_checks[1])] {
        let _ = writeln!(
            out,
            "smg_worker_health_checks_total{} {n}",
            labels(&[("worker_type", "regular"), ("result", result)])
        );
    }
    family(out, "smg_workers_overloaded", "gauge", "Workers currently flagged overloaded, by model");
    for (model, n) in &f.overloaded {
        let _ = writeln!(out, "smg_workers_overloaded{} {n}", labels(&[("model", model)]));
    }
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `{a="x",b="y"}` from label pairs.
fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}=\"{}\"", escape(v));
    }
    s.push('}');
    s
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, pairs: &[(&str, &str)], bounds: &[f64], h: &Hist) {
    let mut cumulative = 0u64;
    for (i, b) in bounds.iter().enumerate() {
        cumulative += h.buckets.get(i).copied().unwrap_or(0);
        let le = b.to_string();
        let mut p = pairs.to_vec();
        p.push(("le", &le));
        let _ = writeln!(out, "{name}_bucket{} {cumulative}", labels(&p));
    }
    let mut p = pairs.to_vec();
    p.push(("le", "+Inf"));
    let _ = writeln!(out, "{name}_bucket{} {}", labels(&p), h.count);
    let _ = writeln!(out, "{name}_sum{} {}", labels(pairs), h.sum_secs);
    let _ = writeln!(out, "{name}_count{} {}", labels(pairs), h.count);
}

/// `name{tree="text"}` and `name{tree="tokens"}`, summed over shards.
fn family_values(
    out: &mut String,
    name: &str,
    routers: &[crate::routing::RouterStats],
    pick: impl Fn(&crate::routing::RouterStats) -> (usize, usize),
) {
    let (text, tokens) = routers.iter().map(pick).fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    let _ = writeln!(out, "{name}{{tree=\"text\"}} {text}");
    let _ = writeln!(out, "{name}{{tree=\"tokens\"}} {tokens}");
}

const ROUTER: [(&str, &str); 2] = [("router_type", "http"), ("backend_type", "regular")];

/// The router labels of an endpoint's series: SMG's `connection_mode` (`websocket` for a
/// realtime session, `webrtc` for the realtime calls route, else `http`) and its `endpoint`.
fn series(ep: &str) -> [(&'static str, &str); 4] {
    let (mode, ep) = match ep {
        "realtime" => ("websocket", ep),
        "realtime_calls" => ("webrtc", "realtime"),
        _ => ("http", ep),
    };
    [ROUTER[0], ROUTER[1], ("connection_mode", mode), ("endpoint", ep)]
}

/// Renders everything.
pub fn render(c: &Counts, g: &Gauges<'_>, bounds: &[f64], policy: &str) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let mut http: Vec<_> = c.http.iter().collect();
    http.sort_by_key(|(k, _)| **k);
    family(&mut out, "smg_http_requests_total", "counter", "Total HTTP requests by method and path");
    for ((method, path), (n, _)) in &http {
        let _ = writeln!(out, "smg_http_requests_total{} {n}", labels(&[("method", method), ("path", path)]));
    }
    family(&mut out, "smg_http_responses_total", "counter", "Total HTTP responses by path, status_code and error_code");
    let mut responses: Vec<_> = c.responses.iter().collect();
    responses.sort_by_key(|(k, _)| **k);
    for ((path, status, code), n) in responses {
        let s = status.to_string();
        let l = labels(&[("path", path), ("status_code", &s), ("error_code", code)]);
        let _ = writeln!(out, "smg_http_responses_total{l} {n}");
    }
    family(&mut out, "smg_http_request_duration_seconds", "histogram", "HTTP request duration by method and path");
    for ((method, path), (_, h)) in &http {
        histogram(&mut out, "smg_http_request_duration_seconds", &[("method", method), ("path", path)], bounds, h);
    }
    family(&mut out, "smg_http_connections_active", "gauge", "Currently active HTTP connections");
    let _ = writeln!(out, "smg_http_connections_active {}", g.inflight);
    family(&mut out, "smg_http_rate_limit_total", "counter", "Rate limiting decisions by result (allowed/rejected)");
    for (i, result) in ["allowed", "rejected"].iter().enumerate() {
        let _ = writeln!(out, "smg_http_rate_limit_total{} {}", labels(&[("result", result)]), c.rate_limit[i]);
    }

    if let Some((queued, free)) = g.admission {
        family(&mut out, "smg_admission_queue_depth", "gauge", "Requests waiting for an admission permit");
        let _ = writeln!(out, "smg_admission_queue_depth {queued}");
        family(&mut out, "smg_admission_permits_free", "gauge", "Admission permits free (--max-concurrent-requests)");
        let _ = writeln!(out, "smg_admission_permits_free {free}");
    }

    let mut router: Vec<(&str, &str, &RouterStats)> =
        c.router.iter().flat_map(|(m, eps)| eps.iter().map(move |(e, s)| (&**m, *e, s))).collect();
    router.sort_by_key(|(m, e, _)| (*m, *e));
    family(
        &mut out,
        "smg_router_requests_total",
        "counter",
        "Total routed requests by router_type, backend_type, connection_mode, model, endpoint, streaming",
    );
    for (model, ep, s) in &router {
        for (i, streaming) in ["false", "true"].iter().enumerate() {
            if s.requests[i] > 0 {
                let [r, b, mode, e] = series(ep);
                let p = [r, b, mode, ("model", *model), e, ("streaming", *streaming)];
                let _ = writeln!(out, "smg_router_requests_total{} {}", labels(&p), s.requests[i]);
            }
        }
    }
    family(
        &mut out,
        "smg_router_request_duration_seconds",
        "histogram",
        "Router request duration by router_type, backend_type, connection_mode, model, endpoint",
    );
    for (model, ep, s) in &router {
        let [r, b, mode, e] = series(ep);
        let p = [r, b, mode, ("model", *model), e];
        histogram(&mut out, "smg_router_request_duration_seconds", &p, bounds, &s.duration);
    }
    family(
        &mut out,
        "smg_router_ttft_seconds",
        "histogram",
        "Time to first token by router_type, backend_type, model, endpoint",
    );
    for (model, ep, s) in &router {
        let p = [ROUTER[0], ROUTER[1], ("model", model), series(ep)[3]];
        histogram(&mut out, "smg_router_ttft_seconds", &p, bounds, &s.ttft);
    }
    family(
        &mut out,
        "smg_router_request_errors_total",
        "counter",
        "Router errors by router_type, backend_type, connection_mode, model, endpoint, error_type",
    );
    for (model, ep, s) in &router {
        let mut errs: Vec<_> = s.errors.iter().collect();
        errs.sort();
        for (t, n) in errs {
            let [r, b, mode, e] = series(ep);
            let p = [r, b, mode, ("model", *model), e, ("error_type", *t)];
            let _ = writeln!(out, "smg_router_request_errors_total{} {n}", labels(&p));
        }
    }
    family(
        &mut out,
        "smg_router_upstream_responses_total",
        "counter",
        "Upstream backend HTTP responses by router_type, status_code, error_code",
    );
    let mut up: Vec<_> = c.upstream.iter().collect();
    up.sort_by_key(|(k, _)| **k);
    for ((status, code), n) in up {
        let s = status.to_string();
        let l = labels(&[("router_type", "http"), ("status_code", &s), ("error_code", code)]);
        let _ = writeln!(out, "smg_router_upstream_responses_total{l} {n}");
    }

    family(&mut out, "smg_worker_health", "gauge", "Worker health status (1=healthy, 0=unhealthy)");
    for w in &g.snapshot.workers {
        let _ = writeln!(out, "smg_worker_health{} {}", labels(&[("worker", &w.url.url)]), u8::from(w.healthy));
    }
    family(
        &mut out,
        "smg_worker_pool_size",
        "gauge",
        "Current worker pool size by worker_type, connection_mode, model",
    );
    // Pools by role and protocol too: a prefill/decode fleet shows each role's size.
    let mut pools: Vec<((&str, &str, &str), usize)> = Vec::new();
    for w in &g.snapshot.workers {
        let mode = if w.url.grpc { "grpc" } else { "http" };
        let key = (w.meta.role.as_str(), mode, w.model.as_deref().unwrap_or("unknown"));
        match pools.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => pools.push((key, 1)),
        }
    }
    for ((role, mode, m), n) in pools {
        let l = labels(&[("worker_type", role), ("connection_mode", mode), ("model", m)]);
        let _ = writeln!(out, "smg_worker_pool_size{l} {n}");
    }
    family(&mut out, "smg_worker_requests_active", "gauge", "Currently running requests per worker");
    for w in &g.snapshot.workers {
        let n = g.worker_loads.get(w.id.index()).copied().unwrap_or(0);
        let _ = writeln!(out, "smg_worker_requests_active{} {n}", labels(&[("worker", &w.url.url)]));
    }
    if !g.kv.is_empty() {
        family(
            &mut out,
            "smg_kv_index_blocks",
            "gauge",
            "Blocks each worker's KV-cache events say it holds on the GPU",
        );
        for (id, blocks, _) in g.kv {
            if let Some(w) = g.snapshot.workers.iter().find(|w| w.id == *id) {
                let _ = writeln!(out, "smg_kv_index_blocks{} {blocks}", labels(&[("worker", &w.url.url)]));
            }
        }
        family(&mut out, "smg_kv_events_live", "gauge", "1 while a worker's KV-cache events flow (0: routing guesses)");
        for (id, _, live) in g.kv {
            if let Some(w) = g.snapshot.workers.iter().find(|w| w.id == *id) {
                let _ = writeln!(out, "smg_kv_events_live{} {}", labels(&[("worker", &w.url.url)]), u8::from(*live));
            }
        }
    }
    if !c.kv_precision.is_empty() {
        let series = [
            (
                "smg_kv_predicted_cached_tokens_total",
                "Prompt tokens routing expected each worker to hold, by its KV-cache events",
            ),
            (
                "smg_kv_confirmed_cached_tokens_total",
                "Of those, the tokens its engine reported cached (cached_tokens in usage)",
            ),
            (
                "smg_kv_engine_cached_tokens_total",
                "Cached prompt tokens the engine reported on requests routed by its events",
            ),
        ];
        for (i, (name, help)) in series.iter().enumerate() {
            family(&mut out, name, "counter", help);
            for (w, n) in c.kv_precision.iter() {
                let _ = writeln!(out, "{name}{} {}", labels(&[("worker", w)]), n[i]);
            }
        }
        family(
            &mut out,
            "smg_kv_prediction_precision",
            "gauge",
            "Confirmed over predicted cached tokens per worker (1: every predicted prefix was cached)",
        );
        for (w, n) in c.kv_precision.iter().filter(|(_, n)| n[0] > 0) {
            let _ =
                writeln!(out, "smg_kv_prediction_precision{} {}", labels(&[("worker", w)]), n[1] as f64 / n[0] as f64);
        }
    }
    family(
        &mut out,
        "smg_worker_selection_total",
        "counter",
        "Worker selection events by worker_type, connection_mode, model, policy",
    );
    let mut by_model: Vec<(&str, u64)> = Vec::new();
    for (model, _, s) in &router {
        match by_model.iter_mut().find(|(m, _)| m == model) {
            // Every routed request is one selection.
            Some((_, n)) => *n += s.requests[0] + s.requests[1],
            None => by_model.push((model, s.requests[0] + s.requests[1])),
        }
    }
    for (m, n) in by_model {
        let l = labels(&[("worker_type", "regular"), ("connection_mode", "http"), ("model", m), ("policy", policy)]);
        let _ = writeln!(out, "smg_worker_selection_total{l} {n}");
    }
    family(
        &mut out,
        "smg_worker_errors_total",
        "counter",
        "Worker-level errors by worker_type, connection_mode, error_type",
    );
    let mut we: Vec<_> = c.worker_errors.iter().collect();
    we.sort();
    for (t, n) in we {
        let l = labels(&[("worker_type", "regular"), ("connection_mode", "http"), ("error_type", t)]);
        let _ = writeln!(out, "smg_worker_errors_total{l} {n}");
    }
    family(&mut out, "smg_worker_retries_total", "counter", "Total retry attempts by worker_type and endpoint");
    let mut rt: Vec<_> = c.retries.iter().collect();
    rt.sort();
    for (ep, n) in rt {
        let _ =
            writeln!(out, "smg_worker_retries_total{} {n}", labels(&[("worker_type", "regular"), ("endpoint", ep)]));
    }
    family(
        &mut out,
        "smg_worker_retries_exhausted_total",
        "counter",
        "Requests that failed after every retry attempt, by worker_type and endpoint",
    );
    let mut rx: Vec<_> = c.retries_exhausted.iter().collect();
    rx.sort();
    for (ep, n) in rx {
        let l = labels(&[("worker_type", "regular"), ("endpoint", ep)]);
        let _ = writeln!(out, "smg_worker_retries_exhausted_total{l} {n}");
    }
    family(
        &mut out,
        "smg_router_request_body_path_total",
        "counter",
        "Requests on the routes whose bodies may stream, by the path the body took and the rule that chose it",
    );
    let mut bp: Vec<_> = c.body_path.iter().collect();
    bp.sort();
    for ((path, reason), n) in bp {
        let _ =
            writeln!(out, "smg_router_request_body_path_total{} {n}", labels(&[("path", path), ("reason", reason)]));
    }
    if let Some(f) = g.fleet {
        fleet_families(&mut out, f);
    }
    // The priority scheduler (SMG's family names), declared always, like the budgets'.
    const CLASSES: [&str; 4] = ["bulk", "default", "interactive", "system"];
    family(&mut out, "smg_scheduler_admit_total", "counter", "Priority scheduler decisions by class and result");
    let mut sc: Vec<_> = c.scheduler.iter().collect();
    sc.sort();
    for ((class, result), n) in &sc {
        let _ = writeln!(out, "smg_scheduler_admit_total{} {n}", labels(&[("class", class), ("result", result)]));
    }
    family(
        &mut out,
        "smg_scheduler_preemption_total",
        "counter",
        "Requests preempted before their first byte, by class",
    );
    for ((class, result), n) in &sc {
        if *result == "preempted" {
            let _ = writeln!(out, "smg_scheduler_preemption_total{} {n}", labels(&[("class", class)]));
        }
    }
    family(&mut out, "smg_scheduler_inflight", "gauge", "Requests holding a scheduler slot, by class");
    family(&mut out, "smg_scheduler_queue_depth", "gauge", "Requests waiting for a scheduler slot, by class");
    family(
        &mut out,
        "smg_scheduler_starvation_promotion_total",
        "counter",
        "Starving requests promoted past reservations, by class",
    );
    if let Some(per) = g.scheduler {
        for (i, class) in CLASSES.iter().enumerate() {
            let (queued, inflight, promoted) = per[i];
            let l = labels(&[("class", class)]);
            let _ = writeln!(out, "smg_scheduler_inflight{l} {inflight}");
            let _ = writeln!(out, "smg_scheduler_queue_depth{l} {queued}");
            let _ = writeln!(out, "smg_scheduler_starvation_promotion_total{l} {promoted}");
        }
    }
    // Tenant budgets: the families are always declared (a dashboard's queries stay valid),
    // their series exist when budgets are on.
    family(&mut out, "smg_tenant_rate_limit_total", "counter", "Tenant budget reservations by result");
    if let Some(b) = g.budget {
        for (result, n) in [("admitted", b.admitted), ("rejected", b.denied)] {
            let _ = writeln!(out, "smg_tenant_rate_limit_total{} {n}", labels(&[("result", result)]));
        }
    }
    family(&mut out, "smg_tenant_budget_messages_total", "counter", "Shard messages to the budget owner by kind");
    if let Some(b) = g.budget {
        for (kind, n) in [("lease", b.leases), ("report", b.reports)] {
            let _ = writeln!(out, "smg_tenant_budget_messages_total{} {n}", labels(&[("kind", kind)]));
        }
    }
    family(
        &mut out,
        "smg_cache_aware_tree_chars",
        "gauge",
        "Characters or token ids held by the cache-aware trees, all shards",
    );
    family_values(&mut out, "smg_cache_aware_tree_chars", g.routers, |r| (r.text_tree.chars, r.token_tree.chars));
    family(
        &mut out,
        "smg_cache_aware_tree_bytes",
        "gauge",
        "Estimated heap bytes of the cache-aware trees, all shards",
    );
    family_values(&mut out, "smg_cache_aware_tree_bytes", g.routers, |r| {
        (r.text_tree.heap_bytes, r.token_tree.heap_bytes)
    });
    family(
        &mut out,
        "smg_cache_aware_decisions_total",
        "counter",
        "cache_aware decisions by result (hit = sent to a worker holding the prefix)",
    );
    let (hits, misses) = g.routers.iter().fold((0, 0), |(h, m), r| (h + r.cache_hits, m + r.cache_misses));
    let _ = writeln!(out, "smg_cache_aware_decisions_total{{result=\"hit\"}} {hits}");
    let _ = writeln!(out, "smg_cache_aware_decisions_total{{result=\"miss\"}} {misses}");
    family(
        &mut out,
        "smg_access_log_dropped_total",
        "counter",
        "Access log lines dropped because the log writer fell behind",
    );
    let _ = writeln!(out, "smg_access_log_dropped_total {}", c.access_log_dropped);
    family(&mut out, "smg_log_lines_dropped_total", "counter", "Log lines dropped because the log writer fell behind");
    let _ = writeln!(out, "smg_log_lines_dropped_total {}", crate::log::dropped());
    family(
        &mut out,
        "smg_trace_spans_dropped_total",
        "counter",
        "Trace spans dropped because the exporter fell behind",
    );
    let _ = writeln!(out, "smg_trace_spans_dropped_total {}", g.spans_dropped);
    // A shard's ticks: a stalled core shows as a counter that stops, and a scrape that sees
    // every shard's count move has seen them all gossip since the previous one.
    family(&mut out, "smg_shard_ticks_total", "counter", "Housekeeping ticks (gossip, reports, refills) run per shard");
    for (shard, n) in g.shard_ticks {
        let _ = writeln!(out, "smg_shard_ticks_total{} {n}", labels(&[("shard", &shard.to_string())]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::shard::{Finished, Routed, ShardMetrics, DEFAULT_BUCKETS};
    use std::time::Duration;

    #[test]
    fn exposition_lines() {
        let m = ShardMetrics::new(&DEFAULT_BUCKETS);
        let routed = Routed {
            model: "m\"x",
            endpoint: "chat",
            streaming: true,
            first_byte: Some(Duration::from_millis(3)),
            retries: 1,
            retries_exhausted: false,
        };
        m.record(&Finished {
            method: "POST",
            path: "/v1/chat/completions",
            status: 200,
            error_code: "",
            to_head: Duration::from_millis(3),
            routed: Some(routed),
            admitted: Some(true),
            worker_error: None,
            class: None,
            body_path: None,
            kv_precision: Some(("http://w1", 64, 48)),
        });
        let snap = Snapshot::default();
        let g = Gauges {
            snapshot: &snap,
            inflight: 2,
            worker_loads: &[],
            kv: &[],
            routers: &[],
            admission: Some((0, 8)),
            spans_dropped: 0,
            budget: None,
            scheduler: None,
            fleet: None,
            shard_ticks: &[(0, 41), (1, 40)],
        };
        let text = render(&m.snapshot(), &g, &DEFAULT_BUCKETS, "cache_aware");
        for line in [
            "smg_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\"} 1",
            "smg_http_responses_total{path=\"/v1/chat/completions\",status_code=\"200\",error_code=\"\"} 1",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.001\"} 0",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.005\"} 1",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"+Inf\"} 1",
            "smg_http_connections_active 2",
            "smg_shard_ticks_total{shard=\"1\"} 40",
            "smg_http_rate_limit_total{result=\"allowed\"} 1",
            "smg_router_requests_total{router_type=\"http\",backend_type=\"regular\",connection_mode=\"http\",model=\"m\\\"x\",endpoint=\"chat\",streaming=\"true\"} 1",
            "smg_worker_retries_total{worker_type=\"regular\",endpoint=\"chat\"} 1",
            "smg_admission_permits_free 8",
            "smg_kv_predicted_cached_tokens_total{worker=\"http://w1\"} 64",
            "smg_kv_confirmed_cached_tokens_total{worker=\"http://w1\"} 48",
            "smg_kv_engine_cached_tokens_total{worker=\"http://w1\"} 48",
            "smg_kv_prediction_precision{worker=\"http://w1\"} 0.75",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
    }
}
