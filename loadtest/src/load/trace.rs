//! Trace replay: arrivals, prompt and output lengths (and Mooncake's shared prefixes) read from a
//! public trace file, built into a request pool whose send times the open loop follows.
//!
//! Two formats, told apart by their first non-blank byte:
//!
//! - Azure LLM inference trace CSV (github.com/Azure/AzurePublicDataset, 2023 and 2024):
//!   `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like `2023-11-16 18:15:46.6805900`
//!   (2023, 100 ns digits) or `2024-05-10 00:00:00.009930+00:00` (2024). Arrivals are offsets
//!   from the first row. No prefix information: every prompt is distinct text.
//! - Mooncake JSONL (github.com/kvcache-ai/Mooncake, FAST25-release/traces):
//!   `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}`, each hash id
//!   naming one 512-token block of the prompt. The same id always becomes the same text, so
//!   requests that share a hash-id prefix send the same prompt prefix and a prefix cache (the
//!   simulator's, or a real engine's) sees those tokens cached. An optional `session_id` (or
//!   `conversation_id`) is sent as the OpenAI `user` field.
//!
//! Prompts are sized for the simulator's token count (raw prompt JSON bytes ÷ bytes per token),
//! so smg-sim sees exactly the trace's prompt tokens; max_tokens is the trace's output length.

use std::sync::Arc;
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::load::scenario::{text, Scenario};
use crate::sim::render::put_json_str;

/// Tokens per Mooncake hash block.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Arrival, µs after the trace's first request.
    pub offset_us: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Mooncake prefix blocks (empty for Azure).
    pub hash_ids: Vec<u64>,
    pub conversation: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Trace {
    pub format: &'static str,
    pub entries: Vec<Entry>,
}

// === impl Trace ===

impl Trace {
    pub fn load(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("trace {path}: {e}"))?;
        Self::parse(&text).map_err(|e| format!("trace {path}: {e}"))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut t = if text.trim_start().starts_with('{') {
            Trace { format: "mooncake", entries: parse_mooncake(text)? }
        } else {
            Trace { format: "azure", entries: parse_azure(text)? }
        };
        if t.entries.is_empty() {
            return Err("no requests".into());
        }
        // Offsets from the earliest arrival; stable, so equal timestamps keep file order.
        t.entries.sort_by_key(|e| e.offset_us);
        let first = t.entries[0].offset_us;
        for e in &mut t.entries {
            e.offset_us -= first;
        }
        Ok(t)
    }

    /// Send offsets at `speedup` (2.0 replays twice as fast).
    pub fn schedule(&self, speedup: f64) -> Arc<Vec<Duration>> {
        let k = 1.0 / speedup.max(1e-9);
        Arc::new(self.entries.iter().map(|e| Duration::from_secs_f64(e.offset_us as f64 * 1e-6 * k)).collect())
    }

    /// Mean arrival rate in requests/s at `speedup`, for the report.
    pub fn rate(&self, speedup: f64) -> f64 {
        let span = self.entries.last().map_or(0, |e| e.offset_us) as f64 * 1e-6 / speedup.max(1e-9);
        if span > 0.0 {
            (self.entries.len() - 1) as f64 / span
        } else {
            0.0
        }
    }

    /// One request body per entry, in trace order, in the scenario's API, model and stream mode.
    pub fn bodies(&self, s: &Scenario, bytes_per_token: usize) -> Vec<Vec<u8>> {
        let bpt = bytes_per_token.max(1);
        self.entries.iter().enumerate().map(|(i, e)| body(s, i, e, bpt)).collect()
    }
}

/// The raw prompt JSON the simulator counts, minus the text itself.
fn prompt_overhead(api: &str) -> usize {
    match api {
        "chat" => CHAT_OPEN.len() + CHAT_CLOSE.len(),
        _ => 2,
    }
}

const CHAT_OPEN: &[u8] = b"[{\"role\":\"user\",\"content\":\"";
const CHAT_CLOSE: &[u8] = b"\"}]";

