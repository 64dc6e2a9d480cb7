//! gRPC workers (`grpc://`, SGLang's scheduler API) through the real binary, against the
//! simulated scheduler (`smg-sim --grpc`) in this process: registration and readiness, the
//! gateway's own tokenization, detokenization and OpenAI responses, aborts and engine errors.

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::Sim;
use support::*;

const MODEL: &str = "sim-model";

fn gateway(legacy: bool, sims: &[&Sim], extra: &[&str]) -> Gateway {
    let urls: Vec<String> = sims.iter().map(|s| s.grpc_url()).collect();
    let mut args: Vec<&str> = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend_from_slice(&["--cores", "2", "--health-check-interval-secs", "1"]);
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(sims.len());
    gw
}

#[test]
fn grpc_workers_register_with_their_model_and_tokenizer() {
    both_drivers(|legacy| {
        // One advertises a local tokenizer directory, the other a path the gateway cannot
        // read: its tokenizer comes over GetTokenizer.
        let local = Sim::start(MODEL, &["--grpc"]);
        let remote = Sim::start(MODEL, &["--grpc", "--advertise-tokenizer-path", "/nonexistent/sim-model"]);
        let gw = gateway(legacy, &[&local, &remote], &[]);
        let workers = get(gw.port, "/workers").json();
        let list = workers["workers"].as_array().expect("workers");
        assert_eq!(list.len(), 2, "{workers:?}");
        for w in list.iter() {
            assert_eq!(w["connection_mode"].as_str(), Some("grpc"), "{w:?}");
            assert_eq!(w["runtime_type"].as_str(), Some("sglang"));
            assert_eq!(w["model_id"].as_str(), Some(MODEL));
            assert_eq!(w["is_healthy"].as_bool(), Some(true));
            assert!(w["url"].as_str().unwrap().starts_with("grpc://127.0.0.1:"));
        }
        let rpcs = |s: &Sim| s.stats()["grpc"]["rpcs"].clone();
        assert!(rpcs(&remote)["GetTokenizer"].as_u64().unwrap_or(0) >= 1, "{:?}", rpcs(&remote));
        assert!(rpcs(&local)["GetTokenizer"].as_u64().is_none(), "{:?}", rpcs(&local));
        assert!(rpcs(&local)["HealthCheck"].as_u64().unwrap_or(0) >= 1);
        let models = get(gw.port, "/v1/models").json();
        assert_eq!(models["data"][0]["id"].as_str(), Some(MODEL));
    });
}
