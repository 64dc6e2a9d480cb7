//! Cloud providers as workers, through the binary: a self-hosted worker beside OpenAI,
//! Anthropic, Gemini and xAI, all four played by one smg-sim over TLS (its CA trusted by
//! `SSL_CERT_FILE`) and reached only through its CONNECT proxy (`HTTPS_PROXY`), as a
//! gateway behind a corporate proxy reaches the real ones. Every key rule is checked over
//! every request the stand-in saw.

// clippy.toml's house rules are the gateway's: a test times a whole request from outside.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::admit::start_env;
use support::sim::Sim;
use support::*;

/// Keys the stand-in accepts: two OpenAI keys (the stored one and a caller's own), one each
/// for the others, each with its models.
const KEYS: &str = r#"{
  "sk-o-stored": {"provider": "openai", "models": ["gpt-4o", "gpt-4o-mini"]},
  "sk-o-callers": {"provider": "openai", "models": ["gpt-4o"]},
  "sk-a-stored": {"provider": "anthropic", "models": ["claude-x"]},
  "sk-a-callers": {"provider": "anthropic", "models": ["claude-x"]},
  "g-callers": {"provider": "gemini", "models": ["gemini-x"]},
  "g-stored": {"provider": "gemini", "models": ["gemini-x"]},
  "xai-stored": {"provider": "xai", "models": ["grok-x"]}
}"#;

/// The stand-in and where its files are.
struct Cloud {
    sim: Sim,
    proxy: u16,
    ca: String,
    /// Its HTTPS port, for a client that reaches it without the proxy.
    tls: u16,
    /// Its keys and certificates, removed with it.
    _dir: tempfile::TempDir,
}

fn cloud(tag: &str) -> Cloud {
    let scratch = tempfile::Builder::new().prefix(&format!("smg-providers-{tag}-")).tempdir().unwrap();
    let dir = scratch.path();
    let keys = dir.join("keys.json");
    std::fs::write(&keys, KEYS).unwrap();
    let (d, k) = (dir.to_str().unwrap().to_string(), keys.to_str().unwrap().to_string());
    let sim = Sim::start(
        "cloud-sim",
        &["--tls-dir", &d, "--tls-port", "0", "--provider-keys", &k, "--connect-proxy-port", "0"],
    );
    let (proxy, tls) = (sim.proxy.expect("the stand-in's proxy port"), sim.tls.expect("the stand-in's TLS port"));
    Cloud { sim, proxy, ca: dir.join("ca.pem").to_str().unwrap().to_string(), tls, _dir: scratch }
}

impl Cloud {
    /// A gateway that reaches the stand-in as the internet: through its proxy, trusting its
    /// CA; `env` adds to (or overrides) that.
    fn gateway(&self, legacy: bool, args: &[&str], env: &[(&str, &str)]) -> Gateway {
        let proxy = format!("http://127.0.0.1:{}", self.proxy);
        let mut all = vec![("HTTPS_PROXY", proxy.as_str()), ("SSL_CERT_FILE", self.ca.as_str())];
        all.extend_from_slice(env);
        start_env(legacy, args, &all)
    }
}

fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":3}}"#)
}

fn register(port: u16, json: &str) {
    let r = post(port, "/workers", json, &[]);
    assert_eq!(r.status, 202, "{json}: {}", r.text());
}

