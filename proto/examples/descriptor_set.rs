//! Writes the crate's encoded FileDescriptorSet to stdout, for the wire-contract test
//! (tests/e2e/test_proto_contract.py), which compares it with PyPI smg-grpc-proto's.

use std::io::Write;

fn main() {
    std::io::stdout().write_all(smg_proto::FILE_DESCRIPTOR_SET).expect("stdout");
}
