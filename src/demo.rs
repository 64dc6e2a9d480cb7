//! `smg demo`: the gateway in front of built-in simulated workers.
use crate::config::{Config, DemoArgs};
pub fn config(_args: &DemoArgs) -> Result<Config, String> {
    Err("demo: simulator not wired yet".into())
}
