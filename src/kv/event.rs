//! KV-cache events in one shape, whichever engine and transport sent them.
//!
//! vLLM's ZMQ publisher (and SGLang's, which copies it) sends msgpack: a batch is
//! `[timestamp, [event, …], data_parallel_rank or nil]`, and each event is either a
//! positional array tagged by its first element or a map with a `"type"` key and the same
//! fields by name (engines moved from one to the other in 2026):
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, …]` (later fields are ignored: SGLang and newer vLLM send up to 12);
//! - `["BlockRemoved", block_hashes, medium]`;
//! - `["AllBlocksCleared"]`.
//!
//! A block hash is an integer (up to u64, above i64's range too) or bytes (a 32-byte
//! digest), reduced to its last 8 bytes read big-endian: the reduction SMG's gRPC bridge
//! makes for the proto's int64, so a worker's blocks have the same hashes over both
//! transports. SGLang's gRPC `KvEventBatch` carries the same events as protobuf ([`from_proto`]).

use rmpv::Value;
use smg_proto::common::{kv_cache_event::Data, KvCacheTier, KvEventBatch};

/// An engine's name for a block (see the module doc for the reduction to 64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Consecutive blocks stored, each `block_size` of `tokens`, the first after `parent`
    /// (None: at the start of a sequence).
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        tokens: Vec<u32>,
        block_size: u32,
        /// The LoRA namespace the blocks belong to (0: the base model).
        namespace: u64,
        /// On the GPU (the medium named none, or the GPU): only these serve a hit.
        gpu: bool,
    },
    Removed {
        hashes: Vec<EngineHash>,
        gpu: bool,
    },
    Cleared,
}

/// A batch of events, as published.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub events: Vec<KvEvent>,
    pub dp_rank: Option<u32>,
}

/// Why a payload was not understood (the batch is skipped; the sequence numbers still count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPayload(pub String);

fn bad(what: impl Into<String>) -> BadPayload {
    BadPayload(what.into())
}

/// A vLLM msgpack payload (the third frame of a ZMQ message).
pub fn from_msgpack(mut payload: &[u8]) -> Result<Batch, BadPayload> {
    let v = rmpv::decode::read_value(&mut payload).map_err(|e| bad(format!("not msgpack: {e}")))?;
    let (events, rank) = match &v {
        Value::Array(a) if a.len() >= 2 => (&a[1], a.get(2)),
        Value::Map(m) => {
            (field(m, "events").ok_or_else(|| bad("a batch without events"))?, field(m, "data_parallel_rank"))
        }
        _ => return Err(bad("a batch is [timestamp, events, data_parallel_rank]")),
    };
    let Value::Array(list) = events else { return Err(bad("events is not an array")) };
    let events = list.iter().map(event).collect::<Result<Vec<_>, _>>()?;
    let dp_rank = rank.and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok());
    Ok(Batch { events, dp_rank })
}

fn field<'a>(m: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    m.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v)
}

/// An event's fields: by position after its type, or by name.
enum Fields<'a> {
    Positional(&'a [Value]),
    Named(&'a [(Value, Value)]),
}

static NIL: Value = Value::Nil;

impl<'a> Fields<'a> {
    /// Field `i` (after the type) or `name`; nil when missing.
    fn get(&self, i: usize, name: &str) -> &'a Value {
        match self {
            Fields::Positional(a) => a.get(i + 1).unwrap_or(&NIL),
            Fields::Named(m) => field(m, name).unwrap_or(&NIL),
        }
    }
}

/// One event, positional or by name; missing trailing fields are nil.
fn event(v: &Value) -> Result<KvEvent, BadPayload> {
    const STORED: [&str; 7] =
        ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"];
    const REMOVED: [&str; 2] = ["block_hashes", "medium"];
    let (kind, fields) = match v {
        Value::Array(a) => (a.first().and_then(Value::as_str), Fields::Positional(a)),
        Value::Map(m) => (field(m, "type").and_then(Value::as_str), Fields::Named(m)),
        _ => return Err(bad("an event is an array or a map")),
    };
    let kind = kind.ok_or_else(|| bad("an event without its type"))?;
    let at = |i: usize, name: &str| fields.get(i, name);
    match kind {
        "BlockStored" => {
            let get = |i: usize| at(i, STORED[i]);
            let block_size =
                get(3).as_u64().filter(|&n| n > 0 && n <= u32::MAX as u64).ok_or_else(|| bad("block_size"))?;
            let tokens = match get(2) {
                Value::Array(t) => t
                    .iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| bad("token_ids"))?,
                _ => return Err(bad("token_ids")),
            };
            let lora_name = get(6).as_str();
            Ok(KvEvent::Stored {
                hashes: hashes(get(0))?,
                parent: match get(1) {
                    Value::Nil => None,
                    h => Some(hash(h)?),
                },
                tokens,
                block_size: block_size as u32,
                namespace: namespace(get(4).as_i64().or_else(|| get(4).as_u64().map(|u| u as i64)), lora_name),
                gpu: on_gpu(get(5).as_str()),
            })
        }
        "BlockRemoved" => {
            let get = |i: usize| at(i, REMOVED[i]);
            Ok(KvEvent::Removed { hashes: hashes(get(0))?, gpu: on_gpu(get(1).as_str()) })
        }
        "AllBlocksCleared" => Ok(KvEvent::Cleared),
        other => Err(bad(format!("unknown event {other}"))),
    }
}

fn hashes(v: &Value) -> Result<Vec<EngineHash>, BadPayload> {
    match v {
        Value::Array(a) => a.iter().map(hash).collect(),
        _ => Err(bad("block_hashes is not an array")),
    }
}

/// An integer (signed or not) or bytes, reduced to 64 bits (module doc).
fn hash(v: &Value) -> Result<EngineHash, BadPayload> {
    match v {
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(EngineHash(u)),
            (None, Some(s)) => Ok(EngineHash(s as u64)),
            _ => Err(bad("a block hash out of range")),
        },
        Value::Binary(b) => Ok(EngineHash(last_eight(b))),
        _ => Err(bad("a block hash is an integer or bytes")),
    }
}

fn last_eight(b: &[u8]) -> u64 {
    let tail = &b[b.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

/// A medium counts as the GPU when none is named or it names the GPU (vLLM's "GPU"; the
/// proto's device tier).
fn on_gpu(medium: Option<&str>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu") || m.eq_ignore_ascii_case("device"))
}

/// The namespace of blocks stored under a LoRA (by id or by name); 0 for the base model.
pub fn namespace(lora_id: Option<i64>, lora_name: Option<&str>) -> u64 {
    let tagged = |tag: u8, bytes: &[u8]| {
        let mut k = Vec::with_capacity(bytes.len() + 1);
        k.push(tag);
        k.extend_from_slice(bytes);
        // Never 0: that is the base model's.
        xxhash_rust::xxh3::xxh3_64(&k).max(1)
    };
    match (lora_name.filter(|n| !n.is_empty()), lora_id) {
        (Some(name), _) => tagged(b'n', name.as_bytes()),
        (None, Some(id)) => tagged(b'i', &id.to_be_bytes()),
        (None, None) => 0,
    }
}

/// SGLang's gRPC batch. Each proto block carries its own tokens and size; consecutive blocks
/// of one size become one event, as a vLLM BlockStored is.
pub fn from_proto(b: &KvEventBatch) -> Batch {
    let mut events = Vec::with_capacity(b.events.len());
    for e in &b.events {
        match &e.data {
            Some(Data::Stored(s)) => {
                let tier_gpu = match s.tier.and_then(|t| KvCacheTier::try_from(t).ok()) {
                    None | Some(KvCacheTier::Unspecified) => None,
                    Some(t) => Some(t == KvCacheTier::Device),
                };
                let gpu = tier_gpu.unwrap_or_else(|| on_gpu(s.medium.as_deref()));
                let mut parent = s.parent_block_hash.map(|h| EngineHash(h as u64));
                let lora_name = s.lora_name.as_deref();
                let mut run: Option<KvEvent> = None;
                for block in &s.blocks {
                    // The older tier encoding on a block: 0 is the device.
                    let gpu = block.cache_level.map_or(gpu, |l| l == 0);
                    let namespace = namespace(block.lora_id, lora_name);
                    let size = block.block_size.max(0) as u32;
                    let h = EngineHash(block.block_hash as u64);
                    match &mut run {
                        Some(KvEvent::Stored { hashes, tokens, block_size, namespace: ns, gpu: g, .. })
                            if *block_size == size && *ns == namespace && *g == gpu =>
                        {
                            hashes.push(h);
                            tokens.extend_from_slice(&block.token_ids);
                        }
                        _ => {
                            if let Some(done) = run.take() {
                                events.push(done);
                            }
                            run = Some(KvEvent::Stored {
                                hashes: vec![h],
                                parent,
                                tokens: block.token_ids.clone(),
                                block_size: size,
                                namespace,
                                gpu,
                            });
                        }
                    }
                    parent = Some(h);
                }
                events.extend(run);
            }
            Some(Data::Removed(r)) => {
                let gpu = match r.tier.and_then(|t| KvCacheTier::try_from(t).ok()) {
                    None | Some(KvCacheTier::Unspecified) => {
                        r.cache_level.map_or_else(|| on_gpu(r.medium.as_deref()), |l| l == 0)
                    }
                    Some(t) => t == KvCacheTier::Device,
                };
                events.push(KvEvent::Removed {
                    hashes: r.block_hashes.iter().map(|&h| EngineHash(h as u64)).collect(),
                    gpu,
                });
            }
            Some(Data::Cleared(_)) => events.push(KvEvent::Cleared),
            None => {}
        }
    }
    Batch { events, dp_rank: b.dp_rank.and_then(|r| u32::try_from(r).ok()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn ints(xs: &[u64]) -> Value {
        Value::Array(xs.iter().map(|&x| Value::from(x)).collect())
    }

    #[test]
    fn positional_and_named_events_decode_alike() {
        let positional = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    s("BlockStored"),
                    ints(&[u64::MAX, 7]),
                    Value::from(3u64),
                    ints(&[1, 2, 3, 4]),
                    Value::from(2u64),
                    Value::Nil,
                    s("GPU"),
                ]),
                Value::Array(vec![s("BlockRemoved"), ints(&[7]), s("CPU")]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
            Value::from(1u64),
        ]);
        let named = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Map(vec![
                    (s("type"), s("BlockStored")),
                    (s("block_hashes"), ints(&[u64::MAX, 7])),
                    (s("parent_block_hash"), Value::from(3u64)),
                    (s("token_ids"), ints(&[1, 2, 3, 4])),
                    (s("block_size"), Value::from(2u64)),
                    (s("medium"), s("GPU")),
                ]),
                Value::Map(vec![
                    (s("type"), s("BlockRemoved")),
                    (s("block_hashes"), ints(&[7])),
                    (s("medium"), s("CPU")),
                ]),
                Value::Map(vec![(s("type"), s("AllBlocksCleared"))]),
            ]),
            Value::from(1u64),
        ]);
        let want = Batch {
            events: vec![
                KvEvent::Stored {
                    hashes: vec![EngineHash(u64::MAX), EngineHash(7)],
                    parent: Some(EngineHash(3)),
                    tokens: vec![1, 2, 3, 4],
                    block_size: 2,
                    namespace: 0,
                    gpu: true,
                },
                KvEvent::Removed { hashes: vec![EngineHash(7)], gpu: false },
                KvEvent::Cleared,
            ],
            dp_rank: Some(1),
        };
        assert_eq!(from_msgpack(&pack(&positional)).unwrap(), want);
        assert_eq!(from_msgpack(&pack(&named)).unwrap(), want);
    }

    #[test]
    fn long_arrays_bytes_hashes_negative_ints_and_lora() {
        let digest: Vec<u8> = (0u8..32).collect();
        let mut stored = vec![
            s("BlockStored"),
            Value::Array(vec![Value::Binary(digest.clone()), Value::from(-2i64)]),
            Value::Nil,
            ints(&[5, 6]),
            Value::from(1u64),
            Value::from(4u64),
            Value::Nil,
            s("adapter-a"),
        ];
        // SGLang's and newer vLLM's trailing fields.
        stored.extend([Value::Nil, Value::Nil, Value::from(0u64), Value::Boolean(false)]);
        assert_eq!(stored.len(), 12);
        let batch = Value::Array(vec![Value::F64(0.0), Value::Array(vec![Value::Array(stored)]), Value::Nil]);
        let b = from_msgpack(&pack(&batch)).unwrap();
        let KvEvent::Stored { hashes, parent, namespace: ns, gpu, .. } = &b.events[0] else { panic!() };
        assert_eq!(hashes, &[EngineHash(0x18191a1b1c1d1e1f), EngineHash(-2i64 as u64)]);
        assert_eq!((parent, *gpu, b.dp_rank), (&None, true, None));
        assert_eq!(*ns, namespace(Some(4), Some("adapter-a")));
        assert_ne!(*ns, 0, "a LoRA's blocks are not the base model's");
        assert_ne!(namespace(Some(4), None), 0);
    }

    #[test]
    fn bad_payloads_are_refused_not_panicked_on() {
        for p in [&b""[..], b"\xc1", &pack(&Value::from(3u64)), &pack(&Value::Array(vec![Value::Nil, s("x")]))] {
            assert!(from_msgpack(p).is_err());
        }
        let unknown = Value::Array(vec![Value::Nil, Value::Array(vec![Value::Array(vec![s("Nope")])])]);
        assert!(from_msgpack(&pack(&unknown)).is_err());
        let zero = Value::Array(vec![
            Value::Nil,
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"),
                ints(&[1]),
                Value::Nil,
                ints(&[1]),
                Value::from(0u64),
            ])]),
        ]);
        assert!(from_msgpack(&pack(&zero)).is_err(), "a zero block size");
    }

    #[test]
    fn proto_batches_group_blocks_into_runs() {
        use smg_proto::common::{KvBlock, KvBlocksStored, KvCacheEvent};
        let block = |h: i64, t: Vec<u32>| KvBlock { block_hash: h, token_ids: t, block_size: 2, ..Default::default() };
        let b = KvEventBatch {
            sequence_number: 4,
            dp_rank: Some(2),
            events: vec![KvCacheEvent {
                event_id: 1,
                data: Some(Data::Stored(KvBlocksStored {
                    blocks: vec![block(-1, vec![1, 2]), block(9, vec![3, 4])],
                    parent_block_hash: Some(5),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let got = from_proto(&b);
        assert_eq!(got.dp_rank, Some(2));
        assert_eq!(
            got.events,
            [KvEvent::Stored {
                hashes: vec![EngineHash(u64::MAX), EngineHash(9)],
                parent: Some(EngineHash(5)),
                tokens: vec![1, 2, 3, 4],
                block_size: 2,
                namespace: 0,
                gpu: true,
            }]
        );
    }
}
