//! Scenario files (JSON in loadtest/scenarios/): what requests to send, built once into a pool of ready-to-write request bytes.
//!
//! Single-turn scenarios cycle `variants` distinct bodies. Multi-turn scenarios model `users`
//! conversations of `turns` turns that share one system prompt: turn t of a user resends the
//! whole history, so its prefix is what the previous turn left in some worker's cache. The pool
//! is ordered turn by turn (all users' turn 1, then turn 2, …) and repeats for `sessions`
//! fresh conversations.
//!
//! Responses scenarios (`api: "responses"`) send `POST /v1/responses` turns, `input` a user
//! message of `user_bytes` (so `responses-1k` carries `chat-1k`'s text) and `store` as given.
//! With `turns` > 1 they are stateful: the server holds the history, so a turn sends only its
//! new input and chains off the previous turn's answer by `previous_response_id`, which only
//! the answer tells. Those turns cannot be built ahead: `bodies()` gives every conversation's
//! turns unchained (conversation by conversation, `sessions` of them), and a [`Chain`] hands
//! each load thread's virtual users their next turn, with the id their last answer carried
//! (load/chain.rs).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

use crate::load::chain::Chain;
use crate::load::client::build_request;
use crate::rng::Rng;
use crate::sim::render::put_json_str;

#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// "chat", "completions", "generate" (SGLang native), "decisions" (three questions, one
    /// of each type, over `user_bytes` of evidence; never streamed) or "responses" (the
    /// OpenAI Responses API; with `turns` > 1, turns chained by `previous_response_id`).
    pub api: String,
    /// Overrides the endpoint path of `api`.
    pub path: Option<String>,
    pub model: String,
    /// Mixed-model scenarios: requests rotate through these (overrides `model`).
    pub models: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: u64,
    /// Approximate bytes of each user message.
    pub user_bytes: usize,
    /// Shared system prompt bytes (0: none).
    pub system_prompt_bytes: usize,
    /// Assistant reply bytes replayed in multi-turn history.
    pub assistant_bytes: usize,
    pub users: usize,
    pub turns: usize,
    pub sessions: usize,
    /// Distinct single-turn bodies to cycle.
    pub variants: usize,
    /// "model_first" (Python SDK order) or "messages_first" (Node SDK keeps caller order).
    pub key_order: String,
    /// Chat requests offer the `get_weather` tool that `smg-sim --tool-call-markup` calls, so
    /// a gateway's tool-call parser has work.
    pub tools: bool,
    /// Responses turns ask to be stored (`store`), as a chained turn's previous one must be.
    pub store: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            name: "custom".into(),
            description: String::new(),
            api: "chat".into(),
            path: None,
            model: "sim-model".into(),
            models: Vec::new(),
            stream: false,
            include_usage: true,
            max_tokens: 16,
            user_bytes: 1200,
            system_prompt_bytes: 0,
            assistant_bytes: 200,
            users: 1,
            turns: 1,
            sessions: 1,
            variants: 64,
            key_order: "model_first".into(),
            tools: false,
            store: true,
        }
    }
}

/// Where scenario names resolve: ./NAME, loadtest/scenarios/NAME.json, then the crate's own folder.
pub fn resolve_path(name: &str) -> Option<PathBuf> {
    let direct = PathBuf::from(name);
    if direct.is_file() {
        return Some(direct);
    }
    let candidates = [
        PathBuf::from("loadtest/scenarios").join(format!("{name}.json")),
        PathBuf::from("scenarios").join(format!("{name}.json")),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.json")),
    ];
    candidates.into_iter().find(|p| p.is_file())
}

// === impl Scenario ===

