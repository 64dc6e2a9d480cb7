//! smg-sim --tls-dir through the binary, both drivers: each worker also serves HTTPS with a
//! certificate for the providers' names, signed by the CA it writes; a client that trusts
//! that CA is answered as over plain HTTP, by each name, and one that does not is refused.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::{Sim, DRIVERS};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

fn tls_port(line: &str) -> u16 {
    let at = line.find(" tls=").unwrap_or_else(|| panic!("no tls= in {line}"));
    line[at + 5..].split_whitespace().next().unwrap().rsplit(':').next().unwrap().parse().unwrap()
}

#[allow(deprecated)] // ring's provider: see src/sim/tls.rs
fn client(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(cfg)
}

/// One HTTP/1.1 request over TLS to `port` asking for `name` (SNI and Host); the whole answer,
/// or the TLS error.
fn https(cfg: &Arc<rustls::ClientConfig>, port: u16, name: &str, request: &str) -> Result<String, String> {
    let server = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::clone(cfg), server).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(common::patience(std::time::Duration::from_secs(10)))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let req = request.replace("{host}", name);
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        // A server that closes without close_notify still answered.
        Err(_) if !out.is_empty() => Ok(String::from_utf8_lossy(&out).into_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn workers_serve_https_by_the_providers_names() {
    for legacy in DRIVERS {
        let dir = std::env::temp_dir().join(format!("smg-sim-tls-test-{}-{legacy}", std::process::id()));
        let d = dir.to_str().unwrap().to_string();
        let sim = Sim::start(&["--ports", "0,0", "--tls-dir", &d], legacy);
        let ports: Vec<u16> = sim.lines.iter().map(|l| tls_port(l)).collect();
        assert_eq!(ports.len(), 2);
        assert!(!ports.contains(&sim.ports[0]) && !ports.contains(&sim.ports[1]), "{:?}", sim.lines);
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let trusted = client(roots);
        let models = "GET /v1/models HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n";
        for name in smg_loadtest::sim::tls::NAMES {
            let r = https(&trusted, ports[1], name, models).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.starts_with("HTTP/1.1 200"), "{name}: {r}");
            assert!(r.contains(r#""id":"sim-model""#), "{name}: {r}");
        }
        let body = r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
        let chat = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {{host}}\r\nAuthorization: Bearer xai-key\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let r = https(&trusted, ports[0], "api.x.ai", &chat).unwrap();
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("chat.completion"), "{r}");
        // /sim/requests: what the worker was sent, by host, with its credentials as sent.
        let seen = common::http(sim.ports[0], "GET", "/sim/requests", "").json();
        let seen = seen.as_array().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0]["host"].as_str(), Some("api.x.ai"));
        assert_eq!(seen[0]["authorization"].as_str(), Some("Bearer xai-key"));
        assert_eq!(
            (seen[0]["method"].as_str(), seen[0]["path"].as_str()),
            (Some("POST"), Some("/v1/chat/completions"))
        );
        assert!(seen[0].get("x-api-key").is_none());
        let other = common::http(sim.ports[1], "GET", "/sim/requests", "").json();
        assert_eq!(other.as_array().map(|a| a.len()), Some(smg_loadtest::sim::tls::NAMES.len()), "{other:?}");
        // A client without the CA: no answer.
        let untrusting = client(rustls::RootCertStore::empty());
        let refused = https(&untrusting, ports[0], "api.openai.com", models);
        assert!(refused.as_ref().is_err_and(|e| e.contains("certificate")), "{refused:?}");
        // Nor for a name the certificate does not hold.
        let trusted2 = trusted.clone();
        assert!(https(&trusted2, ports[0], "example.com", models).is_err());
        drop(sim);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--provider-keys`: over TLS, each worker answers as the provider the Host names, with that
/// provider's key style, per-key model lists and error shapes, and the failure modes.
#[test]
fn workers_play_the_providers_their_host_names() {
    for legacy in DRIVERS {
        let dir = std::env::temp_dir().join(format!("smg-sim-provider-test-{}-{legacy}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = dir.join("keys.json");
        std::fs::write(
            &keys,
            r#"{"sk-o":{"provider":"openai","models":["gpt-4o"]},"sk-a":{"provider":"anthropic","models":["claude-x"]}}"#,
        )
        .unwrap();
        let (d, k) = (dir.to_str().unwrap().to_string(), keys.to_str().unwrap().to_string());
        // The proxy's port is the simulator's own pick (0), read from its `proxy` line: a port
        // picked here and handed over could be taken by the other test's simulator first.
        let sim =
            Sim::start(&["--ports", "0", "--tls-dir", &d, "--provider-keys", &k, "--connect-proxy-port", "0"], legacy);
        let proxy_port = sim.proxy.expect("a proxy line");
        let port = tls_port(&sim.lines[0]);
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let cfg = client(roots);
        let get = |name: &str, auth: &str| {
            let req = format!("GET /v1/models HTTP/1.1\r\nhost: {{host}}\r\n{auth}\r\nconnection: close\r\n\r\n");
            https(&cfg, port, name, &req).unwrap()
        };
        let r = get("api.openai.com", "authorization: Bearer sk-o");
        assert!(r.starts_with("HTTP/1.1 200") && r.contains(r#""id":"gpt-4o""#), "{r}");
        let r = get("api.anthropic.com", "x-api-key: sk-a");
        assert!(r.starts_with("HTTP/1.1 200") && r.contains(r#""type":"model","id":"claude-x""#), "{r}");
        let r = get("api.openai.com", "authorization: Bearer sk-a");
        assert!(r.starts_with("HTTP/1.1 401") && r.contains("invalid_api_key"), "{r}");
        let r = get("api.anthropic.com", "authorization: Bearer sk-a");
        assert!(r.starts_with("HTTP/1.1 401") && r.contains("authentication_error"), "{r}");
        let chat = |model: &str| {
            let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}"#);
            let req = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {{host}}\r\nauthorization: Bearer sk-o\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            https(&cfg, port, "api.openai.com", &req).unwrap()
        };
        assert!(chat("gpt-4o").starts_with("HTTP/1.1 200"));
        let r = chat("gpt-5");
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("model_not_found"), "{r}");
        let set = |json: &str| assert_eq!(common::http(sim.ports[0], "POST", "/sim/control", json).status, 200);
        set(r#"{"provider_fail":429,"retry_after":7}"#);
        let r = get("api.openai.com", "authorization: Bearer sk-o");
        assert!(r.starts_with("HTTP/1.1 429") && r.to_ascii_lowercase().contains("\r\nretry-after: 7\r\n"), "{r}");
        set(r#"{"provider_fail":null}"#);
        assert!(get("api.openai.com", "authorization: Bearer sk-o").starts_with("HTTP/1.1 200"));
        // Through the CONNECT proxy, as a client with HTTPS_PROXY reaches a provider.
        let mut tcp = TcpStream::connect(("127.0.0.1", proxy_port)).unwrap();
        tcp.write_all(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nhost: api.anthropic.com:443\r\nproxy-authorization: Basic dTpw\r\n\r\n").unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(tcp.read(&mut byte).unwrap(), 1, "proxy closed: {}", String::from_utf8_lossy(&head));
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        let server = ServerName::try_from("api.anthropic.com").unwrap();
        let conn = rustls::ClientConnection::new(Arc::clone(&cfg), server).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(
            b"GET /v1/models HTTP/1.1\r\nhost: api.anthropic.com\r\nx-api-key: sk-a\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out);
        let r = String::from_utf8_lossy(&out);
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("claude-x"), "{r}");
        // Anthropic's Messages API, whole and streamed, with its key style.
        let messages = |stream: bool| {
            let body = format!(
                r#"{{"model":"claude-x","max_tokens":3,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            let req = format!(
                "POST /v1/messages HTTP/1.1\r\nhost: {{host}}\r\nx-api-key: sk-a\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            https(&cfg, port, "api.anthropic.com", &req).unwrap()
        };
        let r = messages(false);
        assert!(r.starts_with("HTTP/1.1 200") && r.contains(r#""type":"message""#), "{r}");
        assert!(r.contains(r#""stop_reason":"max_tokens""#) && r.contains(r#""output_tokens":3"#), "{r}");
        let r = messages(true);
        let events: Vec<&str> = r.split("event: ").skip(1).filter_map(|e| e.split('\n').next()).collect();
        let want = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta"];
        assert_eq!(&events[..5], want, "{r}");
        assert_eq!(&events[5..], ["content_block_delta", "content_block_stop", "message_delta", "message_stop"], "{r}");
        assert!(!r.contains("[DONE]"), "{r}");
        let asked = common::http(sim.ports[0], "GET", "/sim/connects", "").json();
        assert_eq!(asked[0]["target"].as_str(), Some("api.anthropic.com:443"), "{asked:?}");
        assert_eq!(asked[0]["proxy_authorization"].as_str(), Some("Basic dTpw"));
        drop(sim);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
