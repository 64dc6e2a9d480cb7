//! `smg demo` starts with no setup and the curl line it prints works as printed.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

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
    let (workers_tx, workers_rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(i) = line.find("simulated workers ") {
                let _ = workers_tx.send(line[i + "simulated workers ".len()..].to_string());
            }
            if let Some(i) = line.find("curl ") {
                let _ = tx.send(line[i..].to_string());
            }
        }
    });
    let curl = rx.recv_timeout(support::patience(Duration::from_secs(30))).expect("demo printed no curl line");
    let workers: Vec<u16> =
        workers_rx.recv().unwrap().split(", ").map(|u| u.rsplit(':').next().unwrap().parse().unwrap()).collect();
    assert_eq!(workers.len(), 2);
    let until = Instant::now() + support::patience(Duration::from_secs(20));
    while support::try_get(port, "/readiness").map(|r| r.status).ok() != Some(200) {
        assert!(Instant::now() < until, "demo never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Run the line exactly as printed, through a shell, as a newcomer would.
    let out = Command::new("sh").args(["-c", &format!("{curl} -sS")]).output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    // The simulator is a child process of the gateway and goes with it, even on SIGKILL.
    let gone = || !workers.iter().any(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok());
    assert!(
        support::wait_until(support::patience(Duration::from_secs(10)), gone),
        "the simulated workers outlived the gateway"
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(body.contains("chat.completion.chunk"), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
}

/// The shipped gateway carries no simulator: away from a checkout and with no smg-sim beside
/// it, `smg demo` fails at once and says how to get smg-sim.
#[test]
fn demo_without_the_simulator_says_how_to_get_it() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-without-sim");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let smg = dir.join("smg");
    // A hard link: the same binary, run from a directory without smg-sim.
    std::fs::hard_link(env!("CARGO_BIN_EXE_smg"), &smg).unwrap();
    let port = support::free_port();
    let out = Command::new(&smg)
        .args(["demo", "--port", &port.to_string()])
        .env_remove("CARGO")
        .env_remove("CARGO_MANIFEST_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("smg-sim") && err.contains("cargo build --release -p smg-loadtest"), "{err}");
    assert!(out.stdout.is_empty(), "no curl line without workers: {}", String::from_utf8_lossy(&out.stdout));
}
