//! `smg-load compare --scenario ws-1k`: the WebSocket relay's cost, side by side. N
//! sessions (`--concurrency`) each send 1 KB text messages and wait for the echo from
//! smg-sim's realtime worker, through each target in turn, rounds interleaved as the HTTP
//! compare does. The column that matters is CPU µs per message of the target's processes.
//!
//! Targets: `direct` (the simulator), `smg` (the worker registered through `/workers` with
//! the `realtime: "true"` label, as the gateway requires) and `nginx` (a plain WebSocket
//! proxy: `proxy_http_version 1.1` with the `Upgrade` and `Connection` headers passed).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::load::compare::{find_targets, median, spawn_nginx, CompareArgs, Kind, Target};
use crate::load::procs::{self, on_path, pinned, wait_ready, Proc};
use crate::load::ws::{self, WsPlan, WsResult};
use crate::rt;

pub const SCENARIO: &str = "ws-1k";
const MODEL: &str = "sim/realtime";
const MESSAGE: usize = 1024;
const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

fn nginx_conf(dir: &Path, port: u16, upstream: u16) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log error;\n\
events {{ worker_connections 8192; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
  proxy_read_timeout 3600s;\n  proxy_send_timeout 3600s;\n\
  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://127.0.0.1:{upstream};\n      proxy_http_version 1.1;\n      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection \"upgrade\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    )
}

/// GETs `path` and returns the status (blocking; start-up only).
fn status(addr: SocketAddr, req: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).ok()?;
    std::str::from_utf8(&buf[9..12]).ok()?.parse().ok()
}