/// Prompt text of `len` bytes: hash blocks first (same id, same text), then text unique to request `i`.
fn prompt_text(e: &Entry, i: usize, len: usize, bpt: usize) -> String {
    let block_bytes = MOONCAKE_BLOCK_TOKENS * bpt;
    let mut out = String::with_capacity(len + block_bytes);
    for &h in &e.hash_ids {
        if out.len() >= len {
            break;
        }
        // Blocks join without separators, so each must be exactly block_bytes long.
        out.push_str(&text(block_bytes, h.wrapping_mul(0x9E37_79B9).wrapping_add(0x4D4F_4F4E)));
    }
    if out.len() < len {
        // Seeds past any hash id's, so the tail never repeats another request's blocks.
        out.push_str(&text(len - out.len(), (1u64 << 62) + i as u64));
    }
    out.truncate(len);
    out
}

fn body(s: &Scenario, i: usize, e: &Entry, bpt: usize) -> Vec<u8> {
    // ceil(bytes / bpt) == input_tokens exactly when bytes == input_tokens × bpt.
    let want = (e.input_tokens as usize).saturating_mul(bpt);
    let len = want.saturating_sub(prompt_overhead(&s.api));
    let prompt = prompt_text(e, i, len, bpt);
    let mut b = Vec::with_capacity(prompt.len() + 256);
    b.push(b'{');
    if s.api == "generate" {
        b.extend_from_slice(b"\"text\":");
        put_json_str(&mut b, &prompt);
        b.extend_from_slice(b",\"sampling_params\":{\"max_new_tokens\":");
        crate::wire::put_u64(&mut b, e.output_tokens);
        b.push(b'}');
    } else {
        b.extend_from_slice(b"\"model\":");
        let model = if s.models.is_empty() { &s.model } else { &s.models[i % s.models.len()] };
        put_json_str(&mut b, model);
        if s.api == "chat" {
            b.extend_from_slice(b",\"messages\":");
            b.extend_from_slice(CHAT_OPEN);
            b.extend_from_slice(prompt.as_bytes());
            b.extend_from_slice(CHAT_CLOSE);
        } else {
            b.extend_from_slice(b",\"prompt\":");
            put_json_str(&mut b, &prompt);
        }
        b.extend_from_slice(b",\"max_tokens\":");
        crate::wire::put_u64(&mut b, e.output_tokens);
        if let Some(c) = &e.conversation {
            b.extend_from_slice(b",\"user\":");
            put_json_str(&mut b, c);
        }
    }
    if s.stream {
        b.extend_from_slice(b",\"stream\":true");
        if s.include_usage && s.api != "generate" {
            b.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
        }
    }
    b.push(b'}');
    b
}

fn parse_mooncake(text: &str) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: sonic_rs::Value = sonic_rs::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64()).ok_or_else(|| format!("line {}: no number {k:?}", n + 1));
        let ts_ms = num("timestamp")?;
        let hash_ids = match v.get("hash_ids").and_then(|h| h.as_array()) {
            Some(a) => a
                .iter()
                .map(|x| x.as_u64().ok_or_else(|| format!("line {}: bad hash id", n + 1)))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let conversation = ["session_id", "conversation_id"].iter().find_map(|k| {
            let x = v.get(*k)?;
            x.as_str().map(str::to_string).or_else(|| x.as_u64().map(|n| n.to_string()))
        });
        out.push(Entry {
            offset_us: (ts_ms.max(0.0) * 1000.0).round() as u64,
            input_tokens: num("input_length")?.max(1.0) as u64,
            output_tokens: num("output_length")?.max(1.0) as u64,
            hash_ids,
            conversation,
        });
    }
    Ok(out)
}

fn parse_azure(text: &str) -> Result<Vec<Entry>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty file")?.split(',').map(str::trim).collect();
    let col = |name: &str| {
        header.iter().position(|h| h.eq_ignore_ascii_case(name)).ok_or_else(|| format!("no {name} column"))
    };
    let (ts, ctx, gen) = (col("TIMESTAMP")?, col("ContextTokens")?, col("GeneratedTokens")?);
    let mut out = Vec::new();
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |i: usize| f.get(i).copied().ok_or_else(|| format!("row {}: too few columns", n + 2));
        let int = |i: usize| field(i)?.parse::<u64>().map_err(|_| format!("row {}: bad token count", n + 2));
        out.push(Entry {
            offset_us: parse_datetime_us(field(ts)?).ok_or_else(|| format!("row {}: bad TIMESTAMP", n + 2))?,
            input_tokens: int(ctx)?.max(1),
            output_tokens: int(gen)?.max(1),
            hash_ids: Vec::new(),
            conversation: None,
        });
    }
    Ok(out)
}

