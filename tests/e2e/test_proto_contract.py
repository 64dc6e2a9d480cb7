"""Wire contract: proto/ (ours, compiled by protox in proto/build.rs) against PyPI
smg-grpc-proto 0.4.28's compiled descriptors.

Compared after normalizing away what does not reach the wire or the generated API:
comments, source info, declaration order and file names. Compared exactly: packages,
services, methods (input/output types, streaming kinds), messages including nested ones
and map entries, fields (name, number, type, label, type_name, oneof, proto3_optional,
json_name), reserved numbers and names, enums and their values.

Our descriptor set comes from the `descriptor_set` example of smg-proto:
SMG_PROTO_DESCRIPTORS_BIN names the built example, else it is run through cargo.
"""

import copy
import os
import pathlib
import subprocess

from google.protobuf import descriptor_pb2
from smg_grpc_proto.generated import common_pb2, sglang_scheduler_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("smg.grpc.common", "sglang.grpc.scheduler")


def our_descriptor_set():
    exe = os.environ.get("SMG_PROTO_DESCRIPTORS_BIN")
    cmd = [exe] if exe else ["cargo", "run", "-q", "-p", "smg-proto", "--example", "descriptor_set"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=600).stdout
    return descriptor_pb2.FileDescriptorSet.FromString(out)


def reference_files():
    return [descriptor_pb2.FileDescriptorProto.FromString(m.DESCRIPTOR.serialized_pb)
            for m in (common_pb2, sglang_scheduler_pb2)]


def json_name(f):
    """protoc's JSON name: leave out underscores, upper-case the letter after one. The
    reference's serialized descriptors omit it when it is this default; protox writes it."""
    if f.json_name:
        return f.json_name
    out, upper = [], False
    for ch in f.name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def norm_field(f, oneofs):
    real_oneof = f.HasField("oneof_index") and not f.proto3_optional
    return {
        "name": f.name, "number": f.number, "type": f.type, "label": f.label,
        "type_name": f.type_name, "json_name": json_name(f),
        "oneof": oneofs[f.oneof_index] if real_oneof else None,
        "proto3_optional": f.proto3_optional,
    }


def norm_enum(e):
    return {"values": sorted((v.name, v.number) for v in e.value),
            "reserved": sorted((r.start, r.end) for r in e.reserved_range),
            "reserved_names": sorted(e.reserved_name)}


def norm_message(m):
    oneofs = [o.name for o in m.oneof_decl]
    return {
        "fields": {f.number: norm_field(f, oneofs) for f in m.field},
        "nested": {n.name: norm_message(n) for n in m.nested_type},
        "enums": {e.name: norm_enum(e) for e in m.enum_type},
        "reserved": sorted((r.start, r.end) for r in m.reserved_range),
        "reserved_names": sorted(m.reserved_name),
        "map_entry": m.options.map_entry,
    }


def normalize(files):
    """{package: {...}}; file names and declaration order do not matter, content does."""
    out = {}
    for f in files:
        assert f.package not in out, f"two files for package {f.package}"
        out[f.package] = {
            "syntax": f.syntax,
            "dependencies": sorted(pathlib.PurePath(d).name for d in f.dependency),
            "messages": {m.name: norm_message(m) for m in f.message_type},
            "enums": {e.name: norm_enum(e) for e in f.enum_type},
            "services": {s.name: {mt.name: (mt.input_type, mt.output_type, mt.client_streaming,
                                            mt.server_streaming) for mt in s.method}
                         for s in f.service},
        }
    return out


def differences(ours, theirs, path=""):
    """Every path at which the two normalized trees differ."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        diffs = []
        for k in sorted(set(ours) | set(theirs), key=str):
            if k not in ours:
                diffs.append(f"{path}/{k}: missing in ours")
            elif k not in theirs:
                diffs.append(f"{path}/{k}: not in the reference")
            else:
                diffs.extend(differences(ours[k], theirs[k], f"{path}/{k}"))
        return diffs
    return [] if ours == theirs else [f"{path}: ours {ours!r} != reference {theirs!r}"]


def test_our_protos_match_smg_grpc_proto_0_4_28():
    ours = normalize(our_descriptor_set().file)
    theirs = normalize(reference_files())
    assert sorted(ours) == sorted(PACKAGES)
    diffs = differences(ours, theirs)
    assert not diffs, "wire contract differs:\n" + "\n".join(diffs)
    # The parts the gateway depends on are really there (guards against comparing two empties).
    svc = theirs["sglang.grpc.scheduler"]["services"]["SglangScheduler"]
    assert svc["Generate"][3] and not svc["Generate"][2]
    assert len(svc) == 15


def test_comparison_detects_a_changed_field_number():
    theirs = normalize(reference_files())
    changed = copy.deepcopy(theirs)
    fields = changed["sglang.grpc.scheduler"]["messages"]["SamplingParams"]["fields"]
    fields[99] = dict(fields.pop(8), number=99)  # max_new_tokens moved from 8 to 99
    diffs = differences(changed, theirs)
    assert any("SamplingParams/fields/8" in d for d in diffs), diffs
    streaming = copy.deepcopy(theirs)
    gen = streaming["sglang.grpc.scheduler"]["services"]["SglangScheduler"]
    gen["Generate"] = gen["Generate"][:3] + (False,)
    assert differences(streaming, theirs)