/// The four providers, each with its stored key.
fn register_all(port: u16) {
    register(port, r#"{"url":"https://api.openai.com","api_key":"sk-o-stored","runtime_type":"external"}"#);
    register(port, r#"{"url":"https://api.anthropic.com","api_key":"sk-a-stored"}"#);
    register(port, r#"{"url":"https://generativelanguage.googleapis.com","api_key":"g-stored","provider":"gemini"}"#);
    register(port, r#"{"url":"https://api.x.ai","api_key":"xai-stored","runtime_type":"external","provider":"xai"}"#);
}

/// Waits until `model` is served (its provider's models were discovered).
fn wait_served(gw: &Gateway, model: &str) {
    let ok =
        wait_until(Duration::from_secs(20), || post(gw.port, "/v1/chat/completions", &chat(model), &[]).status == 200);
    assert!(ok, "{model} never served; log:\n{}", gw.log_text());
}

/// Every request the stand-in saw, as `/sim/requests` lists them.
fn seen(cloud: &Cloud) -> Vec<sonic_rs::Value> {
    get(cloud.sim.port, "/sim/requests").json().as_array().unwrap().iter().cloned().collect()
}

/// GET with header lines.
fn get_with(port: u16, path: &str, headers: &[&str]) -> Response {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(15)))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

fn field<'a>(r: &'a sonic_rs::Value, name: &str) -> Option<&'a str> {
    r[name].as_str()
}

#[test]
fn a_mixed_fleet_routes_each_model_to_its_provider_with_its_key() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("mixed-{legacy}"));
        let own = Sim::start("self-model", &[]);
        let gw = cloud.gateway(legacy, &["--worker-urls", &own.url(), "--log-level", "debug"], &[("NO_PROXY", "")]);
        gw.ready_workers(1);
        register_all(gw.port);
        for m in ["gpt-4o", "gpt-4o-mini", "claude-x", "gemini-x", "grok-x"] {
            wait_served(&gw, m);
        }
        // Each model went to its provider's host with that provider's key, in its style.
        let want = [
            ("gpt-4o-mini", "api.openai.com", "authorization", "Bearer sk-o-stored"),
            ("claude-x", "api.anthropic.com", "x-api-key", "sk-a-stored"),
            ("gemini-x", "generativelanguage.googleapis.com", "x-goog-api-key", "g-stored"),
            ("grok-x", "api.x.ai", "authorization", "Bearer xai-stored"),
        ];
        for (model, host, header, key) in want {
            let r = post(gw.port, "/v1/chat/completions", &chat(model), &[]);
            assert_eq!(r.status, 200, "{model}: {}", r.text());
            let all = seen(&cloud);
            let last = all.iter().rev().find(|q| field(q, "path") == Some("/v1/chat/completions")).unwrap();
            assert_eq!(field(last, "host"), Some(host), "{model}: {last:?}");
            assert_eq!(field(last, header), Some(key), "{model}: {last:?}");
        }
        let anthropic = seen(&cloud).into_iter().rev().find(|q| field(q, "host") == Some("api.anthropic.com")).unwrap();
        assert_eq!(field(&anthropic, "anthropic-version"), Some("2023-06-01"));
        assert_eq!(field(&anthropic, "authorization"), None, "{anthropic:?}");
        // The self-hosted model is served by its own worker, which saw no provider key.
        let r = post(gw.port, "/v1/chat/completions", &chat("self-model"), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(get(own.port, "/sim/requests").json().as_array().unwrap().iter().all(|q| q["authorization"].is_null()));
        // A caller's own key wins over the stored one, which is then not sent.
        let r = post(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &["Authorization: Bearer sk-o-callers"]);
        assert_eq!(r.status, 200, "{}", r.text());
        let last = seen(&cloud).pop().unwrap();
        assert_eq!(field(&last, "authorization"), Some("Bearer sk-o-callers"), "{last:?}");
        // Engine-only fields are cut out of what a provider is sent (it would refuse them);
        // the rest goes as written, and a self-hosted worker still gets them.
        let body =
            r#"{"model":"gpt-4o","top_k":5,"messages":[{"role":"user","content":"hi"}],"min_p":0.1,"max_tokens":3}"#;
        let r = post(gw.port, "/v1/chat/completions", body, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let body = r#"{"model":"self-model","top_k":5,"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
        assert_eq!(post(gw.port, "/v1/chat/completions", body, &[]).status, 200);
        // Keyless /v1/models lists the self-hosted models only.
        let models = get(gw.port, "/v1/models").json();
        let ids: Vec<&str> = models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
        assert_eq!(ids, ["self-model"], "{models:?}");
        // With the caller's own key: that key's inventory at the first provider that takes
        // it, owned_by the provider; a key every provider refuses gets the self-hosted list.
        let listed = |auth: &str| {
            let r = get_with(gw.port, "/v1/models", &[auth]);
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            let rows: Vec<(String, String)> = v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["id"].as_str().unwrap().to_string(), m["owned_by"].as_str().unwrap().to_string()))
                .collect();
            rows
        };
        let pair = |id: &str, by: &str| (id.to_string(), by.to_string());
        assert_eq!(listed("Authorization: Bearer sk-o-callers"), [pair("gpt-4o", "openai")]);
        assert_eq!(listed("Authorization: Bearer sk-a-callers"), [pair("claude-x", "anthropic")]);
        assert_eq!(listed("x-goog-api-key: g-callers"), [pair("gemini-x", "gemini")]);
        assert_eq!(listed("Authorization: Bearer nobodys-key"), [pair("self-model", "self_hosted")]);
        // An unknown model is 404 model_not_found, and nothing is sent anywhere.
        let before = seen(&cloud).len();
        let r = post(gw.port, "/v1/chat/completions", &chat("gpt-9"), &[]);
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("model_not_found"), "{}", r.text());
        assert_eq!(seen(&cloud).len(), before);
        // The workers list names each provider and shows no key; nor does the log.
        let listed = get(gw.port, "/workers").text();
        for p in ["openai", "anthropic", "gemini", "xai"] {
            assert!(listed.contains(&format!(r#""provider":"{p}""#)), "{listed}");
        }
        for key in ["sk-o-stored", "sk-a-stored", "g-stored", "xai-stored", "sk-o-callers", "sk-a-callers", "g-callers"]
        {
            assert!(!listed.contains(key), "GET /workers shows {key}");
            assert!(!gw.log_text().contains(key), "the log shows {key}");
        }
        // No stored key ever reached another provider (a caller's own key is tried at each
        // provider for its model list, as the contract says).
        for q in seen(&cloud) {
            let host = field(&q, "host").unwrap_or("");
            let keys = [field(&q, "authorization"), field(&q, "x-api-key"), field(&q, "x-goog-api-key")];
            for k in keys.into_iter().flatten().filter(|k| k.contains("stored")) {
                let owner = if k.contains("sk-o-") {
                    "api.openai.com"
                } else if k.contains("sk-a-") {
                    "api.anthropic.com"
                } else if k.contains("g-stored") {
                    "generativelanguage.googleapis.com"
                } else {
                    "api.x.ai"
                };
                assert_eq!(host, owner, "{q:?}");
            }
        }
        // Every provider was reached through the proxy, by its name, on connections kept
        // alive: 20 more requests open at most one tunnel per shard (a shard whose pool has
        // no connection to the origin yet; each tunnel is one pooled connection), not one
        // each. The bound sits between those: 2 shards, 20 requests.
        let connects = get(cloud.sim.port, "/sim/connects").text();
        for host in
            ["api.openai.com:443", "api.anthropic.com:443", "generativelanguage.googleapis.com:443", "api.x.ai:443"]
        {
            assert!(connects.contains(host), "{connects}");
        }
        let tunnels = || get(cloud.sim.port, "/sim/connects").text().matches("api.openai.com:443").count();
        let before = tunnels();
        for _ in 0..20 {
            assert_eq!(post(gw.port, "/v1/chat/completions", &chat("gpt-4o-mini"), &[]).status, 200);
        }
        let opened = tunnels() - before;
        assert!(opened <= 10, "20 sequential requests opened {opened} TLS connections: the pool is not reused");
    });
}