/// Starts a target in front of the worker at `sim`; None for direct.
fn start(t: &Target, args: &CompareArgs, sim: u16) -> Result<(Option<Proc>, u16), String> {
    let port = procs::free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    match t.kind {
        Kind::Direct => Ok((None, sim)),
        Kind::Smg => {
            let bin = t.bin.as_ref().ok_or("no binary")?;
            let mut cmd = pinned(args.sut_core, bin);
            cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--cores", "1"]);
            let extra = if t.name == "smg-base" { &args.sut.base_args } else { &args.sut.smg_args };
            cmd.args(extra.split_whitespace());
            let mut child =
                cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|e| format!("start smg: {e}"))?;
            wait_ready(addr, b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n", &mut child, Duration::from_secs(30))?;
            let body = format!(r#"{{"url":"http://127.0.0.1:{sim}","labels":{{"realtime":"true"}}}}"#);
            let req = format!(
                "POST /workers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if status(addr, &req) != Some(202) {
                return Err("smg refused the realtime worker".into());
            }
            wait_ready(addr, b"GET /readiness HTTP/1.1\r\nHost: x\r\n\r\n", &mut child, Duration::from_secs(30))?;
            Ok((Some(Proc { child, _dir: None }), port))
        }
        Kind::Nginx => {
            let bin = t.bin.as_ref().ok_or("no binary")?;
            let (mut child, dir) = spawn_nginx(args.sut_core, bin, "nginx-ws", |dir| nginx_conf(dir, port, sim))?;
            wait_ready(addr, HEALTH, &mut child, Duration::from_secs(30))?;
            Ok((Some(Proc { child, _dir: Some(dir) }), port))
        }
        Kind::SmgPython => Err("smg-python has no WebSocket relay here".into()),
    }
}

pub fn run(args: &CompareArgs) -> Result<(), String> {
    if args.sut.fleet.pd {
        return Err("--pd: the WebSocket relay has no prefill/decode path".into());
    }
    let mut notes = Vec::new();
    let targets: Vec<Target> =
        find_targets(args, &mut notes)?.into_iter().filter(|t| t.kind != Kind::SmgPython).collect();
    if targets.is_empty() {
        return Err("no target to run".into());
    }
    if on_path("taskset").is_none() {
        notes.push("taskset not found: processes run unpinned".into());
    }
    rt::pin_to(args.load_core);
    let bin = procs::sim_bin(args.sut.fleet.sim_bin.as_deref())?;
    let mut cmd = pinned(args.load_core, &bin);
    cmd.args(["--worker", &format!("0:{MODEL}"), "--cores", &args.load_core.to_string()]);
    cmd.args(args.sut.fleet.sim_args.split_whitespace());
    let (_sim, ports) = procs::spawn_sim(cmd, &bin)?;
    let sim = ports[0];
    let mut results: Vec<Vec<WsResult>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds.max(1) {
        for k in 0..targets.len() {
            let i = (k + round) % targets.len();
            let t = &targets[i];
            let (proc_, port) = match start(t, args, sim) {
                Ok(x) => x,
                Err(e) => {
                    notes.push(format!("{} round {}: {e}", t.name, round + 1));
                    continue;
                }
            };
            let mut headers = vec!["Authorization: Bearer bench".to_string()];
            headers.extend(args.sut.headers.iter().cloned());
            let plan = WsPlan {
                addr: ([127, 0, 0, 1], port).into(),
                target: format!("/v1/realtime?model={}", MODEL.replace('/', "%2F")),
                sessions: args.concurrency,
                message: MESSAGE,
                warmup: args.warmup,
                duration: args.duration,
                core: Some(args.load_core),
                target_pids: proc_.as_ref().map(|p| vec![p.pid()]).unwrap_or_default(),
                headers,
            };
            let r = ws::run(&plan)?;
            drop(proc_);
            let (cpu, sys) = r.cpu_us_per_message().unwrap_or((0.0, 0.0));
            eprintln!(
                "round {} {:<10} {:>9.0} msg/s  p50 {:.3} ms  p99 {:.3} ms  cpu {cpu:.2} µs/msg (sys {sys:.2})  errors {}",
                round + 1,
                t.name,
                r.per_second(),
                r.latency_ms.as_ref().map_or(0.0, |p| p.p50),
                r.latency_ms.as_ref().map_or(0.0, |p| p.p99),
                r.errors
            );
            results[i].push(r);
        }
    }
    println!(
        "scenario {SCENARIO}  sessions {}  {} rounds x {:?} (medians)  SUT core {}, load+sim core {}",
        args.concurrency, args.rounds, args.duration, args.sut_core, args.load_core
    );
    println!(
        "{:<11} {:>10} {:>9} {:>9} {:>12} {:>12} {:>7}",
        "target", "msg/s", "p50 ms", "p99 ms", "cpu µs/msg", "sys µs/msg", "errors"
    );
    for (t, rs) in targets.iter().zip(&results).filter(|(_, r)| !r.is_empty()) {
        let m = |f: &dyn Fn(&WsResult) -> Option<f64>| median(rs.iter().filter_map(f).collect());
        let cpu = (t.kind != Kind::Direct).then(|| m(&|r| r.cpu_us_per_message().map(|c| c.0)));
        let sys = (t.kind != Kind::Direct).then(|| m(&|r| r.cpu_us_per_message().map(|c| c.1)));
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.2}"));
        println!(
            "{:<11} {:>10.0} {:>9.3} {:>9.3} {:>12} {:>12} {:>7}",
            t.name,
            m(&|r| Some(r.per_second())),
            m(&|r| r.latency_ms.as_ref().map(|p| p.p50)),
            m(&|r| r.latency_ms.as_ref().map(|p| p.p99)),
            f(cpu),
            f(sys),
            rs.iter().map(|r| r.errors).sum::<u64>()
        );
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_passes_the_upgrade() {
        let c = nginx_conf(Path::new("/tmp/x"), 8080, 9);
        for needle in [
            "proxy_http_version 1.1;",
            "proxy_set_header Upgrade $http_upgrade;",
            "proxy_set_header Connection \"upgrade\";",
            "proxy_pass http://127.0.0.1:9;",
        ] {
            assert!(c.contains(needle), "{needle}");
        }
    }
}
