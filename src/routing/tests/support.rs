//! Shared test helpers: candidate lists and inputs.

use crate::routing::{Candidate, RouteInput};

pub(crate) fn urls(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("http://w{i}:8000")).collect()
}

pub(crate) fn cands<'a>(urls: &'a [String], loads: &[usize]) -> Vec<Candidate<'a>> {
    urls.iter()
        .enumerate()
        .map(|(i, u)| Candidate { url: u, load: loads.get(i).copied().unwrap_or(0), engine_load: None, cached: None })
        .collect()
}

pub(crate) fn text_input<'a>(model: &'a str, text: &'a str) -> RouteInput<'a> {
    RouteInput { model, text: Some(text), ..RouteInput::default() }
}