/// "YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM|Z]" (or a 'T' between) as µs since the Unix epoch.
pub fn parse_datetime_us(s: &str) -> Option<u64> {
    let s = s.trim().trim_matches('"');
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    // Split off a zone: "+00:00", "-05:00" or "Z".
    let (time, zone_s) = match time.find(['+', '-', 'Z']) {
        Some(i) => {
            let z = &time[i..];
            let off = if z == "Z" {
                0
            } else {
                let sign = if z.starts_with('-') { -1 } else { 1 };
                let (h, m) = z[1..].split_once(':').unwrap_or((&z[1..], "0"));
                sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
            };
            (&time[..i], off)
        }
        None => (time, 0),
    };
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    // Up to 7 fraction digits (100 ns) in the 2023 trace; keep µs.
    let mut us = 0i64;
    for (k, c) in frac.bytes().take(6).enumerate() {
        if !c.is_ascii_digit() {
            return None;
        }
        us += (c - b'0') as i64 * 10i64.pow(5 - k as u32);
    }
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se - zone_s;
    u64::try_from(secs * 1_000_000 + us).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::prefix_cache::PrefixCache;
    use crate::sim::request::{self, Api};

    #[test]
    fn azure_timestamps() {
        assert_eq!(parse_datetime_us("1970-01-01 00:00:01.5"), Some(1_500_000));
        let a = parse_datetime_us("2023-11-16 18:15:46.6805900").unwrap();
        let b = parse_datetime_us("2023-11-16 18:15:50.9951690").unwrap();
        assert_eq!(b - a, 4_314_579);
        assert_eq!(a / 1_000_000, 1_700_158_546);
        let z = parse_datetime_us("2024-05-10 00:00:00.009930+00:00").unwrap();
        assert_eq!(z % 1_000_000, 9_930);
        assert_eq!(parse_datetime_us("2024-05-10T02:00:00+02:00"), parse_datetime_us("2024-05-10 00:00:00"));
        assert_eq!(parse_datetime_us("nope"), None);
    }

    #[test]
    fn both_formats_parse() {
        let az = Trace::parse(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:46.7805900,396,109\n",
        )
        .unwrap();
        assert_eq!(az.format, "azure");
        assert_eq!(az.entries[1].offset_us, 100_000);
        assert_eq!((az.entries[1].input_tokens, az.entries[1].output_tokens), (396, 109));
        let mc = Trace::parse(
            "{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [0, 1]}\n{\"timestamp\": 27, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [0, 2], \"session_id\": 7}\n",
        )
        .unwrap();
        assert_eq!(mc.format, "mooncake");
        assert_eq!(mc.entries[1].offset_us, 22_000);
        assert_eq!(mc.entries[1].conversation.as_deref(), Some("7"));
        assert_eq!(mc.schedule(2.0)[1], Duration::from_millis(11));
    }

    #[test]
    fn bodies_carry_exact_lengths_and_shared_prefixes() {
        let mc = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 7, \"hash_ids\": [4, 5, 6]}\n{\"timestamp\": 1, \"input_length\": 1500, \"output_length\": 9, \"hash_ids\": [4, 5, 8]}\n",
        )
        .unwrap();
        for api in ["chat", "completions"] {
            let s = Scenario { api: api.into(), ..Scenario::default() };
            let bodies = mc.bodies(&s, 4);
            let a = if api == "chat" { Api::Chat } else { Api::Completions };
            let mut cache = PrefixCache::new(1 << 20, 16, 4);
            let r0 = request::parse(a, &bodies[0]).unwrap();
            assert_eq!(r0.max_tokens, Some(7));
            assert_eq!(cache.lookup_insert(r0.prompt.as_bytes()).prompt_tokens, 1100);
            let r1 = request::parse(a, &bodies[1]).unwrap();
            let hit = cache.lookup_insert(r1.prompt.as_bytes());
            assert_eq!(hit.prompt_tokens, 1500);
            // Two shared 512-token blocks, less the part of a 16-token block the overhead shifts.
            assert!((1008..=1024).contains(&hit.cached_tokens), "{api}: {hit:?}");
        }
    }
}