/// With gateway keys configured, what a caller sends is a gateway key: it never reaches a
/// provider, and the caller is served with the stored key.
#[test]
fn a_gateway_key_never_reaches_a_provider() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("gwkey-{legacy}"));
        let gw = cloud.gateway(
            legacy,
            &["--api-key", "gw-shared-key", "--tenant-api-key", "team:gw-tenant-key", "--log-level", "debug"],
            &[],
        );
        let auth = "Authorization: Bearer gw-shared-key";
        let r = post(gw.port, "/workers", r#"{"url":"https://api.openai.com","api_key":"sk-o-stored"}"#, &[auth]);
        assert_eq!(r.status, 202, "{}", r.text());
        let served = || post(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &[auth]).status == 200;
        assert!(wait_until(Duration::from_secs(20), served), "never served; log:\n{}", gw.log_text());
        let r = post(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &["Authorization: Bearer gw-tenant-key"]);
        assert_eq!(r.status, 200, "{}", r.text());
        // A gateway key on /v1/models is not a provider key: the self-hosted list (none here).
        assert_eq!(get_with(gw.port, "/v1/models", &[auth]).status, 503);
        let all = seen(&cloud);
        assert!(!all.is_empty());
        for q in &all {
            let text = format!("{q:?}");
            assert!(!text.contains("gw-shared-key") && !text.contains("gw-tenant-key"), "{text}");
            if field(q, "path") == Some("/v1/chat/completions") {
                assert_eq!(field(q, "authorization"), Some("Bearer sk-o-stored"), "{text}");
            }
        }
    });
}

