//! Compiles proto/*.proto with protox (a protobuf compiler written in Rust, so the build needs
//! neither a system `protoc` nor the network) and hands the descriptors to prost-build.
//!
//! Besides the Rust types it writes:
//! - `descriptors.bin`: the FileDescriptorSet of our files (no imports, no source info), which
//!   the contract test compares with the reference package's descriptors;
//! - `services.rs`: one module per service with its gRPC method paths, so servers and clients
//!   never spell "/package.Service/Method" by hand.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::path::PathBuf;

const FILES: &[&str] = &["sglang_scheduler.proto", "common.proto"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for f in FILES {
        println!("cargo:rerun-if-changed=proto/{f}");
    }

    // The contract's own files only: google/protobuf/* are protox's bundled copies.
    let mut plain = protox::Compiler::new(["proto"]).expect("protox include path");
    plain.include_imports(false).include_source_info(false);
    plain.open_files(FILES).unwrap_or_else(|e| panic!("protox: {e:?}"));
    std::fs::write(out.join("descriptors.bin"), plain.encode_file_descriptor_set()).expect("write descriptors.bin");

    // Codegen wants imports resolved and comments (they become doc comments).
    let mut full = protox::Compiler::new(["proto"]).expect("protox include path");
    full.include_imports(true).include_source_info(true);
    full.open_files(FILES).unwrap_or_else(|e| panic!("protox: {e:?}"));
    let fds = full.file_descriptor_set();

    let mut paths = String::new();
    for file in &fds.file {
        let package = file.package();
        if package.starts_with("google.") {
            continue;
        }
        for svc in &file.service {
            let full_name = format!("{package}.{}", svc.name());
            let _ = writeln!(paths, "/// gRPC paths of `{full_name}`.\npub mod {} {{", snake(svc.name()));
            let _ = writeln!(paths, "    pub const SERVICE: &str = \"{full_name}\";");
            for m in &svc.method {
                let _ = writeln!(
                    paths,
                    "    pub const {}: &str = \"/{full_name}/{}\";",
                    snake(m.name()).to_ascii_uppercase(),
                    m.name()
                );
            }
            paths.push_str("}\n");
        }
    }
    std::fs::write(out.join("services.rs"), paths).expect("write services.rs");

    prost_build::Config::new().compile_fds(fds).unwrap_or_else(|e| panic!("prost-build: {e}"));
}

/// `GetModelInfo` -> `get_model_info`, `LoadLoRAAdapter` -> `load_lo_ra_adapter` (only used
/// for constant names).
fn snake(camel: &str) -> String {
    let c: Vec<char> = camel.chars().collect();
    let mut s = String::new();
    for (i, &ch) in c.iter().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            let prev_lower = c[i - 1].is_ascii_lowercase() || c[i - 1].is_ascii_digit();
            let acronym_end = c[i - 1].is_ascii_uppercase() && c.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev_lower || acronym_end {
                s.push('_');
            }
        }
        s.push(ch.to_ascii_lowercase());
    }
    s
}
