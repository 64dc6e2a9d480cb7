//! smg-load: open- and closed-loop HTTP/1.1 load generation with latency, TTFT and ITL histograms, and the side-by-side compare.

pub mod client;
pub mod closed_loop;
pub mod compare;
pub mod cpu;
pub mod driver;
pub mod open_loop;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sse;