/// A provider's refusals go to the caller as it sent them, each asked once: a 429 with its
/// `Retry-After` (retrying would only spend the key's limit), a 401 in its own shape.
#[test]
fn a_providers_refusals_are_relayed_once() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("refusals-{legacy}"));
        let gw = cloud.gateway(legacy, &["--retry-max-retries", "3"], &[]);
        register(gw.port, r#"{"url":"https://api.openai.com","api_key":"sk-o-stored"}"#);
        register(gw.port, r#"{"url":"https://api.anthropic.com","api_key":"sk-a-stored"}"#);
        wait_served(&gw, "gpt-4o");
        wait_served(&gw, "claude-x");
        let asked = || seen(&cloud).iter().filter(|q| field(q, "path") == Some("/v1/chat/completions")).count();
        cloud.sim.control(r#"{"provider_fail":429,"retry_after":7}"#);
        let before = asked();
        let r = post(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &[]);
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("7"), "{:?}", r.headers);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("rate_limit_exceeded"), "{}", r.text());
        assert_eq!(asked(), before + 1, "a provider's 429 is not retried");
        cloud.sim.control(r#"{"provider_fail":401}"#);
        let before = asked();
        let r = post(gw.port, "/v1/chat/completions", &chat("claude-x"), &[]);
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(r.json()["error"]["type"].as_str(), Some("authentication_error"), "{}", r.text());
        assert_eq!(asked(), before + 1, "a 401 is not retried");
        cloud.sim.control(r#"{"provider_fail":null}"#);
        assert_eq!(post(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &[]).status, 200);
    });
}

