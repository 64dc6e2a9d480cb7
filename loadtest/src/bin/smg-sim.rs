//! smg-sim entry point: parse flags, start the simulated workers.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

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
