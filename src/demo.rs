//! `smg demo`: the gateway on 127.0.0.1 in front of two simulated workers, so a newcomer sees
//! streaming and routing with no setup.
//!
//! The workers are an `smg-sim` child process, not code in this binary: the shipped gateway
//! carries no simulator (smg-loadtest is only a dev-dependency of this package). smg-sim is
//! looked for beside the running executable, where cargo puts both. When it is not there and
//! the gateway was started by `cargo run` (cargo sets `CARGO` and `CARGO_MANIFEST_DIR`), it is
//! built first, in the same profile as this binary, so `cargo run --release -- demo` works from
//! a fresh clone. The child dies with the gateway: killed when [`Simulator`] drops, and by the
//! kernel (`PR_SET_PDEATHSIG`) if the gateway is killed outright.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use clap::Parser;

use crate::config::{Cli, Command as SmgCommand, Config, DemoArgs};

/// The simulator's executable name, as loadtest/Cargo.toml's `[[bin]]` has it.
const SIM: &str = "smg-sim";

/// The running smg-sim child; dropping it kills it.
pub struct Simulator(Child);

// === impl Simulator ===

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the simulated workers and returns the gateway's config for them, with the child
/// process to keep alive as long as the gateway runs.
pub fn start(args: &DemoArgs) -> Result<(Config, Simulator), String> {
    let bin = sim_binary()?;
    // Port 0: the simulator binds free ports itself and prints them, so no port is picked here
    // and then raced for. Realistic pacing so streaming is visible: 30 ms to the first token,
    // 15 ms per token.
    let mut cmd = Command::new(&bin);
    cmd.args(["--ports", "0,0", "--model", &args.model, "--ttft-ms", "30", "--itl-ms", "15", "--threads", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| format!("demo: starting {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let sim = Simulator(child);
    let ports = await_ready(stdout)?;

    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let port = args.port.to_string();
    let mut argv = vec!["smg", "launch", "--host", "127.0.0.1", "--port", &port, "--worker-urls"];
    argv.extend(urls.iter().map(String::as_str));
    let cfg = match Cli::try_parse_from(argv).map_err(|e| format!("demo: {e}"))?.command {
        SmgCommand::Launch(launch) => launch.into_config(crate::runtime::host())?,
        SmgCommand::Demo(_) => unreachable!("parsed a launch command"),
    };
    // A closed stdout (piped into `head`, say) must not take the gateway down: write, don't print.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "smg demo: gateway on http://127.0.0.1:{} in front of simulated workers {}\nTry:\n  curl http://127.0.0.1:{}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"stream\":true}}'\nStop with Ctrl-C.",
        args.port,
        urls.join(", "),
        args.port,
        args.model
    );
    let _ = out.flush();
    Ok((cfg, sim))
}

/// Reads the simulator's start-up lines (`listening HOST:PORT ...` per worker, then `ready`)
/// and returns the ports; then keeps draining its stdout so it never blocks on a full pipe.
fn await_ready(stdout: ChildStdout) -> Result<Vec<u16>, String> {
    let mut lines = BufReader::new(stdout).lines();
    let mut ports = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("ready") => break,
            Some(Ok(line)) => {
                let addr = line.strip_prefix("listening ").and_then(|r| r.split_whitespace().next());
                if let Some(port) = addr.and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| p.parse().ok()) {
                    ports.push(port);
                }
            }
            Some(Err(e)) => return Err(format!("demo: reading {SIM}'s output: {e}")),
            None => return Err(format!("demo: {SIM} exited before it was ready (its error is above)")),
        }
    }
    if ports.len() != 2 {
        return Err(format!("demo: {SIM} reported {} workers, expected 2", ports.len()));
    }
    std::thread::Builder::new()
        .name("smg-demo-sim-out".into())
        .spawn(move || lines.map_while(Result::ok).for_each(drop))
        .map_err(|e| format!("demo: {e}"))?;
    Ok(ports)
}

/// smg-sim beside this executable, built first under `cargo run` when it is missing.
fn sim_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("demo: locating this executable: {e}"))?;
    let dir = exe.parent().ok_or("demo: this executable has no directory")?;
    let bin = dir.join(SIM);
    if bin.is_file() {
        return Ok(bin);
    }
    let (Some(cargo), Some(manifest_dir)) = (std::env::var_os("CARGO"), std::env::var_os("CARGO_MANIFEST_DIR")) else {
        return Err(format!(
            "demo: the simulated workers are the separate program {SIM}, and it is not beside {} \
             (build it with `cargo build --release -p smg-loadtest --bin {SIM}` and copy it there, \
             or run the demo from a checkout with `cargo run --release -- demo`)",
            exe.display()
        ));
    };
    build_sim(Path::new(&cargo), Path::new(&manifest_dir), dir)?;
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("demo: built {SIM}, but it is not at {}", bin.display()))
    }
}

/// `cargo build [--release] -p smg-loadtest --bin smg-sim` in the checkout, into the target
/// directory this executable was built in (`<target>/<profile>/smg`).
fn build_sim(cargo: &Path, manifest_dir: &Path, exe_dir: &Path) -> Result<(), String> {
    eprintln!("smg demo: building {SIM}, the simulated workers (first run only; it is not part of the gateway)");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(manifest_dir).args(["build", "-p", "smg-loadtest", "--bin", SIM]);
    // A release gateway gets a release simulator, so the demo's timings are the simulator's.
    if cfg!(not(debug_assertions)) {
        cmd.arg("--release");
    }
    if let Some(target_dir) = exe_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    // Cargo's progress goes to stderr; stdout stays the demo's (it prints the curl line).
    let status = cmd.stdout(Stdio::null()).status().map_err(|e| format!("demo: running {}: {e}", cargo.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("demo: `cargo build -p smg-loadtest --bin {SIM}` failed ({status})"))
    }
}

/// Asks the kernel to kill the child when this process dies, whatever kills it (a SIGKILL
/// runs no destructor). The signal follows the thread that spawned the child, so spawn from
/// the main thread, which lives as long as the gateway.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only system calls between fork and exec, as pre_exec requires: prctl and getppid
    // are async-signal-safe, allocate nothing and take no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then nothing would ever signal us.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("smg exited while starting the simulator"));
            }
            Ok(())
        });
    }
}
