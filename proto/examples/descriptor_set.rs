//! Writes the crate's encoded FileDescriptorSet to stdout, for the wire-contract test
//! (tests/e2e/test_proto_contract.py), which compares it with PyPI smg-grpc-proto's.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

use std::io::Write;

fn main() {
    std::io::stdout().write_all(smg_proto::FILE_DESCRIPTOR_SET).expect("stdout");
}
