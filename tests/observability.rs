//! Metrics and the access log through the binary: a real `prometheus` server scrapes the
//! gateway while requests run, and its query API must add up to what was sent; `promtool`
//! must accept the exposition; every request has exactly one access line; a stalled log
//! writer never stops a shard.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn gateway(legacy: bool, w: &FakeWorker, metrics_port: u16, extra: &[&str]) -> Gateway {
    let port = metrics_port.to_string();
    let url = w.url();
    let mut args =
        vec!["--worker-urls", &url, "--cores", "2", "--prometheus-host", "127.0.0.1", "--prometheus-port", &port];
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready();
    gw
}

fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(5)))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample with exactly these labels (in exposition order), if present.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse().ok()))
}

struct Prometheus {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Prometheus {
    fn start(target: u16) -> Prometheus {
        let bin = which("prometheus").expect("prometheus is not installed (.ci/run installs the Debian package)");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("smg-prom-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("prometheus.yml");
        std::fs::write(
            &conf,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: smg\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = Prometheus { child, port, dir };
        assert!(
            wait_until(patience(Duration::from_secs(30)), || try_get(port, "/-/ready").is_ok_and(|r| r.status == 200)),
            "prometheus never became ready"
        );
        p
    }

    /// The instant vector of `query`: (labels, value) pairs.
    fn query(&self, query: &str) -> Vec<(sonic_rs::Value, f64)> {
        let q: String = query
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let r = get(self.port, &format!("/api/v1/query?query={q}"));
        let v = r.json();
        assert_eq!(v["status"].as_str(), Some("success"), "{}", r.text());
        let Some(results) = v["data"]["result"].as_array() else { return Vec::new() };
        results
            .iter()
            .map(|s| (s["metric"].clone(), s["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN)))
            .collect()
    }

    fn scalar(&self, query: &str) -> Option<f64> {
        self.query(query).first().map(|(_, v)| *v)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(name)).find(|p| p.is_file())
}

#[test]
fn prometheus_scrapes_counts_that_add_up() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mport = free_port();
        let gw =
            // The worker's 500s are relayed as they are: no retry, no breaker in the way.
            gateway(
                legacy,
                &w,
                mport,
                &[
                    "--max-concurrent-requests",
                    "1000",
                    "--rate-limit-tokens-per-second",
                    "0",
                    "--disable-retries",
                    "--disable-circuit-breaker",
                ],
            );
        let prom = Prometheus::start(mport);
        // 120 answered by the worker, 30 for an unknown model, 20 for an unknown path, 10
        // worker errors relayed with their status.
        let mut s = gw.connect();
        let mut rest = Vec::new();
        for i in 0..120 {
            let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}]}}"#);
            s.write_all(post_bytes("/v1/chat/completions", &body, &[]).as_bytes()).unwrap();
            assert_eq!(read_response(&mut s, &mut rest, false).unwrap().status, 200);
        }
        for _ in 0..30 {
            let r = post(
                gw.port,
                "/v1/chat/completions",
                r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
                &[],
            );
            assert_eq!(r.status, 404);
        }
        for _ in 0..20 {
            assert_eq!(get(gw.port, "/no/such/path").status, 404);
        }
        for _ in 0..10 {
            let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x","fake":"error","status":500}"#, &[]);
            assert_eq!(r.status, 500);
        }
        // Health checks by the test harness also count; compare by route and code.
        let want = [
            (r#"smg_http_responses_total{path="/v1/chat/completions",status_code="200",error_code=""}"#, 120.0),
            (
                r#"smg_http_responses_total{path="/v1/chat/completions",status_code="404",error_code="model_not_found"}"#,
                30.0,
            ),
            (r#"smg_http_responses_total{path="other",status_code="404",error_code="not_found"}"#, 20.0),
            (r#"smg_http_responses_total{path="/v1/completions",status_code="500",error_code=""}"#, 10.0),
            (r#"smg_router_requests_total{endpoint="chat",model="m",streaming="false"}"#, 120.0),
            (r#"smg_router_upstream_responses_total{status_code="500"}"#, 10.0),
            (r#"smg_worker_errors_total{error_type="backend_error"}"#, 10.0),
            // Every routed request is one cache_aware decision (the default policy).
            ("smg_cache_aware_decisions_total", 130.0),
        ];
        let mut last = Vec::new();
        let settled = wait_until(patience(Duration::from_secs(30)), || {
            last = want.iter().map(|(q, v)| (q.to_string(), *v, prom.scalar(&format!("sum({q})")))).collect();
            last.iter().all(|(_, v, got)| *got == Some(*v))
        });
        assert!(settled, "prometheus disagrees with what was sent: {last:?}\nscrape:\n{}", scrape(mport));
        // Histograms count what the counters count.
        let durations = prom.scalar(r#"sum(smg_http_request_duration_seconds_count{path="/v1/chat/completions"})"#);
        assert_eq!(durations, Some(150.0));
        assert_eq!(prom.scalar(r#"sum(smg_worker_health{worker=~".+"})"#), Some(1.0));
        assert!(prom.scalar(r#"sum(smg_cache_aware_tree_chars{tree="text"})"#).unwrap_or(0.0) > 0.0);
        // The Grafana dashboard in tuning/ queries only series the gateway exports, and
        // every one of its queries is valid PromQL.
        let dash: sonic_rs::Value = sonic_rs::from_str(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tuning/grafana-dashboard.json")).unwrap(),
        )
        .unwrap();
        let exposition = scrape(mport);
        for panel in dash["panels"].as_array().unwrap().iter() {
            for t in panel["targets"].as_array().unwrap().iter() {
                let expr = t["expr"].as_str().unwrap();
                prom.query(expr);
                let name = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .find(|w| w.starts_with("smg_"))
                    .unwrap();
                let family = name.trim_end_matches("_bucket");
                assert!(
                    exposition.contains(&format!("# TYPE {family} ")),
                    "dashboard queries {name}, which is not exported"
                );
            }
        }
    });
}

#[test]
fn promtool_accepts_the_exposition() {
    let promtool = which("promtool").expect("promtool is not installed (.ci/run installs prometheus)");
    let w = FakeWorker::start("m");
    let mport = free_port();
    let gw = gateway(false, &w, mport, &["--max-concurrent-requests", "8"]);
    for _ in 0..5 {
        assert_eq!(post(gw.port, "/v1/chat/completions", CHAT, &[]).status, 200);
        assert_eq!(get(gw.port, "/nope").status, 404);
    }
    let text = scrape(mport);
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // promtool exits 0 when the exposition parses; lint remarks (none expected) are printed.
    assert!(out.status.success(), "promtool rejected the exposition: {said}\n{text}");
    assert!(!said.contains("error"), "{said}");
    assert_eq!(sample(&text, r#"smg_http_rate_limit_total{result="allowed"}"#), Some(5.0), "{text}");
}

/// Parses the gateway's JSON log lines that are access lines.
fn access_lines(gw: &Gateway) -> Vec<sonic_rs::Value> {
    gw.log_text()
        .lines()
        .filter_map(|l| sonic_rs::from_str::<sonic_rs::Value>(l).ok())
        .filter(|v| v["msg"].as_str() == Some("request"))
        .collect()
}

#[test]
fn every_request_has_one_access_line() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w, 0, &["--log-json", "--api-key", "k"]);
        let key = "Authorization: Bearer k";
        let ids: Vec<String> = (0..4).map(|i| format!("acc-{legacy}-{i}-{}", std::process::id())).collect();
        let h = |i: usize| format!("X-Request-ID: {}", ids[i]);
        assert_eq!(post(gw.port, "/v1/chat/completions", CHAT, &[key, &h(0)]).status, 200);
        assert_eq!(post(gw.port, "/v1/chat/completions", CHAT, &[&h(1)]).status, 401);
        let err = r#"{"model":"m","prompt":"x","fake":"error","status":503}"#;
        assert_eq!(post(gw.port, "/v1/completions", err, &[key, &h(2)]).status, 503);
        // A stream the client abandons after its first event.
        let sse = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":50,"gap_ms":20}"#;
        let mut s = gw.connect();
        s.write_all(post_bytes("/v1/chat/completions", sse, &[key, &h(3)]).as_bytes()).unwrap();
        let mut first = [0u8; 256];
        assert!(s.read(&mut first).unwrap() > 0);
        drop(s);
        let mut lines = Vec::new();
        let all = wait_until(patience(Duration::from_secs(5)), || {
            lines = access_lines(&gw);
            ids.iter().all(|id| lines.iter().any(|l| l["request_id"].as_str() == Some(id)))
        });
        assert!(all, "missing access lines; log:\n{}", gw.log_text());
        let line = |i: usize| {
            let mine: Vec<_> = lines.iter().filter(|l| l["request_id"].as_str() == Some(&ids[i])).collect();
            assert_eq!(mine.len(), 1, "request {i} has {} access lines", mine.len());
            mine[0].clone()
        };
        let ok = line(0);
        assert_eq!(ok["status"].as_u64(), Some(200));
        assert_eq!(ok["method"].as_str(), Some("POST"));
        assert_eq!(ok["path"].as_str(), Some("/v1/chat/completions"));
        assert_eq!(ok["model"].as_str(), Some("m"));
        assert_eq!(ok["worker"].as_str(), Some(w.url().as_str()));
        assert!(ok["tenant"].as_str().unwrap().starts_with("auth:"));
        assert!(ok["bytes_in"].as_u64().unwrap() > 0 && ok["bytes_out"].as_u64().unwrap() > 0);
        assert!(ok["ttfb_us"].as_u64().is_some());
        let (up, ttfb) = (ok["upstream_us"].as_u64().expect("upstream_us"), ok["ttfb_us"].as_u64().unwrap());
        assert!(up <= ttfb, "the worker head ({up} us) comes before the first byte ({ttfb} us)");
        assert_eq!(ok["retries"].as_u64(), Some(0));
        assert_eq!(line(1)["status"].as_u64(), Some(401));
        assert_eq!(line(2)["status"].as_u64(), Some(503));
        assert_eq!(line(3)["status"].as_u64(), Some(200), "the aborted stream's status is the worker's");
        let log = gw.log_text();
        assert!(!log.contains("Bearer k") && !log.contains("\"k\""), "a key reached the log");
    });
}

#[test]
fn a_stalled_log_writer_never_stops_a_shard() {
    // The gateway's stderr is a pipe nobody reads: once its buffer is full the log writer
    // blocks for good. Requests must keep flowing and the drop counter must rise.
    let w = FakeWorker::start("m");
    let port = free_port();
    let mport = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smg"))
        .args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--worker-urls", &w.url()])
        .args(["--cores", "2", "--prometheus-host", "127.0.0.1", "--prometheus-port", &mport.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let up =
        wait_until(patience(Duration::from_secs(20)), || try_get(port, "/readiness").is_ok_and(|r| r.status == 200));
    assert!(up, "gateway never became ready");
    let until = Instant::now() + patience(Duration::from_secs(60));
    let mut sent = 0;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(5)))).unwrap();
    let mut rest = Vec::new();
    let dropped = loop {
        for _ in 0..500 {
            s.write_all(post_bytes("/v1/chat/completions", CHAT, &[]).as_bytes()).unwrap();
            let r = read_response(&mut s, &mut rest, false).expect("a shard stopped answering");
            assert_eq!(r.status, 200);
            sent += 1;
        }
        let d = sample(&scrape(mport), "smg_access_log_dropped_total").unwrap_or(0.0);
        if d > 0.0 || Instant::now() > until {
            break d;
        }
    };
    assert!(dropped > 0.0, "no access line was dropped after {sent} requests with a stalled writer");
    let _ = child.kill();
    let _ = child.wait();
}
