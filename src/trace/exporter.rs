//! The OTLP/gRPC exporter: one control thread with a single-threaded tokio runtime (h2, the
//! HTTP/2 of gRPC, needs tokio; no shard ever touches it). Batches from the shards become
//! `TraceService/Export` calls on one HTTP/2 connection, reconnected with a backoff when the
//! collector goes away; batches that arrive while it is away are dropped, not queued
//! without bound.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use prost::Message;

use super::otlp::{
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, Resource, ResourceSpans, ScopeSpans, Span, Status,
};
use super::SpanRecord;

/// Batches in flight from the shards to the exporter.
const QUEUE: usize = 64;
const PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Starts the exporter thread; the shards send their batches on the returned channel.
pub fn start(endpoint: String) -> flume::Sender<Vec<SpanRecord>> {
    let (tx, rx) = flume::bounded::<Vec<SpanRecord>>(QUEUE);
    let spawned = std::thread::Builder::new().name("smg-otlp".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() {
            Ok(rt) => rt,
            Err(e) => {
                crate::error!("trace exporter: {e}");
                return;
            }
        };
        rt.block_on(run(endpoint, rx));
    });
    if let Err(e) = spawned {
        crate::error!("trace exporter: {e}");
    }
    tx
}

async fn run(endpoint: String, rx: flume::Receiver<Vec<SpanRecord>>) {
    let mut client: Option<h2::client::SendRequest<Bytes>> = None;
    let mut backoff = Duration::from_millis(100);
    while let Ok(batch) = rx.recv_async().await {
        if client.is_none() {
            match connect(&endpoint).await {
                Ok(c) => {
                    client = Some(c);
                    backoff = Duration::from_millis(100);
                }
                Err(e) => {
                    crate::debug!("trace exporter: {endpoint}: {e}; dropping {} spans", batch.len());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let body = grpc_frame(&request(&batch));
        if let Err(e) = export(client.as_mut().expect("connected"), &endpoint, body).await {
            crate::debug!("trace exporter: export failed: {e}; reconnecting");
            client = None;
        }
    }
}

async fn connect(endpoint: &str) -> Result<h2::client::SendRequest<Bytes>, String> {
    let tcp = tokio::net::TcpStream::connect(endpoint).await.map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let (send, conn) = h2::client::handshake(tcp).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

async fn export(client: &mut h2::client::SendRequest<Bytes>, endpoint: &str, body: Bytes) -> Result<(), String> {
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{endpoint}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let ready = client.clone().ready().await.map_err(|e| e.to_string())?;
    *client = ready;
    let (resp, mut stream) = client.send_request(req, false).map_err(|e| e.to_string())?;
    stream.send_data(body, true).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    if let Ok(Some(trailers)) = body.trailers().await {
        if let Some(code) = trailers.get("grpc-status").and_then(|v| v.to_str().ok()) {
            if code != "0" {
                return Err(format!("grpc-status {code}"));
            }
        }
    }
    Ok(())
}

/// gRPC's length-prefixed message: no compression, 4-byte big-endian length.
fn grpc_frame(msg: &ExportTraceServiceRequest) -> Bytes {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut out).expect("a Vec grows");
    Bytes::from(out)
}

fn request(batch: &[SpanRecord]) -> ExportTraceServiceRequest {
    let spans = batch
        .iter()
        .map(|s| {
            let start = s.start.duration_since(UNIX_EPOCH).unwrap_or_default();
            let mut attributes = vec![
                KeyValue::int("http.response.status_code", s.status as i64),
                KeyValue::str("smg.request_id", s.request_id.clone()),
            ];
            if !s.worker.is_empty() {
                attributes.push(KeyValue::str("smg.worker", s.worker.clone()));
            }
            if !s.model.is_empty() {
                attributes.push(KeyValue::str("gen_ai.request.model", s.model.clone()));
            }
            Span {
                trace_id: s.ids.trace_id.to_vec(),
                span_id: s.ids.span_id.to_vec(),
                trace_state: String::new(),
                parent_span_id: s.ids.parent.map(|p| p.to_vec()).unwrap_or_default(),
                name: s.name.clone(),
                kind: 2,
                start_time_unix_nano: start.as_nanos() as u64,
                end_time_unix_nano: (start + s.duration).as_nanos() as u64,
                attributes,
                status: Some(Status { message: String::new(), code: if s.status >= 500 { 2 } else { 0 } }),
                flags: s.ids.flags as u32,
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![KeyValue::str("service.name", "smg")] }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope { name: "smg".into(), version: env!("CARGO_PKG_VERSION").into() }),
                spans,
            }],
        }],
    }
}
