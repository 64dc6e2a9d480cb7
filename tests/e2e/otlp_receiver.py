#!/usr/bin/env python3
"""Minimal OTLP/gRPC trace receiver for e2e tests: serves TraceService/Export
on 127.0.0.1:PORT, appends one JSON line per span to FILE, prints "ready"
once listening, exits cleanly on SIGTERM/SIGINT. Needs grpcio and
opentelemetry-proto.  Usage: otlp_receiver.py --port PORT --out FILE
"""
import argparse
import json
import signal
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def any_value(v):
    kind = v.WhichOneof("value")  # string/int/bool/double map to themselves
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attrs(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def span_records(req):
    for rs in req.resource_spans:
        service = attrs(rs.resource.attributes).get("service.name")
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": int(s.kind),
                    "start_time_unix_nano": s.start_time_unix_nano,
                    "end_time_unix_nano": s.end_time_unix_nano,
                    "attributes": attrs(s.attributes),
                    "service_name": service,
                }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    out = open(args.out, "a", encoding="utf-8")
    lock = threading.Lock()

    def export(req, context):
        with lock:
            for rec in span_records(req):
                out.write(json.dumps(rec, sort_keys=True) + "\n")
                out.flush()
        return ts.ExportTraceServiceResponse()

    handler = grpc.unary_unary_rpc_method_handler(
        export,
        request_deserializer=ts.ExportTraceServiceRequest.FromString,
        response_serializer=ts.ExportTraceServiceResponse.SerializeToString,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {"Export": handler})])
    try:  # older grpcio returns 0 on failure, newer raises RuntimeError
        if not server.add_insecure_port(f"127.0.0.1:{args.port}"):
            raise RuntimeError("port 0 returned")
    except RuntimeError as e:
        sys.exit(f"otlp_receiver: cannot bind 127.0.0.1:{args.port}: {e}")
    server.start()

    print("ready", flush=True)
    stop.wait()
    server.stop(grace=1).wait()
    out.close()


if __name__ == "__main__":
    main()
