//! smg-sim entry point: parse flags, start the simulated workers.

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args = smg_loadtest::sim::config::SimArgs::parse();
    if let Err(e) = smg_loadtest::sim::run(args) {
        eprintln!("smg-sim: {e}");
        std::process::exit(1);
    }
}
