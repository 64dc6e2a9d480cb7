//! smg-loadtest: the worker simulator (`smg-sim`) and load generator (`smg-load`) used to size and compare gateways.
//!
//! Both tools are thread-per-core on monoio (io_uring, or epoll with `MONOIO_FORCE_LEGACY_DRIVER=1`)
//! and speak HTTP/1.1 through our own framing on `httparse` (see [`wire`]), so neither becomes the
//! bottleneck of the system they measure.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

pub mod load;
pub mod rng;
pub mod rt;
pub mod sim;
pub mod sync;
pub mod wire;
