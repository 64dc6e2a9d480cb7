//! smg-load entry point: `run` drives one target, `compare` runs targets side by side, `failover`
//! times how fast the gateway stops routing to a dead worker, `sweep` finds each target's capacity.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

use smg_loadtest::load::compare::{self, CompareArgs};
use smg_loadtest::load::failover::{self, FailoverArgs};
use smg_loadtest::load::run::{self, RunArgs};
// sweep: open-loop rates up to each target's knee under an SLO.
use smg_loadtest::load::sweep::{self, SweepArgs};
use smg_loadtest::load::ws_compare;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator for LLM gateways and workers (HTTP/1.1, keep-alive, SSE-aware).
#[derive(Parser)]
#[command(name = "smg-load", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Drive one target and report throughput, latency, TTFT, ITL, errors, cache ratio, target CPU.
    Run(RunArgs),
    /// Run one scenario against direct-to-simulator, smg, nginx and Python SMG, interleaved, and print ratios.
    Compare(CompareArgs),
    /// Kill simulated workers behind smg under load and report how long until each is no longer routable.
    Failover(FailoverArgs),
    /// Open-loop runs at rising rates against targets, goodput under --slo, and each target's capacity.
    Sweep(SweepArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(args) => run::cli(&args),
        // ws-1k is the WebSocket relay's compare, built on the HTTP compare's targets.
        Cmd::Compare(args) if args.scenario == ws_compare::SCENARIO => ws_compare::run(&args),
        Cmd::Compare(args) => compare::run(&args),
        Cmd::Failover(args) => failover::run(&args),
        Cmd::Sweep(args) => sweep::run(&args),
    };
    if let Err(e) = result {
        eprintln!("smg-load: {e}");
        std::process::exit(1);
    }
}
