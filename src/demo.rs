//! `smg demo`: the gateway on 127.0.0.1 in front of two built-in simulated workers
//! (smg-sim, in this process), so a newcomer sees streaming and routing with no setup.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::config::{Cli, Command, Config, DemoArgs};

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("demo: {e}"))?;
    Ok(l.local_addr().map_err(|e| format!("demo: {e}"))?.port())
}

/// Starts the simulated workers and returns the gateway's config for them.
pub fn config(args: &DemoArgs) -> Result<Config, String> {
    let ports = [free_port()?, free_port()?];
    let port_list = format!("{},{}", ports[0], ports[1]);
    // Realistic pacing so streaming is visible: 30 ms to the first token, 15 ms per token.
    let sim = smg_loadtest::sim::config::SimArgs::try_parse_from([
        "smg-sim",
        "--ports",
        &port_list,
        "--model",
        &args.model,
        "--ttft-ms",
        "30",
        "--itl-ms",
        "15",
        "--threads",
        "1",
    ])
    .map_err(|e| format!("demo: {e}"))?;
    std::thread::Builder::new()
        .name("smg-demo-sim".into())
        .spawn(move || {
            if let Err(e) = smg_loadtest::sim::run(sim) {
                eprintln!("demo: simulator stopped: {e}");
            }
        })
        .map_err(|e| format!("demo: {e}"))?;
    let until = Instant::now() + Duration::from_secs(10);
    for p in ports {
        while TcpStream::connect(("127.0.0.1", p)).is_err() {
            if Instant::now() > until {
                return Err(format!("demo: simulated worker on port {p} did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let port = args.port.to_string();
    let mut argv = vec!["smg", "launch", "--host", "127.0.0.1", "--port", &port, "--worker-urls"];
    argv.extend(urls.iter().map(String::as_str));
    let cfg = match Cli::try_parse_from(argv).map_err(|e| format!("demo: {e}"))?.command {
        Command::Launch(launch) => launch.into_config(crate::runtime::host())?,
        Command::Demo(_) => unreachable!("parsed a launch command"),
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
    Ok(cfg)
}
