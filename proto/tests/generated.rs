//! The generated crate is usable as the gateway and the simulator use it: messages round-trip,
//! method paths are spelled as gRPC wants them, and the embedded descriptors are ours. (The
//! field-by-field comparison with the reference package is tests/e2e/test_proto_contract.py.)

use prost::Message;
use smg_proto::scheduler::{generate_response, GenerateComplete, GenerateResponse, SamplingParams};

#[test]
fn messages_round_trip_on_the_wire() {
    let resp = GenerateResponse {
        request_id: "r1".into(),
        response: Some(generate_response::Response::Complete(GenerateComplete {
            output_ids: vec![5, 6, 7],
            finish_reason: "stop".into(),
            completion_tokens: 3,
            ..Default::default()
        })),
    };
    let bytes = resp.encode_to_vec();
    assert_eq!(GenerateResponse::decode(bytes.as_slice()).unwrap(), resp);
    // proto3 `optional` keeps presence: an explicit 0 is not "absent".
    let p = SamplingParams { max_new_tokens: Some(0), ..Default::default() };
    let back = SamplingParams::decode(p.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.max_new_tokens, Some(0));
    assert_eq!(SamplingParams::decode(&[][..]).unwrap().max_new_tokens, None);
}

#[test]
fn method_paths() {
    use smg_proto::paths::sglang_scheduler as p;
    assert_eq!(p::SERVICE, "sglang.grpc.scheduler.SglangScheduler");
    assert_eq!(p::GENERATE, "/sglang.grpc.scheduler.SglangScheduler/Generate");
    assert_eq!(p::LOAD_LO_RA_ADAPTER, "/sglang.grpc.scheduler.SglangScheduler/LoadLoRAAdapter");
}

#[test]
fn embedded_descriptors_are_the_two_packages() {
    let fds = prost_types::FileDescriptorSet::decode(smg_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut packages: Vec<&str> = fds.file.iter().map(|f| f.package()).collect();
    packages.sort_unstable();
    assert_eq!(packages, ["sglang.grpc.scheduler", "smg.grpc.common"]);
    let sched = fds.file.iter().find(|f| f.package() == "sglang.grpc.scheduler").unwrap();
    let generate = sched.service[0].method.iter().find(|m| m.name() == "Generate").unwrap();
    assert!(generate.server_streaming() && !generate.client_streaming());
}