impl Scenario {
    pub fn load(name: &str) -> Result<Self, String> {
        let path = resolve_path(name).ok_or_else(|| format!("scenario {name:?} not found"))?;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let s: Scenario = sonic_rs::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), String> {
        if !matches!(self.api.as_str(), "chat" | "completions" | "generate" | "decisions" | "responses") {
            return Err(format!("unknown api {:?}", self.api));
        }
        if self.api == "responses" {
            // A chained conversation's history is the server's: no system prompt or replayed
            // turns to send, and its virtual users are the load's connections, not `users`.
            if self.users > 1 || self.system_prompt_bytes > 0 || self.tools {
                return Err("api \"responses\": users, system_prompt_bytes and tools are not used".into());
            }
            if self.chained() && self.stream {
                return Err("api \"responses\": chained turns (turns > 1) are not streamed".into());
            }
            if self.chained() && !self.store {
                return Err("api \"responses\": chained turns (turns > 1) need store: true".into());
            }
        }
        if self.users == 0 || self.turns == 0 || self.sessions == 0 || self.variants == 0 {
            return Err("users, turns, sessions and variants must be at least 1".into());
        }
        if !matches!(self.key_order.as_str(), "model_first" | "messages_first") {
            return Err(format!("unknown key_order {:?}", self.key_order));
        }
        Ok(())
    }

    pub fn path(&self) -> &str {
        if let Some(p) = &self.path {
            return p;
        }
        match self.api.as_str() {
            "completions" => "/v1/completions",
            "generate" => "/generate",
            "decisions" => "/v1/decisions",
            "responses" => "/v1/responses",
            _ => "/v1/chat/completions",
        }
    }

    /// Every model the requests name: the workers a fleet must serve.
    pub fn model_names(&self) -> Vec<String> {
        if self.models.is_empty() {
            vec![self.model.clone()]
        } else {
            self.models.clone()
        }
    }

    fn model_for(&self, i: usize) -> &str {
        if self.models.is_empty() {
            &self.model
        } else {
            &self.models[i % self.models.len()]
        }
    }

    /// Whether turns chain off the previous answer (a Responses scenario of several turns):
    /// the requests are then built as they go, by a [`Chain`].
    pub fn chained(&self) -> bool {
        self.api == "responses" && self.turns > 1
    }

