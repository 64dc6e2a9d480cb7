//! smg-load against smg-sim under both drivers: counts, SSE measurements, error accounting,
//! open-loop queueing (coordinated omission), and the compare smoke run that needs no peers.

mod common;

use common::*;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

#[test]
fn closed_loop_counts_and_usage() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0"], legacy);
        let r = smg_load(
            &[
                "run",
                "--url",
                &url(sim.port()),
                "--scenario",
                "chat-1k",
                "--requests",
                "300",
                "--concurrency",
                "4",
                "--json",
            ],
            legacy,
        );
        assert_eq!(r["requests"].as_u64(), Some(300));
        assert_eq!(r["ok"].as_u64(), Some(300));
        assert_eq!(r["status"]["200"].as_u64(), Some(300));
        assert_eq!(r["latency_ms"]["count"].as_u64(), Some(300));
        // 64 variants cycle, so after the first pass the whole-block prefixes are cached.
        assert!(r["cache_ratio"].as_f64().unwrap() > 0.5, "{r:?}");
        assert!(r["connections_opened"].as_u64().unwrap() <= 8);
    }
}

#[test]
fn sse_ttft_itl_and_threads() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--ttft-ms", "10", "--itl-ms", "1"], legacy);
        let r = smg_load(
            &[
                "run",
                "--url",
                &url(sim.port()),
                "--scenario",
                "sse-long",
                "--requests",
                "8",
                "--concurrency",
                "4",
                "--threads",
                "2",
                "--json",
            ],
            legacy,
        );
        assert_eq!(r["ok"].as_u64(), Some(8), "{r:?}");
        assert_eq!(r["ttft_ms"]["count"].as_u64(), Some(8));
        assert!(r["ttft_ms"]["p50"].as_f64().unwrap() >= 9.0);
        // 256 tokens per stream: 255 gaps each.
        assert_eq!(r["itl_ms"]["count"].as_u64(), Some(8 * 255));
        assert_eq!(r["completion_tokens"].as_u64(), Some(8 * 256));
        assert_eq!(r["broken_streams"].as_u64(), Some(0));
    }
}

#[test]
fn errors_by_status_and_broken_streams() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--fail-rate", "1", "--fail-status", "503"], legacy);
        let r =
            smg_load(&["run", "--url", &url(sim.port()), "--requests", "20", "--concurrency", "2", "--json"], legacy);
        assert_eq!(r["errors"].as_u64(), Some(20));
        assert_eq!(r["status"]["503"].as_u64(), Some(20));

        let sim = Sim::start(&["--ports", "0", "--truncate-rate", "1"], legacy);
        let r = smg_load(
            &[
                "run",
                "--url",
                &url(sim.port()),
                "--scenario",
                "sse-long",
                "--requests",
                "5",
                "--concurrency",
                "1",
                "--json",
            ],
            legacy,
        );
        assert_eq!(r["errors"].as_u64(), Some(5), "{r:?}");

        // Nothing listening: transport errors, not a crash.
        let dead = refused_port();
        let r = smg_load(&["run", "--url", &url(dead), "--requests", "3", "--concurrency", "1", "--json"], legacy);
        assert_eq!(r["transport_errors"]["connect"].as_u64(), Some(3));
    }
}

#[test]
fn open_loop_latency_includes_queueing() {
    for legacy in DRIVERS {
        // One batch slot and 20 ms per request: the target serves at most 50 req/s.
        let sim =
            Sim::start(&["--ports", "0", "--max-running", "1", "--ttft-ms", "20", "--output-tokens", "1"], legacy);
        let u = url(sim.port());
        // Closed loop, one connection: latency is the service time.
        let closed = smg_load(&["run", "--url", &u, "--requests", "20", "--concurrency", "1", "--json"], legacy);
        let closed_p50 = closed["latency_ms"]["p50"].as_f64().unwrap();
        assert!(closed_p50 < 100.0, "{closed:?}");
        // Open loop at 100 req/s for 1 s over a single connection: requests fall behind schedule,
        // and their latency, counted from the intended send time, grows with the backlog.
        let open = smg_load(
            &[
                "run",
                "--url",
                &u,
                "--rate",
                "100",
                "--arrival",
                "fixed",
                "--requests",
                "100",
                "--max-conns",
                "1",
                "--json",
            ],
            legacy,
        );
        assert_eq!(open["requests"].as_u64(), Some(100));
        let p50 = open["latency_ms"]["p50"].as_f64().unwrap();
        let max = open["latency_ms"]["max"].as_f64().unwrap();
        // Request k is due at 10k ms but served at ~20k ms: the median waits ~500 ms, the last ~1 s.
        assert!(p50 > 200.0, "open-loop p50 {p50} should include queueing");
        assert!(max > 600.0, "open-loop max {max}");
    }
}

#[test]
fn compare_smoke_without_peers() {
    let sim_bin = env!("CARGO_BIN_EXE_smg-sim");
    let rows = smg_load(
        &[
            "compare",
            "--targets",
            "direct,smg,smg-base,nginx,smg-python",
            "--gateway-bin",
            "/nonexistent/smg",
            "--base-bin",
            "/nonexistent/smg",
            "--sim-workers",
            "3",
            "--nginx-bin",
            "/nonexistent/nginx",
            "--smg-python-bin",
            "/nonexistent/smg",
            "--sim-bin",
            sim_bin,
            "--rounds",
            "2",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--concurrency",
            "2",
            "--json",
        ],
        false,
    );
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["target"].as_str(), Some("direct"));
    assert_eq!(rows[0]["rounds"].as_u64(), Some(2));
    assert!(rows[0]["rps"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[0]["rps_vs_direct"].as_f64(), Some(1.0));
    assert_eq!(rows[0]["errors"].as_u64(), Some(0));
}
