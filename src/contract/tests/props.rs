//! Randomized properties (seeded fastrand): untouched bodies are forwarded
//! byte for byte, and rewritten bodies differ only by the intended edits.

use sonic_rs::{JsonContainerTrait, JsonValueMutTrait, JsonValueTrait};

use super::super::{apply, inspect, json, Aliases, Endpoint};

/// The gateway's RNG with the draws these properties use.
struct Rng(fastrand::Rng);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    fn coin(&mut self) -> bool {
        self.0.bool()
    }
}

const WS: [&str; 5] = ["", " ", "\n  ", "\t", "  "];

/// A JSON string literal with a mix of plain text, escapes and non-ASCII.
fn text(r: &mut Rng) -> String {
    let pieces = ["hi", "Paris", " ", "\\n", "\\\"", "\\u00e9", "é", "日本", "\\ud83d\\ude00", "0.95", "{}", "\\\\"];
    let mut s = String::from("\"");
    for _ in 0..r.below(6) + 1 {
        s.push_str(r.pick(&pieces));
    }
    s.push('"');
    s
}

fn messages(r: &mut Rng) -> String {
    let n = r.below(4) + 1;
    let items: Vec<String> = (0..n)
        .map(|i| {
            let role = if i + 1 == n { "user" } else { r.pick(&["system", "user", "assistant"]) };
            let content = if r.coin() {
                text(r)
            } else {
                format!(
                    r#"[{{"type":"text","text":{}}},{{"type":"image_url","image_url":{{"url":"u","detail":"low"}}}}]"#,
                    text(r)
                )
            };
            format!(r#"{{"role":"{role}",{}"content":{content}}}"#, r.pick(&WS))
        })
        .collect();
    format!("[{}]", items.join(&format!(",{}", r.pick(&WS))))
}

/// Members valid for every profile used below (K3's pinned values included).
fn members(r: &mut Rng, model: &str) -> Vec<(String, String)> {
    let mut m = vec![("model".to_string(), format!("\"{model}\"")), ("messages".to_string(), messages(r))];
    let optional: [(&str, &[&str]); 10] = [
        ("temperature", &["0.6", "6e-1", "0.60", "1", "1.0", "1e0", "0", "0.0", "-0"]),
        ("top_p", &["0.95", "9.5e-1", "0.950", "95E-2"]),
        ("n", &["1"]),
        ("presence_penalty", &["0", "0.0", "0e5"]),
        ("frequency_penalty", &["0", "-0.0"]),
        ("max_tokens", &["1", "256", "4096", "100000"]),
        ("seed", &["-9223372036854775808", "42", "0"]),
        ("logit_bias", &[r#"{"50256": -100, "11": 2.5e0}"#, "{}"]),
        ("metadata", &[r#"{"w": 1.50, "z": [1e2, -0.0, 3]}"#, "null"]),
        ("stream", &["false", "true"]),
    ];
    for (key, values) in optional {
        if r.coin() {
            m.push((key.to_string(), r.pick(values).to_string()));
        }
    }
    if m.iter().any(|(k, v)| k == "stream" && v == "true") && r.coin() {
        m.push((
            "stream_options".into(),
            r.pick(&[r#"{"include_usage":false}"#, r#"{"step_usage_chunks": 2}"#]).into(),
        ));
    }
    // Shuffle: callers' key order must survive.
    for i in (1..m.len()).rev() {
        let j = r.below(i + 1);
        m.swap(i, j);
    }
    m
}

fn render(r: &mut Rng, members: &[(String, String)]) -> String {
    let mut s = format!("{}{{", r.pick(&WS));
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            s.push_str(&format!("{},{}", r.pick(&WS), r.pick(&WS)));
        }
        s.push_str(&format!("\"{k}\"{}:{}{v}", r.pick(&WS), r.pick(&WS)));
    }
    s.push_str(&format!("{}}}{}", r.pick(&WS), r.pick(&WS)));
    s
}

/// Every number token, as spelled, in document order.
fn numbers(body: &[u8]) -> Vec<Vec<u8>> {
    let doc = json::parse(body).expect("valid");
    (0..doc.nodes.len()).filter(|&i| doc.kind(i) == json::Kind::Number).map(|i| doc.raw(i).to_vec()).collect()
}

#[test]
fn bodies_needing_no_rewrite_are_forwarded_byte_for_byte() {
    let mut r = Rng(fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15));
    for _ in 0..2000 {
        let m = members(&mut r, "meta-llama/Llama-3.1-8B-Instruct");
        let body = render(&mut r, &m);
        let insp = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &Aliases::default())
            .unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(insp.edits.is_empty(), "{body}");
        assert_eq!(apply(body.as_bytes(), &insp.edits), body.as_bytes());
        assert!(sonic_rs::from_str::<sonic_rs::Value>(&body).is_ok(), "generator made invalid JSON: {body}");
    }
}

#[test]
fn rewrites_add_exactly_the_intended_edits() {
    let aliases = Aliases::parse(&["kimi-k3=moonshotai/Kimi-K3-Canonical"]).unwrap();
    let mut r = Rng(fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d));
    for _ in 0..2000 {
        let m = members(&mut r, "kimi-k3");
        let body = render(&mut r, &m);
        let insp = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &aliases)
            .unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(insp.model, "moonshotai/Kimi-K3-Canonical");
        let out = apply(body.as_bytes(), &insp.edits);

        // Expected: the original value, with the canonical model and the K3 / Kimi defaults.
        let mut want: sonic_rs::Value = sonic_rs::from_slice(body.as_bytes()).unwrap();
        let obj = want.as_object_mut().unwrap();
        obj.insert("model", sonic_rs::json!("moonshotai/Kimi-K3-Canonical"));
        for (k, v) in [("temperature", sonic_rs::json!(1.0)), ("top_p", sonic_rs::json!(0.95))].into_iter().chain([
            ("presence_penalty", sonic_rs::json!(0)),
            ("frequency_penalty", sonic_rs::json!(0)),
            ("n", sonic_rs::json!(1)),
        ]) {
            if obj.get(&k).is_none_or(|x| x.is_null()) {
                obj.insert(k, v);
            }
        }
        if obj.get(&"stream").and_then(|s| s.as_bool()) == Some(true) {
            match obj.get_mut(&"stream_options") {
                Some(so) if so.is_object() => {
                    let so = so.as_object_mut().unwrap();
                    if so.get(&"include_usage").is_none() {
                        so.insert("include_usage", sonic_rs::json!(true));
                    }
                }
                _ => {
                    obj.insert("stream_options", sonic_rs::json!({"include_usage": true}));
                }
            }
        }
        let got: sonic_rs::Value =
            sonic_rs::from_slice(&out).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&out)));
        assert_eq!(sorted(&got), sorted(&want), "{body}\n{}", String::from_utf8_lossy(&out));

        // Every original number token survives, spelled as sent and in order; new ones follow.
        let before = numbers(body.as_bytes());
        let after = numbers(&out);
        assert_eq!(&after[..before.len()], &before[..], "{body}");
        // Bytes outside the splices are untouched.
        let mut at = 0;
        for s in &insp.edits {
            assert!(s.start >= at);
            at = s.end;
        }
    }
}

/// A canonical rendering with object keys sorted, for order-insensitive comparison.
fn sorted(v: &sonic_rs::Value) -> String {
    if let Some(obj) = v.as_object() {
        let mut items: Vec<(String, String)> = obj.iter().map(|(k, v)| (k.to_string(), sorted(v))).collect();
        items.sort();
        let inner: Vec<String> = items.into_iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
        return format!("{{{}}}", inner.join(","));
    }
    if let Some(arr) = v.as_array() {
        return format!("[{}]", arr.iter().map(sorted).collect::<Vec<_>>().join(","));
    }
    if let Some(f) = v.as_f64() {
        return format!("{f}");
    }
    sonic_rs::to_string(v).unwrap()
}
