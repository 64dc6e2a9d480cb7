//! Traces through the binary: a real OTLP/gRPC receiver (`tests/e2e/otlp_receiver.py`,
//! grpcio + opentelemetry-proto, installed by `.ci/run`) must receive the gateway's span with
//! the caller's trace id and parent, and the worker must see a `traceparent` whose parent is
//! that span.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sonic_rs::JsonValueTrait;
use support::*;

struct Receiver {
    child: Child,
    port: u16,
    out: std::path::PathBuf,
}

impl Receiver {
    fn start() -> Receiver {
        let port = free_port();
        let out = std::env::temp_dir().join(format!("smg-otlp-{}-{port}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&out);
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/otlp_receiver.py");
        let mut child = Command::new("python3")
            .args([script, "--port", &port.to_string(), "--out"])
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the OTLP receiver did not start (pip install grpcio opentelemetry-proto)");
        Receiver { child, port, out }
    }

    fn spans(&self) -> Vec<sonic_rs::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| sonic_rs::from_str(l).ok())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

#[test]
fn spans_continue_the_callers_trace_and_parent_the_workers() {
    let rx = Receiver::start();
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let endpoint = format!("127.0.0.1:{}", rx.port);
        let gw = Gateway::start(
            legacy,
            &[
                "--worker-urls",
                &w.url(),
                "--cores",
                "2",
                "--prometheus-port",
                "0",
                "--enable-trace",
                "--otlp-traces-endpoint",
                &endpoint,
            ],
        );
        gw.ready();
        let trace = if legacy { "4bf92f3577b34da6a3ce929d0e0e4736" } else { "0af7651916cd43dd8448eb211c80319c" };
        let caller = "00f067aa0ba902b7";
        let tp = format!("traceparent: 00-{trace}-{caller}-01");
        let r = post(
            gw.port,
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            &[&tp],
        );
        assert_eq!(r.status, 200);
        // A request without a traceparent starts a trace of its own.
        assert_eq!(post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
        let mut mine = None;
        let arrived = wait_until(patience(Duration::from_secs(10)), || {
            mine = rx.spans().into_iter().find(|s| s["trace_id"].as_str() == Some(trace));
            mine.is_some()
        });
        assert!(arrived, "no span with the caller's trace id; received: {:?}", rx.spans());
        let span = mine.unwrap();
        assert_eq!(span["parent_span_id"].as_str(), Some(caller));
        assert_eq!(span["kind"].as_u64(), Some(2), "a server span");
        assert_eq!(span["name"].as_str(), Some("POST /v1/chat/completions"));
        assert_eq!(span["service_name"].as_str(), Some("smg"));
        assert_eq!(span["attributes"]["http.response.status_code"].as_i64(), Some(200));
        assert!(span["end_time_unix_nano"].as_u64() >= span["start_time_unix_nano"].as_u64());
        let span_id = span["span_id"].as_str().unwrap().to_string();
        let seen: Vec<String> =
            w.requests().iter().filter_map(|q| q.header("traceparent").map(str::to_string)).collect();
        assert!(
            seen.contains(&format!("00-{trace}-{span_id}-01")),
            "the worker's traceparent must name the gateway's span {span_id}: {seen:?}"
        );
        assert_eq!(seen.len(), 2, "every forwarded request carries a traceparent: {seen:?}");
    });
}
