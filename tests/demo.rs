//! `smg demo` starts with no setup and the curl line it prints works as printed.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn demo_serves_the_printed_request() {
    let port = support::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_smg"))
        .args(["demo", "--port", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Keep draining stdout for the child's whole life, as a terminal would.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(i) = line.find("curl ") {
                let _ = tx.send(line[i..].to_string());
            }
        }
    });
    let curl = rx.recv_timeout(support::patience(Duration::from_secs(30))).expect("demo printed no curl line");
    let until = Instant::now() + support::patience(Duration::from_secs(20));
    while support::try_get(port, "/readiness").map(|r| r.status).ok() != Some(200) {
        assert!(Instant::now() < until, "demo never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Run the line exactly as printed, through a shell, as a newcomer would.
    let out = Command::new("sh").args(["-c", &format!("{curl} -sS")]).output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(body.contains("chat.completion.chunk"), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
}
