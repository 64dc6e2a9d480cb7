//! smg-load: open- and closed-loop HTTP/1.1 load generation with latency, TTFT and ITL histograms, the side-by-side compare (its simulated fleets and child processes), the rate sweep, the report directory, and the failover timing.

pub mod blocking;
pub mod chain;
pub mod client;
pub mod closed_loop;
pub mod compare;
pub mod cpu;
pub mod driver;
pub mod entry;
pub mod failover;
pub(crate) mod fleet;
pub mod open_loop;
pub mod page;
pub(crate) mod pd_fleet;
pub(crate) mod procs;
pub mod records;
pub mod report;
pub mod report_dir;
pub mod run;
pub mod scenario;
pub mod slo;
pub mod sse;
pub mod svg;
pub mod sweep;
pub mod trace;
pub mod ws;
pub mod ws_compare;
