//! Every parse of JSON that came from outside the process — a client's body on the routes
//! the contract does not model, an admin's `/workers` body, a worker's discovery, load and
//! model-info answers, a tokenizer config — goes through here, so that nothing recursive
//! sees bytes nested deeper than [`MAX_DEPTH`].
//!
//! Why a pre-scan: sonic-rs builds values and skips lazily by recursion, one stack frame per
//! level. 20,000 levels (40 KB) overflow a shard's or the control thread's stack, and a stack
//! overflow is not a panic: it ends the process. The scan is one allocation-free pass
//! (`smg_wire::json::too_deep`); the chat and completions bodies skip it, since the
//! contract's own scanner bounds their depth with an explicit stack.

use sonic_rs::LazyValue;

pub use smg_wire::json::MAX_DEPTH;

/// The stack of every thread that parses outside JSON (the shards, the control thread). A
/// body at [`MAX_DEPTH`] still recurses that deep in sonic-rs: measured, 127 levels of
/// arrays overflow 4 MiB in a debug build and pass in 8 MiB; twice that keeps a margin for
/// what sits below the parse. Only the pages a thread touches are ever committed.
pub const THREAD_STACK: usize = 16 << 20;

/// Nested deeper than [`MAX_DEPTH`]: `serde_json`'s words, with where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep(pub String);

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Refuses `src` when it nests deeper than [`MAX_DEPTH`].
pub fn check(src: &[u8]) -> Result<(), TooDeep> {
    match smg_wire::json::too_deep(src, MAX_DEPTH) {
        None => Ok(()),
        Some(at) => {
            let err = crate::contract::json::SyntaxError { what: "recursion limit exceeded", at };
            Err(TooDeep(err.describe(src)))
        }
    }
}

/// A whole value, or why not (too deep, or not JSON).
pub fn value(src: &[u8]) -> Result<sonic_rs::Value, String> {
    check(src).map_err(|e| e.0)?;
    sonic_rs::from_slice(src).map_err(|e| e.to_string())
}

/// A request body the inspect phase has passed, parsed without scanning it again: inspect
/// refused it unless its nesting was bounded (the contract's scanner, or [`check`] on the
/// routes the contract does not model; `serve/inspect.rs`). The second scan was 6% of a
/// tokenized chat's routing cost (`cargo bench --bench kv`). Only for such bodies.
pub fn inspected_value(src: &[u8]) -> Result<sonic_rs::Value, String> {
    sonic_rs::from_slice(src).map_err(|e| e.to_string())
}

/// One field by path, read lazily; `None` when absent, not JSON, or too deep.
pub fn get<'a>(src: &'a [u8], path: &[&str]) -> Option<LazyValue<'a>> {
    check(src).ok()?;
    sonic_rs::get(src, path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::JsonValueTrait;

    fn nested(levels: usize) -> Vec<u8> {
        let mut b = b"{\"model\":\"m\",\"input\":".to_vec();
        b.extend(std::iter::repeat_n(b'[', levels));
        b.extend(std::iter::repeat_n(b']', levels));
        b.push(b'}');
        b
    }

    #[test]
    fn deep_values_are_refused_before_parsing() {
        // 100,000 levels would overflow a thread's stack in sonic-rs; here they are an error.
        let deep = nested(100_000);
        assert!(value(&deep).unwrap_err().starts_with("recursion limit exceeded at line 1 column 149"));
        assert!(get(&deep, &["model"]).is_none());
        // At the limit (the object is level 1) both read as before.
        let ok = nested(MAX_DEPTH - 1);
        assert_eq!(get(&ok, &["model"]).unwrap().as_str(), Some("m"));
        assert!(check(&nested(MAX_DEPTH)).is_err());
        // The deepest body allowed parses whole on the stack the gateway's threads get.
        let parsed = std::thread::Builder::new().stack_size(THREAD_STACK).spawn(move || value(&ok).is_ok());
        assert!(parsed.unwrap().join().unwrap());
    }
}
