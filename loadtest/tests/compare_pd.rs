//! `smg-load compare --pd` end to end: the gateway in front of simulated prefill/decode pairs,
//! in both engines' shapes, with the peers that cannot pair skipped rather than failing.
//!
//! The gateway comes from `common::gateway_bin` (`$SMG_BIN`, else `smg` beside this test's
//! target directory); without one the test skips with a note.

mod common;

use common::{gateway_bin, smg_load};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

#[test]
fn pd_compare_through_the_gateway() {
    let Some(gateway) = gateway_bin() else {
        eprintln!("skipped: no gateway binary (build it with `cargo build --bin smg`, or set SMG_BIN)");
        return;
    };
    for runtime in ["sglang", "vllm"] {
        let rows = smg_load(
            &[
                "compare",
                "--pd",
                "--pd-runtime",
                runtime,
                // direct and nginx cannot drive a pair: skipped with a note, not a failure.
                "--targets",
                "direct,smg,nginx",
                "--gateway-bin",
                gateway.to_str().unwrap(),
                "--sim-bin",
                env!("CARGO_BIN_EXE_smg-sim"),
                "--sim-workers",
                "2",
                "--rounds",
                "1",
                "--duration",
                "500ms",
                "--warmup",
                "100ms",
                "--concurrency",
                "2",
                "--json",
            ],
            false,
        );
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 1, "{runtime}: {rows:?}");
        let r = &rows[0];
        assert_eq!(r["target"].as_str(), Some("smg"), "{runtime}: {r:?}");
        assert!(r["ok"].as_u64().unwrap() > 0, "{runtime}: {r:?}");
        assert_eq!(r["errors"].as_u64(), Some(0), "{runtime}: {r:?}");
        assert!(r["cpu_us_per_request"].as_f64().is_some(), "{runtime}: {r:?}");
        // Every request's KV went through a decode's handoff, and none was lost.
        assert_eq!(r["handoffs_failed"].as_u64(), Some(0), "{runtime}: {r:?}");
        assert!(r["handoff_wait_ms"].as_f64().unwrap() >= 0.0, "{runtime}: {r:?}");
    }
}
