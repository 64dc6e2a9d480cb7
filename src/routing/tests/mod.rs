//! Unit tests of the routing module, one file per concern.

mod support;

mod coherence;
mod headers;
mod policies;
mod radix;
mod text;
