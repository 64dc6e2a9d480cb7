//! The engines' gRPC APIs as Rust types: SGLang's scheduler service and the shared
//! `smg.grpc.common` messages, generated at build time from `proto/` (see build.rs).
//!
//! Modules follow the protobuf packages because prost's generated code refers across packages
//! by relative paths (`super::super::...::smg::grpc::common`).

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

pub mod smg {
    pub mod grpc {
        pub mod common {
            include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
        }
    }
}

pub mod sglang {
    pub mod grpc {
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
        }
    }
}

pub mod framing;

pub use sglang::grpc::scheduler;
pub use smg::grpc::common;

/// gRPC method paths, one module per service (`paths::sglang_scheduler::GENERATE`).
pub mod paths {
    include!(concat!(env!("OUT_DIR"), "/services.rs"));
}

/// Encoded `google.protobuf.FileDescriptorSet` of this crate's .proto files (without imports
/// or source info): what the wire-contract test compares with the reference package.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
