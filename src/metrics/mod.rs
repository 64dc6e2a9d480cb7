//! Prometheus metrics with SMG's names and labels (so existing dashboards work).
//!
//! Each shard counts into its own [`ShardMetrics`]: plain integers in small maps keyed by
//! `&'static` labels, written once per request at `finish` and never shared. A scrape (on
//! its own listener, `server.rs`, a control thread) asks every shard through its inbox for
//! a copy, merges them and renders the text format (`exposition.rs`); the request path
//! never waits for it.
//!
//! Histograms are Prometheus's own: one counter per configured bucket bound
//! (`--prometheus-duration-buckets`, SMG's 29 defaults) plus count and sum, found with a
//! binary search over ~29 bounds. That is exactly what the exposition needs, and a few
//! hundred bytes per label set where an hdrhistogram would hold tens of KB.
//!
//! Label cardinality is bounded by construction: paths are route templates (`other` for
//! unknown ones), methods a fixed set, error codes the gateway's own `&'static` codes, and
//! `model` is recorded only for requests that reached a worker (so it names a served model).

mod exposition;
pub mod server;
mod shard;

pub use exposition::render;
pub use shard::{error_type, Counts, Finished, Hist, Routed, RouterStats, ShardMetrics, ShardReport, DEFAULT_BUCKETS};