    /// All request bodies, in send order (a chained scenario's: every conversation's turns,
    /// unchained, conversation by conversation).
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        if self.chained() {
            let mut out = Vec::with_capacity(self.sessions * self.turns);
            for s in 0..self.sessions {
                for t in 0..self.turns {
                    let user = text(self.user_bytes, (s * self.turns + t) as u64 + 1_000);
                    out.push(self.body(s, None, &[], &user));
                }
            }
            return out;
        }
        let multi = self.turns > 1 || self.users > 1 || self.system_prompt_bytes > 0;
        let mut out = Vec::new();
        if !multi {
            for v in 0..self.variants {
                let user = text(self.user_bytes, 1 + v as u64);
                out.push(self.body(v, None, &[], &user));
            }
            return out;
        }
        let system = text(self.system_prompt_bytes, 0xC0FFEE);
        let mut n = 0;
        for s in 0..self.sessions {
            // histories[u] holds (user, assistant) pairs so far.
            let mut histories: Vec<Vec<(String, String)>> = vec![Vec::new(); self.users];
            for t in 0..self.turns {
                for (u, history) in histories.iter_mut().enumerate() {
                    let seed = ((s * self.users + u) * self.turns + t) as u64 + 1_000;
                    let user = text(self.user_bytes, seed);
                    let sys = (self.system_prompt_bytes > 0).then_some(system.as_str());
                    out.push(self.body(n, sys, history, &user));
                    n += 1;
                    history.push((user, text(self.assistant_bytes, seed ^ 0xA5A5)));
                }
            }
        }
        out
    }

    fn body(&self, i: usize, system: Option<&str>, history: &[(String, String)], user: &str) -> Vec<u8> {
        if self.api == "decisions" {
            return self.decisions_body(i, user);
        }
        let mut b = Vec::with_capacity(256 + user.len() + system.map_or(0, str::len));
        let mut prompt = Vec::with_capacity(b.capacity());
        match self.api.as_str() {
            "chat" => {
                prompt.push(b'[');
                if let Some(sys) = system {
                    prompt.extend_from_slice(b"{\"role\":\"system\",\"content\":");
                    put_json_str(&mut prompt, sys);
                    prompt.extend_from_slice(b"},");
                }
                for (u, a) in history {
                    prompt.extend_from_slice(b"{\"role\":\"user\",\"content\":");
                    put_json_str(&mut prompt, u);
                    prompt.extend_from_slice(b"},{\"role\":\"assistant\",\"content\":");
                    put_json_str(&mut prompt, a);
                    prompt.extend_from_slice(b"},");
                }
                prompt.extend_from_slice(b"{\"role\":\"user\",\"content\":");
                put_json_str(&mut prompt, user);
                prompt.extend_from_slice(b"}]");
            }
            _ => {
                let mut all = String::new();
                if let Some(sys) = system {
                    all.push_str(sys);
                }
                for (u, a) in history {
                    all.push_str(u);
                    all.push_str(a);
                }
                all.push_str(user);
                put_json_str(&mut prompt, &all);
            }
        }
        let prompt_key: &[u8] = match self.api.as_str() {
            "chat" => b"\"messages\":",
            "completions" => b"\"prompt\":",
            "responses" => b"\"input\":",
            _ => b"\"text\":",
        };
        let mut params = Vec::new();
        if self.api == "generate" {
            params.extend_from_slice(b"\"sampling_params\":{\"max_new_tokens\":");
            crate::wire::put_u64(&mut params, self.max_tokens);
            params.push(b'}');
        } else {
            params.extend_from_slice(b"\"model\":");
            put_json_str(&mut params, self.model_for(i));
            if self.api == "responses" {
                params.extend_from_slice(b",\"max_output_tokens\":");
                crate::wire::put_u64(&mut params, self.max_tokens);
                params.extend_from_slice(if self.store { b",\"store\":true" } else { b",\"store\":false" });
            } else {
                params.extend_from_slice(b",\"max_tokens\":");
                crate::wire::put_u64(&mut params, self.max_tokens);
            }
        }
        if self.tools && self.api == "chat" {
            params.extend_from_slice(b",\"tools\":[");
            params.extend_from_slice(crate::sim::grpc::markup::WEATHER_TOOL.as_bytes());
            params.push(b']');
        }
        if self.stream {
            params.extend_from_slice(b",\"stream\":true");
            if self.include_usage && !matches!(self.api.as_str(), "generate" | "responses") {
                params.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
            }
        }
        b.push(b'{');
        if self.key_order == "messages_first" {
            b.extend_from_slice(prompt_key);
            b.extend_from_slice(&prompt);
            b.push(b',');
            b.extend_from_slice(&params);
        } else {
            b.extend_from_slice(&params);
            b.push(b',');
            b.extend_from_slice(prompt_key);
            b.extend_from_slice(&prompt);
        }
        b.push(b'}');
        b
    }

    /// A Decisions body: `user` as the evidence, then a predicate, a three-way choice and a
    /// three-level score about it.
    fn decisions_body(&self, i: usize, user: &str) -> Vec<u8> {
        const QUESTIONS: &str = r#"[{"type":"predicate","instructions":"Is the text about routing requests?"},{"type":"choice","name":"topic","instructions":"What is the main topic?","choices":[{"value":"cache"},{"value":"latency"},{"value":"batch"}]},{"type":"score","name":"detail","instructions":"How technical is the text?","levels":[{"label":"low"},{"label":"medium"},{"label":"high"}]}]"#;
        let mut b = Vec::with_capacity(64 + user.len() + QUESTIONS.len());
        b.extend_from_slice(b"{\"model\":");
        put_json_str(&mut b, self.model_for(i));
        b.extend_from_slice(b",\"input\":");
        put_json_str(&mut b, user);
        b.extend_from_slice(b",\"questions\":");
        b.extend_from_slice(QUESTIONS.as_bytes());
        b.push(b'}');
        b
    }

    /// The request pool: complete HTTP requests ready to write (a chained scenario's are its
    /// turns unchained: each is a fresh first turn, as a readiness probe may send).
    pub fn requests(&self, host: &str, path_override: Option<&str>, headers: &[String]) -> Vec<Bytes> {
        let path = path_override.unwrap_or(self.path());
        self.bodies().iter().map(|b| build_request("POST", path, host, headers, b)).collect()
    }

    /// What builds a chained scenario's turns as the answers come; None for the others.
    pub fn chain(&self, host: &str, path_override: Option<&str>, headers: &[String]) -> Option<Arc<Chain>> {
        self.chained().then(|| {
            let path = path_override.unwrap_or(self.path());
            Arc::new(Chain::new(self.turns, self.bodies(), path, host, headers))
        })
    }
}

