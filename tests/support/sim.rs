//! Simulated workers (smg-sim) in this test process: each on its own thread and port,
//! driven through its HTTP control surface like a user drives the real binary.

use std::net::TcpStream;
use std::time::Duration;

use clap::Parser;

use super::{claim, free_port, get, post, wait_until, Response};

pub struct Sim {
    pub port: u16,
    /// A PD prefill worker's bootstrap port.
    pub bootstrap: Option<u16>,
    /// With `--tls-dir`: the TLS port; with `--connect-proxy-port`, the proxy's.
    pub tls: Option<u16>,
    pub proxy: Option<u16>,
}

impl Sim {
    /// One simulated worker serving `model`, with extra smg-sim flags, on the kernel's pick of
    /// port (and of bootstrap port, for a prefill worker).
    pub fn start(model: &str, flags: &[&str]) -> Sim {
        Self::start_on(0, model, flags)
    }

    /// [`Sim::start`] on `port` (a worker restarted where a dead one was); 0 is the kernel's
    /// pick. Returns once the worker listens: its ports come from its own sockets, so nothing
    /// else in this process can be mistaken for it.
    pub fn start_on(port: u16, model: &str, flags: &[&str]) -> Sim {
        let ports = port.to_string();
        let mut argv = vec!["smg-sim", "--ports", &ports, "--model", model, "--threads", "1"];
        argv.extend_from_slice(flags);
        let args = smg_loadtest::sim::config::SimArgs::try_parse_from(argv).expect("smg-sim flags");
        let started = smg_loadtest::sim::start(args).unwrap_or_else(|e| panic!("smg-sim on port {port}: {e}"));
        let bound = &started.bound[0];
        let sim = Sim {
            port: bound.port,
            bootstrap: bound.bootstrap,
            tls: started.tls.first().copied(),
            proxy: started.proxy,
        };
        // Kept from free_port, which would otherwise hand a dead worker's port to a gateway.
        for p in [Some(sim.port), sim.bootstrap, sim.tls, sim.proxy].into_iter().flatten() {
            claim(p);
        }
        sim
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A `--grpc` worker's URL for the gateway (its HTTP control surface stays on `url`).
    pub fn grpc_url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.port)
    }

    /// POST /sim/control.
    pub fn control(&self, json: &str) -> Response {
        let r = post(self.port, "/sim/control", json, &[]);
        assert_eq!(r.status, 200, "sim control {json}: {}", r.text());
        r
    }

    pub fn stats(&self) -> sonic_rs::Value {
        get(self.port, "/sim/stats").json()
    }

    /// Inference requests this worker has taken.
    pub fn served(&self) -> u64 {
        use sonic_rs::JsonValueTrait;
        self.stats()["inference_requests"].as_u64().unwrap_or(0)
    }

    /// Kills the worker now: its port is closed and every connection cut, streams too.
    pub fn die(&self) {
        // The answer may not make it out before the connection is cut: not waited for.
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            use std::io::Write;
            let _ = s.write_all(super::post_bytes("/sim/control", r#"{"die":true}"#, &[]).as_bytes());
            let _ = super::closed_within(&mut s, Duration::from_secs(5));
        }
        assert!(
            wait_until(Duration::from_secs(5), || TcpStream::connect(("127.0.0.1", self.port)).is_err()),
            "sim {} still accepts after die",
            self.port
        );
    }
}

/// A tokenizer directory (for the gateway's `--tokenizer-path`): the simulator's vocabulary
/// with `template` as its chat template.
#[allow(dead_code)] // Not every test file that includes support/ uses it.
pub fn tokenizer_dir_with_template(template: &str) -> std::path::PathBuf {
    use smg_loadtest::sim::tokenizer::tokenizer_json;
    let dir = std::env::temp_dir().join(format!("smg-template-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
    let mut cfg = Vec::new();
    cfg.extend_from_slice(b"{\"eos_token\":\"<|im_end|>\",\"chat_template\":");
    cfg.extend_from_slice(sonic_rs::to_string(template).unwrap().as_bytes());
    cfg.push(b'}');
    std::fs::write(dir.join("tokenizer_config.json"), cfg).unwrap();
    dir
}

/// A gateway on two shards in front of `sims` as gRPC workers (health checked every second),
/// with `extra` flags; returns once every worker is ready.
#[allow(dead_code)] // Not every test file that includes support/ uses it.
pub fn grpc_gateway(legacy: bool, sims: &[&Sim], extra: &[&str]) -> super::Gateway {
    let urls: Vec<String> = sims.iter().map(|s| s.grpc_url()).collect();
    let mut args: Vec<&str> = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    // Two shards unless the test says how many.
    if !extra.contains(&"--cores") {
        args.extend_from_slice(&["--cores", "2"]);
    }
    args.extend_from_slice(&["--health-check-interval-secs", "1"]);
    args.extend_from_slice(extra);
    let gw = super::Gateway::start(legacy, &args);
    gw.ready_workers(sims.len());
    gw
}
