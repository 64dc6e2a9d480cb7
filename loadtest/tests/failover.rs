//! `smg-load failover` end to end: two worker deaths behind the gateway's debug build.
//!
//! The gateway is another package, so Cargo gives this test no `CARGO_BIN_EXE_smg`: it uses
//! `$SMG_BIN`, else `smg` in this test's own target profile directory (present after `cargo
//! build --bin smg`), and skips with a note when neither exists.

mod common;

use common::{gateway_bin, smg_load};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

#[test]
fn two_trials_against_the_gateway() {
    let Some(gateway) = gateway_bin() else {
        eprintln!("skipped: no gateway binary (build it with `cargo build --bin smg`, or set SMG_BIN)");
        return;
    };
    let rows = smg_load(
        &[
            "failover",
            "--gateway-bin",
            gateway.to_str().unwrap(),
            "--sim-bin",
            env!("CARGO_BIN_EXE_smg-sim"),
            "--gateway-args",
            "--health-check-interval-secs 1 --disable-circuit-breaker",
            "--trials",
            "2",
            "--concurrency",
            "4",
            "--trial-timeout",
            "30s",
            "--json",
        ],
        false,
    );
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(r["trials"].as_u64(), Some(2), "{r:?}");
    assert_eq!(r["timeouts"].as_u64(), Some(0), "{r:?}");
    assert_eq!(r["detect_ms"].as_array().unwrap().len(), 2, "{r:?}");
    assert!(r["max_ms"].as_f64().unwrap() < 30_000.0, "{r:?}");
    assert!(r["requests"].as_u64().unwrap() > 0, "{r:?}");
    // Retries are on: a dead worker's requests go to the stable one, unseen by clients.
    assert_eq!(r["errors"].as_u64(), Some(0), "{r:?}");
    assert!(r["gateway_flags"].as_str().unwrap().contains("--disable-circuit-breaker"), "{r:?}");
}