/// Deterministic lowercase text of `len` bytes: words from a small vocabulary, JSON-safe.
pub fn text(len: usize, seed: u64) -> String {
    const WORDS: &[&str] = &[
        "the", "model", "routes", "tokens", "cache", "prefix", "worker", "gateway", "latency", "stream", "batch",
        "prompt", "answer", "quickly", "because", "every", "request", "matters", "here", "now",
    ];
    let rng = Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555);
    let mut s = String::with_capacity(len + 8);
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s.truncate(len);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};

    #[test]
    fn single_turn_bodies_are_json_of_the_right_size() {
        let s = Scenario { user_bytes: 1500, variants: 3, ..Scenario::default() };
        let bodies = s.bodies();
        assert_eq!(bodies.len(), 3);
        for b in &bodies {
            let v: sonic_rs::Value = sonic_rs::from_slice(b).unwrap();
            assert_eq!(v["model"].as_str(), Some("sim-model"));
            assert!((1500..1700).contains(&b.len()), "{}", b.len());
        }
        assert_ne!(bodies[0], bodies[1]);
    }

    #[test]
    fn multi_turn_shares_prefixes() {
        let s = Scenario {
            users: 2,
            turns: 3,
            sessions: 1,
            system_prompt_bytes: 500,
            user_bytes: 50,
            assistant_bytes: 40,
            key_order: "messages_first".into(),
            ..Scenario::default()
        };
        let bodies = s.bodies();
        assert_eq!(bodies.len(), 6);
        // Order: (u0,t0) (u1,t0) (u0,t1) (u1,t1) ...; turn t+1 of a user extends turn t's messages.
        let msgs = |b: &[u8]| {
            let v: sonic_rs::Value = sonic_rs::from_slice(b).unwrap();
            v["messages"].as_array().unwrap().len()
        };
        assert_eq!(msgs(&bodies[0]), 2);
        assert_eq!(msgs(&bodies[2]), 4);
        assert_eq!(msgs(&bodies[4]), 6);
        let strip = |b: &[u8]| {
            let s = std::str::from_utf8(b).unwrap();
            s[..s.rfind("{\"role\":\"user\"").unwrap()].to_string()
        };
        // u0's turn 1 history starts with all of u0's turn 0 messages except the closing bracket.
        let t0 = std::str::from_utf8(&bodies[0]).unwrap();
        let t0_msgs = &t0[..t0.find("}]").unwrap()];
        assert!(strip(&bodies[2]).starts_with(t0_msgs));
        assert!(bodies[0].starts_with(b"{\"messages\":"));
    }

    #[test]
    fn a_tools_scenario_offers_the_tool_the_simulator_calls() {
        let s = Scenario::load("sse-tools").unwrap();
        let body = &s.bodies()[0];
        let v: sonic_rs::Value = sonic_rs::from_slice(body).unwrap();
        assert_eq!(v["tools"][0]["function"]["name"].as_str(), Some("get_weather"));
        assert_eq!(v["stream"].as_bool(), Some(true));
        let plain = Scenario { variants: 1, ..Scenario::default() };
        assert!(plain.bodies()[0].windows(8).all(|w| w != b"\"tools\":"));
    }

    #[test]
    fn a_decisions_scenario_asks_one_question_of_each_type() {
        let s = Scenario::load("decisions").unwrap();
        assert_eq!(s.path(), "/v1/decisions");
        let v: sonic_rs::Value = sonic_rs::from_slice(&s.bodies()[0]).unwrap();
        let types: Vec<&str> = v["questions"].as_array().unwrap().iter().map(|q| q["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["predicate", "choice", "score"]);
        assert!(v["input"].as_str().unwrap().len() >= s.user_bytes);
        assert!(v.get("stream").is_none());
    }

    #[test]
    fn responses_1k_says_chat_1ks_user_messages_stored() {
        let (r, chat) = (Scenario::load("responses-1k").unwrap(), Scenario::load("chat-1k").unwrap());
        assert_eq!(r.path(), "/v1/responses");
        assert!(!r.chained() && r.chain("h", None, &[]).is_none());
        let (rb, cb) = (r.bodies(), chat.bodies());
        assert_eq!(rb.len(), cb.len());
        for (a, b) in rb.iter().zip(&cb) {
            let (a, b): (sonic_rs::Value, sonic_rs::Value) =
                (sonic_rs::from_slice(a).unwrap(), sonic_rs::from_slice(b).unwrap());
            assert_eq!(a["input"].as_str(), b["messages"][0]["content"].as_str());
            assert_eq!(a["store"].as_bool(), Some(true));
            assert_eq!(a["max_output_tokens"].as_u64(), b["max_tokens"].as_u64());
            assert_eq!(a["model"].as_str(), b["model"].as_str());
            assert!(a.get("stream").is_none() && a.get("previous_response_id").is_none());
        }
    }

    #[test]
    fn a_chained_responses_scenario_builds_its_turns_as_answers_come() {
        let s = Scenario::load("responses-chain10").unwrap();
        assert!(s.chained());
        let bodies = s.bodies();
        assert_eq!(bodies.len(), s.sessions * 10);
        let inputs: Vec<String> = bodies
            .iter()
            .map(|b| sonic_rs::from_slice::<sonic_rs::Value>(b).unwrap()["input"].as_str().unwrap().to_string())
            .collect();
        assert!(inputs.iter().all(|i| i.len() == s.user_bytes), "small inputs");
        assert_ne!(inputs[0], inputs[1], "each turn says something new");
        // Turn 2 of the first conversation chains off turn 1's answer.
        let chain = s.chain("127.0.0.1:1", None, &[]).unwrap();
        let users = crate::load::chain::Users::new(chain, 0, 1);
        let first = users.take();
        let req = users.chain().request(&first);
        assert!(req.starts_with(b"POST /v1/responses HTTP/1.1\r\n"));
        assert!(memchr::memmem::find(&req, b"previous_response_id").is_none());
        users.give_back(first, crate::load::chain::response_id(br#"{"id":"resp_abc","object":"response"}"#));
        let req = users.chain().request(&users.take());
        let body = &req[memchr::memmem::find(&req, b"\r\n\r\n").unwrap() + 4..];
        let v: sonic_rs::Value = sonic_rs::from_slice(body).unwrap();
        assert_eq!(v["previous_response_id"].as_str(), Some("resp_abc"));
        assert_eq!(v["input"].as_str(), Some(inputs[1].as_str()));
        assert_eq!(v["store"].as_bool(), Some(true));
        // What a chain cannot be.
        let bad = |f: fn(&mut Scenario)| {
            let mut x = s.clone();
            f(&mut x);
            x.validate().unwrap_err()
        };
        assert!(bad(|x| x.stream = true).contains("not streamed"));
        assert!(bad(|x| x.store = false).contains("store"));
        assert!(bad(|x| x.users = 2).contains("users"));
    }

    #[test]
    fn mixed_models_and_generate() {
        let s = Scenario { models: vec!["a".into(), "b".into()], variants: 4, user_bytes: 10, ..Scenario::default() };
        let models: Vec<String> = s
            .bodies()
            .iter()
            .map(|b| {
                let v: sonic_rs::Value = sonic_rs::from_slice(b).unwrap();
                v["model"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(models, vec!["a", "b", "a", "b"]);
        let g = Scenario { api: "generate".into(), stream: true, variants: 1, ..Scenario::default() };
        let v: sonic_rs::Value = sonic_rs::from_slice(&g.bodies()[0]).unwrap();
        assert_eq!(v["sampling_params"]["max_new_tokens"].as_u64(), Some(16));
        assert_eq!(g.path(), "/generate");
    }

    #[test]
    fn shipped_scenarios_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let s = Scenario::load(p.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
            assert!(!s.bodies().is_empty(), "{}", p.display());
            n += 1;
        }
        assert!(n >= 5);
    }
}