/// SMG's `--backend anthropic`: the worker URLs are Anthropic's API, keyed from
/// ANTHROPIC_API_KEY. `/v1/messages` passes the caller's `x-api-key`, `anthropic-version` and
/// `anthropic-beta` as sent, streams the event sequence whole, and keeps Anthropic's errors.
#[test]
fn backend_anthropic_serves_messages_as_anthropic_does() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("anthropic-{legacy}"));
        let gw = cloud.gateway(
            legacy,
            &["--backend", "anthropic", "--worker-urls", "https://api.anthropic.com"],
            &[("ANTHROPIC_API_KEY", "sk-a-stored")],
        );
        gw.ready_workers(1);
        let body = |stream: bool| {
            format!(
                r#"{{"model":"claude-x","max_tokens":4,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
            )
        };
        // The stored key, as x-api-key with a default anthropic-version.
        let r = post(gw.port, "/v1/messages", &body(false), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["type"].as_str(), Some("message"), "{}", r.text());
        let last = seen(&cloud).pop().unwrap();
        assert_eq!(
            (field(&last, "x-api-key"), field(&last, "anthropic-version")),
            (Some("sk-a-stored"), Some("2023-06-01"))
        );
        // The caller's own headers, as sent; the stream's events in order.
        let own = ["x-api-key: sk-a-callers", "anthropic-version: 2024-01-01", "anthropic-beta: tools-2024"];
        let r = post(gw.port, "/v1/messages", &body(true), &own);
        assert_eq!(r.status, 200, "{}", r.text());
        let last = seen(&cloud).pop().unwrap();
        assert_eq!(field(&last, "x-api-key"), Some("sk-a-callers"), "{last:?}");
        assert_eq!(field(&last, "anthropic-version"), Some("2024-01-01"), "{last:?}");
        assert_eq!(field(&last, "anthropic-beta"), Some("tools-2024"), "{last:?}");
        let text = r.text();
        let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        let mut want = vec!["message_start", "content_block_start", "ping"];
        want.extend(std::iter::repeat_n("content_block_delta", events.len().saturating_sub(6)));
        want.extend(["content_block_stop", "message_delta", "message_stop"]);
        assert_eq!(events, want, "{text}");
        assert!(events.len() > 6, "no text deltas: {text}");
        // A key Anthropic refuses: its 401, in its shape, asked once.
        let r = post(gw.port, "/v1/messages", &body(false), &["x-api-key: not-a-key"]);
        assert_eq!(r.status, 401, "{}", r.text());
        let v = r.json();
        assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("authentication_error")));
        // The key from the environment is never in the log or the workers list.
        assert!(!gw.log_text().contains("sk-a-stored") && !get(gw.port, "/workers").text().contains("sk-a-stored"));
    });
}

/// `NO_PROXY` names the hosts reached directly: a provider there gets its TLS connection
/// without the proxy (the stand-in's own HTTPS port, by address; its certificate names it).
#[test]
fn no_proxy_hosts_are_reached_directly() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("noproxy-{legacy}"));
        let gw = cloud.gateway(legacy, &[], &[("NO_PROXY", "localhost,127.0.0.1")]);
        let url = format!("https://127.0.0.1:{}", cloud.tls);
        register(gw.port, &format!(r#"{{"url":"{url}","api_key":"sk-o-stored","provider":"openai"}}"#));
        wait_served(&gw, "gpt-4o");
        let last = seen(&cloud).pop().unwrap();
        assert_eq!(field(&last, "authorization"), Some("Bearer sk-o-stored"), "{last:?}");
        let connects = get(cloud.sim.port, "/sim/connects").json();
        assert_eq!(connects.as_array().map(|a| a.len()), Some(0), "tunnelled: {connects:?}");
    });
}

/// A provider that goes away mid-service: the stand-in's worker dies while its TLS front and
/// proxy stay up (as a provider's edge answers for a failed backend), so the new TLS
/// connection closes before any answer: the gateway's `502 upstream_error` at once, not a
/// hang, and the gateway goes on serving.
#[test]
fn a_provider_that_goes_away_is_a_prompt_502() {
    both_drivers(|legacy| {
        let cloud = cloud(&format!("gone-{legacy}"));
        let gw = cloud.gateway(legacy, &["--retry-max-retries", "2"], &[]);
        register(gw.port, r#"{"url":"https://api.openai.com","api_key":"sk-o-stored"}"#);
        wait_served(&gw, "gpt-4o");
        cloud.sim.die();
        // The first answer may come from a pooled connection that just died (its retry then
        // finds no way in); either way the caller hears of it well within the wait for a
        // TLS connection (30 s), which is what a hang would cost.
        let started = std::time::Instant::now();
        let r = post_within(gw.port, "/v1/chat/completions", &chat("gpt-4o"), &[], Duration::from_secs(15));
        assert!(started.elapsed() < patience(Duration::from_secs(15)), "took {:?}", started.elapsed());
        assert_eq!(r.status, 502, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("upstream_error"), "{}", r.text());
        assert_eq!(get(gw.port, "/health").status, 200);
    });
}
