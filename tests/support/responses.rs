//! What the Responses API's tests (tests/responses*.rs) ask and check alike: any method on a
//! fresh connection, an answer's JSON or its error code, and the prompt the engine last read.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use sonic_rs::{JsonValueTrait, Value};

use super::admit::raw_request;
use super::sim::Sim;
use super::{patience, read_response, Response};

/// Any method, on a fresh connection, with extra header lines ("Name: value").
pub fn call(port: u16, method: &str, path: &str, body: Option<&str>, headers: &[&str]) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(15)))).unwrap();
    s.write_all(&raw_request(method, path, body, None, headers)).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

/// A 200's JSON.
pub fn ok(r: &Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The error code of an answer of `status`.
pub fn error_code(r: &Response, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    r.json()["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// The prompt tokens the engine last read.
pub fn engine_prompt(sim: &Sim) -> u64 {
    sim.stats()["grpc"]["last_generate"]["input_tokens"].as_u64().unwrap()
}

/// A stream's events: (SSE event name, data), in order.
pub fn events(r: &Response) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    r.text()
        .split_terminator("\n\n")
        .map(|e| {
            let mut lines = e.lines();
            let name = lines.next().unwrap().strip_prefix("event: ").expect("an event line").to_string();
            let data = sonic_rs::from_str(lines.next().unwrap().strip_prefix("data: ").expect("a data line")).unwrap();
            (name, data)
        })
        .collect()
}
