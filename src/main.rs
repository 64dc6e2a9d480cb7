//! `smg` binary: parse the command line, validate it, run the shards.

use clap::Parser;
use smg::config::{Cli, Command};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let cfg = match cli.command {
        Command::Launch(args) => args.into_config(smg::runtime::host()),
        Command::Demo(args) => smg::demo::config(&args),
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
