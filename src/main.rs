//! `smg` binary: parse the command line, validate it, run the shards.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

use clap::Parser;
use smg::config::{Cli, Command};

#[global_allocator]
static GLOBAL: smg::allocator::Allocator = smg::allocator::Allocator;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The demo's simulated workers: a child process, killed when this is dropped at the end.
    let mut _demo_workers = None;
    let cfg = match cli.command {
        Command::Launch(args) => args.into_config(smg::runtime::host()),
        Command::Demo(args) => smg::demo::start(&args).map(|(cfg, sim)| {
            _demo_workers = Some(sim);
            cfg
        }),
    };
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = smg::log::init(cfg.log_level, cfg.log_json, cfg.log_dir.as_deref()) {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    let result = smg::runtime::run(cfg);
    smg::log::flush();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
