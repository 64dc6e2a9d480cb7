//! Who may send what (API keys, tenant keys, control-plane keys) and how many requests are
//! let through at once (--max-concurrent-requests and its queue), through the real binary.
//! Each test runs under io_uring and epoll with two shards, beside the others: each waits on
//! what its own gateway and worker did, so a busy host cannot fool it.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block and lock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::admit::*;
use support::rogue::connect_with;
use support::*;

fn secs(n: u64) -> Duration {
    patience(Duration::from_secs(n))
}

/// Environment variables for a gateway.
type Env<'a> = &'a [(&'a str, &'a str)];

/// A named gateway configuration: its flags and environment.
type Config<'a> = (&'a str, &'a [&'a str], Env<'a>);

fn gateway(legacy: bool, url: &str, extra: &[&str]) -> Gateway {
    gateway_env(legacy, url, extra, &[])
}

/// [`gateway`] with its metrics listener on a loopback port of its own, returned with it.
fn gateway_metrics(legacy: bool, url: &str, extra: &[&str]) -> (Gateway, u16) {
    let mport = free_port();
    let m = mport.to_string();
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--prometheus-host", "127.0.0.1", "--prometheus-port", &m]);
    (gateway(legacy, url, &args), mport)
}

/// Requests waiting for an admission permit, all shards (`smg_admission_queue_depth`).
fn queued(mport: u16) -> Option<usize> {
    metric(mport, "smg_admission_queue_depth").map(|v| v as usize)
}

/// A ready gateway with two shards in front of `url`, with `extra` flags and `env` set.
fn gateway_env(legacy: bool, url: &str, extra: &[&str], env: &[(&str, &str)]) -> Gateway {
    let mut args = vec!["--worker-urls", url, "--cores", "2"];
    args.extend_from_slice(extra);
    let gw = start_env(legacy, &args, env);
    gw.ready();
    gw
}

// === Authentication ===

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Serving routes, each with a body the fake worker answers 200.
const SERVING: [(&str, &str); 4] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", r#"{"model":"m","prompt":"hi"}"#),
    ("/generate", r#"{"text":"hi"}"#),
    ("/v1/embeddings", r#"{"model":"m","input":"hi"}"#),
];

/// Admin routes as (method, path, body). None of them changes what the tests rely on when it
/// is let through: the worker id does not exist and the new worker is invalid.
const ADMIN: [(&str, &str, Option<&str>); 12] = [
    ("GET", "/workers", None),
    ("POST", "/workers", Some("{}")),
    ("GET", "/workers/no-such-worker", None),
    ("DELETE", "/workers/no-such-worker", None),
    ("POST", "/flush_cache", Some("")),
    ("GET", "/get_loads", None),
    ("POST", "/start_profile", Some("{}")),
    ("POST", "/stop_profile", Some("{}")),
    ("POST", "/parse/function_call", Some(r#"{"text":"hi","tool_call_parser":"json","tools":[]}"#)),
    ("POST", "/parse/reasoning", Some(r#"{"text":"hi","reasoning_parser":"deepseek-r1"}"#)),
    ("GET", "/wasm", None),
    ("GET", "/v1/tokenizers", None),
];

/// Worker paths an admin request could be relayed to.
const ADMIN_UPSTREAM: [&str; 8] =
    ["/workers", "/flush_cache", "/get_load", "/start_profile", "/stop_profile", "/parse", "/wasm", "/v1/tokenizers"];

fn show(auth: Option<&[u8]>) -> String {
    match auth {
        None => "no Authorization".into(),
        Some(a) => {
            let t = String::from_utf8_lossy(a);
            let t: String = t.chars().take(40).collect();
            format!("Authorization {t:?}{}", if a.len() > 40 { format!(" ({} bytes)", a.len()) } else { String::new() })
        }
    }
}

/// An empty-bodied 401, as API-key authentication answers.
fn empty_401(r: &Response) -> Result<(), String> {
    if r.status != 401 {
        return Err(format!("want 401, got {} {:?}", r.status, r.text()));
    }
    if r.header("content-length") != Some("0") || r.header("transfer-encoding").is_some() || !r.body.is_empty() {
        return Err(format!(
            "401 must have an empty body with Content-Length: 0; got Content-Length {:?}, Transfer-Encoding {:?}, body {:?}",
            r.header("content-length"),
            r.header("transfer-encoding"),
            r.text()
        ));
    }
    Ok(())
}

/// POSTs `body` to the serving route `path` with `auth`; checks the answer is `want` (200:
/// relayed, and the worker got the body; 401: empty, and the worker got nothing).
fn serving(gw: &Gateway, w: &FakeWorker, path: &str, body: &str, auth: Option<&[u8]>, want: u16) -> Result<(), String> {
    let before = w.requests().len();
    let r = ask(gw.port, &raw_request("POST", path, Some(body), auth, &[]))
        .map_err(|e| format!("POST {path} with {}: {e}", show(auth)))?;
    let fail = |why: String| Err(format!("POST {path} with {}: {why}", show(auth)));
    match want {
        401 => {
            if let Err(e) = empty_401(&r) {
                return fail(e);
            }
            let after = w.requests();
            if after.len() != before {
                return fail(format!(
                    "answered 401 but the worker got {:?}",
                    after[before..].iter().map(|r| &r.path).collect::<Vec<_>>()
                ));
            }
        }
        _ => {
            if r.status != want {
                return fail(format!("want {want}, got {} {:?}", r.status, r.text()));
            }
            let after = w.requests();
            if !after[before..].iter().any(|rec| rec.path == path && rec.body == body.as_bytes()) {
                return fail(format!("answered {want} but the worker never got the request"));
            }
        }
    }
    Ok(())
}

/// What an admin request must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admin {
    /// Let through: anything but 401 and 403 (the endpoints themselves may not exist yet).
    Pass,
    /// Exactly 401: no credential, or one nobody configured for admin routes.
    Unauthorized,
    /// A known credential without the admin role: 401 or 403.
    Refused,
}

fn admin(
    gw: &Gateway,
    w: &FakeWorker,
    route: (&str, &str, Option<&str>),
    auth: Option<&[u8]>,
    want: Admin,
) -> Result<(), String> {
    let (method, path, body) = route;
    let upstream =
        |w: &FakeWorker| w.requests().iter().filter(|r| ADMIN_UPSTREAM.iter().any(|p| r.path.starts_with(p))).count();
    let before = upstream(w);
    let r = ask(gw.port, &raw_request(method, path, body, auth, &[]))
        .map_err(|e| format!("{method} {path} with {}: {e}", show(auth)))?;
    let ok = match want {
        Admin::Pass => r.status != 401 && r.status != 403,
        Admin::Unauthorized => r.status == 401,
        Admin::Refused => r.status == 401 || r.status == 403,
    };
    if !ok {
        return Err(format!("{method} {path} with {}: want {want:?}, got {} {:?}", show(auth), r.status, r.text()));
    }
    if want != Admin::Pass && upstream(w) != before {
        return Err(format!("{method} {path} with {}: refused ({}) but relayed to the worker", show(auth), r.status));
    }
    Ok(())
}

/// Fails with the first 20 of `wrong`, if any.
fn report(what: &str, wrong: &[String]) {
    assert!(wrong.is_empty(), "{what}: {} wrong (first 20):\n{}", wrong.len(), wrong[..wrong.len().min(20)].join("\n"));
}

/// With --api-key and/or --tenant-api-key, every serving route needs one of the configured
/// keys: none, an unknown one, a tenant's id or a whole flag value is a 401 with an empty
/// body that never reaches the worker; each configured key is relayed.
#[test]
fn serving_routes_need_a_configured_key() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let shared: &[&str] = &["--api-key", "shared-secret"];
        let tenants: &[&str] =
            &["--tenant-api-key", "team-red:red-secret", "--tenant-api-key", "team-blue:blue-secret"];
        let both: Vec<&str> = shared.iter().chain(tenants).copied().collect();
        let configs: [(&str, &[&str], &[&str]); 3] = [
            ("--api-key", shared, &["shared-secret"]),
            ("--tenant-api-key ×2", tenants, &["red-secret", "blue-secret"]),
            ("--api-key and --tenant-api-key ×2", &both, &["shared-secret", "red-secret", "blue-secret"]),
        ];
        let candidates =
            ["shared-secret", "red-secret", "blue-secret", "team-red", "team-red:red-secret", "wrong", "red-secret2"];
        for (name, flags, valid) in configs {
            let gw = gateway(legacy, &w.url(), flags);
            let mut wrong = Vec::new();
            for (path, body) in SERVING {
                if let Err(e) = serving(&gw, &w, path, body, None, 401) {
                    wrong.push(e);
                }
                for key in candidates {
                    let want = if valid.contains(&key) { 200 } else { 401 };
                    if let Err(e) = serving(&gw, &w, path, body, Some(&bearer(key)), want) {
                        wrong.push(e);
                    }
                }
            }
            report(name, &wrong);
        }
    });
}

/// Without --api-key and --tenant-api-key, serving routes are open: no key, any key and a
/// control-plane key are all relayed (control-plane keys alone do not turn serving auth on).
#[test]
fn serving_routes_are_open_without_serving_keys() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let cp: &[&str] =
            &["--control-plane-api-keys", "ops:Ops:admin:cp-admin", "--control-plane-api-keys", "dev:Dev:user:cp-user"];
        let env_cp = [("CONTROL_PLANE_API_KEYS", "ops:Ops:admin:env-admin,dev:Dev:user:env-user")];
        let configs: [Config; 3] = [
            ("no key flags", &[], &[]),
            ("control-plane keys only", cp, &[]),
            ("CONTROL_PLANE_API_KEYS only", &[], &env_cp),
        ];
        for (name, flags, env) in configs {
            let gw = gateway_env(legacy, &w.url(), flags, env);
            let mut wrong = Vec::new();
            for (path, body) in SERVING {
                for auth in [None, Some(bearer("anything")), Some(bearer("cp-admin")), Some(bearer("env-user"))] {
                    if let Err(e) = serving(&gw, &w, path, body, auth.as_deref(), 200) {
                        wrong.push(e);
                    }
                }
            }
            report(name, &wrong);
        }
    });
}

/// GET /v1/models, /health, /liveness and /readiness answer 200 without a key whatever
/// keys are configured.
#[test]
fn public_routes_answer_without_a_key() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let all: &[&str] = &[
            "--api-key",
            "shared-secret",
            "--tenant-api-key",
            "team-red:red-secret",
            "--control-plane-api-keys",
            "ops:Ops:admin:cp-admin",
        ];
        let env_cp = [("CONTROL_PLANE_API_KEYS", "ops:Ops:admin:env-admin")];
        let configs: [Config; 6] = [
            ("no key flags", &[], &[]),
            ("--api-key", &["--api-key", "shared-secret"], &[]),
            ("--tenant-api-key only", &["--tenant-api-key", "team-red:red-secret"], &[]),
            ("control-plane keys only", &["--control-plane-api-keys", "ops:Ops:admin:cp-admin"], &[]),
            ("CONTROL_PLANE_API_KEYS and --api-key", &["--api-key", "shared-secret"], &env_cp),
            ("every kind of key", all, &[]),
        ];
        for (name, flags, env) in configs {
            let gw = gateway_env(legacy, &w.url(), flags, env);
            let mut wrong = Vec::new();
            for path in ["/v1/models", "/health", "/liveness", "/readiness"] {
                match ask(gw.port, &raw_request("GET", path, None, None, &[])) {
                    Ok(r) if r.status == 200 => {
                        if path == "/v1/models" && !r.text().contains("\"m\"") {
                            wrong.push(format!("GET {path}: the model is missing: {}", r.text()));
                        }
                    }
                    Ok(r) => wrong.push(format!("GET {path} without a key: {} {:?}", r.status, r.text())),
                    Err(e) => wrong.push(format!("GET {path} without a key: {e}")),
                }
            }
            report(name, &wrong);
        }
    });
}

/// Control-plane keys are for admin routes: with serving auth on, a control-plane key that
/// is not also an --api-key or --tenant-api-key is a 401 on serving routes; one that is both
/// works on both kinds of route.
#[test]
fn control_plane_keys_do_not_open_serving_routes() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut wrong = Vec::new();
        {
            let gw = gateway(
                legacy,
                &w.url(),
                &[
                    "--api-key",
                    "shared-secret",
                    "--control-plane-api-keys",
                    "ops:Ops:admin:cp-admin",
                    "--control-plane-api-keys",
                    "dev:Dev:user:cp-user",
                ],
            );
            for (path, body) in SERVING {
                for (key, want) in [("cp-admin", 401), ("cp-user", 401), ("ops", 401), ("shared-secret", 200)] {
                    if let Err(e) = serving(&gw, &w, path, body, Some(&bearer(key)), want) {
                        wrong.push(format!("flags: {e}"));
                    }
                }
            }
        }
        {
            let env = [("CONTROL_PLANE_API_KEYS", "ops:Ops:admin:env-admin,dev:Dev:user:env-user")];
            let gw = gateway_env(legacy, &w.url(), &["--api-key", "shared-secret"], &env);
            for (path, body) in SERVING {
                for (key, want) in [("env-admin", 401), ("env-user", 401), ("shared-secret", 200)] {
                    if let Err(e) = serving(&gw, &w, path, body, Some(&bearer(key)), want) {
                        wrong.push(format!("env: {e}"));
                    }
                }
            }
        }
        {
            let gw = gateway(
                legacy,
                &w.url(),
                &["--tenant-api-key", "team-red:dual-key", "--control-plane-api-keys", "ops:Ops:admin:dual-key"],
            );
            for (path, body) in SERVING {
                if let Err(e) = serving(&gw, &w, path, body, Some(&bearer("dual-key")), 200) {
                    wrong.push(format!("dual: {e}"));
                }
            }
            for route in ADMIN {
                if let Err(e) = admin(&gw, &w, route, Some(&bearer("dual-key")), Admin::Pass) {
                    wrong.push(format!("dual: {e}"));
                }
            }
        }
        report("control-plane keys on serving routes", &wrong);
    });
}

/// Admin routes: with control-plane keys, only an `admin` control-plane key passes (a
/// `user` one is refused; the shared and tenant keys are unknown there: 401); otherwise
/// --api-key's shared key passes and a tenant key never does; with no keys at all they are
/// open; with only tenant keys every admin request is a 401. Refused requests are never
/// relayed to a worker.
#[test]
fn admin_routes_follow_the_key_rules() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        struct Case<'a> {
            name: &'a str,
            flags: &'a [&'a str],
            env: &'a [(&'a str, &'a str)],
            keys: &'a [(Option<&'a str>, Admin)],
        }
        use Admin::*;
        let cp_flags =
            ["--control-plane-api-keys", "ops:Ops:admin:cp-admin", "--control-plane-api-keys", "dev:Dev:user:cp-user"];
        let everything: Vec<&str> = ["--api-key", "shared-secret", "--tenant-api-key", "team-red:red-secret"]
            .into_iter()
            .chain(cp_flags)
            .collect();
        let env_cp = [("CONTROL_PLANE_API_KEYS", "ops:Ops:admin:env-admin,dev:Dev:user:env-user")];
        let cases = [
            Case {
                name: "no keys at all: open",
                flags: &[],
                env: &[],
                keys: &[(None, Pass), (Some("anything"), Pass)],
            },
            Case {
                name: "--api-key and --tenant-api-key",
                flags: &["--api-key", "shared-secret", "--tenant-api-key", "team-red:red-secret"],
                env: &[],
                keys: &[
                    (Some("shared-secret"), Pass),
                    (Some("red-secret"), Unauthorized),
                    (Some("team-red"), Unauthorized),
                    (None, Unauthorized),
                    (Some("wrong"), Unauthorized),
                ],
            },
            Case {
                name: "--tenant-api-key only",
                flags: &["--tenant-api-key", "team-red:red-secret", "--tenant-api-key", "team-blue:blue-secret"],
                env: &[],
                keys: &[
                    (Some("red-secret"), Unauthorized),
                    (Some("blue-secret"), Unauthorized),
                    (None, Unauthorized),
                    (Some("wrong"), Unauthorized),
                ],
            },
            Case {
                name: "control-plane, shared and tenant keys",
                flags: &everything,
                env: &[],
                keys: &[
                    (Some("cp-admin"), Pass),
                    (Some("cp-user"), Refused),
                    (Some("shared-secret"), Unauthorized),
                    (Some("red-secret"), Unauthorized),
                    (Some("ops"), Unauthorized),
                    (None, Unauthorized),
                    (Some("wrong"), Unauthorized),
                ],
            },
            Case {
                name: "control-plane keys only",
                flags: &cp_flags,
                env: &[],
                keys: &[
                    (Some("cp-admin"), Pass),
                    (Some("cp-user"), Refused),
                    (None, Unauthorized),
                    (Some("wrong"), Unauthorized),
                ],
            },
            Case {
                name: "CONTROL_PLANE_API_KEYS and --api-key",
                flags: &["--api-key", "shared-secret"],
                env: &env_cp,
                keys: &[
                    (Some("env-admin"), Pass),
                    (Some("env-user"), Refused),
                    (Some("shared-secret"), Unauthorized),
                    (None, Unauthorized),
                    (Some("wrong"), Unauthorized),
                ],
            },
        ];
        for case in cases {
            let gw = gateway_env(legacy, &w.url(), case.flags, case.env);
            let mut wrong = Vec::new();
            // Refusals first: a request let through may reach the worker a little later,
            // and must not be taken for a refused one that was relayed.
            for pass in [false, true] {
                for route in ADMIN {
                    for (key, want) in case.keys.iter().filter(|(_, want)| (*want == Pass) == pass) {
                        let auth = key.map(bearer);
                        if let Err(e) = admin(&gw, &w, route, auth.as_deref(), *want) {
                            wrong.push(e);
                        }
                    }
                }
            }
            report(case.name, &wrong);
        }
    });
}

/// Malformed `Authorization` values with serving auth on are each a 401 (the scheme name is
/// case-insensitive, the key is not), never reach the worker, and leave the gateway serving.
/// A 401 on a keep-alive connection does not leave the unread body to be parsed as a request.
#[test]
fn malformed_authorization_is_401_and_harmless() {
    both_drivers(|legacy| {
        const KEY: &str = "s3cret-key";
        let w = FakeWorker::start("m");
        let mut gw = gateway(legacy, &w.url(), &["--api-key", KEY]);
        let s = |v: &str| v.as_bytes().to_vec();
        let cases: Vec<(&str, Vec<u8>, u16)> = vec![
            ("Basic scheme", s("Basic czNjcmV0LWtleQ=="), 401),
            ("Basic scheme with the key", s(&format!("Basic {KEY}")), 401),
            ("Bearer without a key", s("Bearer"), 401),
            ("Bearer and a space", s("Bearer "), 401),
            ("empty value", Vec::new(), 401),
            ("two spaces before the key", s(&format!("Bearer  {KEY}")), 401),
            ("the key without a scheme", s(KEY), 401),
            ("Token scheme", s(&format!("Token {KEY}")), 401),
            ("the key and one more byte", s(&format!("Bearer {KEY}x")), 401),
            ("the key less its last byte", s(&format!("Bearer {}", &KEY[..KEY.len() - 1])), 401),
            ("the key in upper case", s(&format!("Bearer {}", KEY.to_uppercase())), 401),
            ("a 20 KB key", s(&format!("Bearer {}", "k".repeat(20 * 1024))), 401),
            ("non-UTF-8 key", b"Bearer \xff\xfe\x80\x81".to_vec(), 401),
            ("the key then a non-UTF-8 byte", [format!("Bearer {KEY}").as_bytes(), &b"\xff"[..]].concat(), 401),
            ("lower-case scheme", s(&format!("bearer {KEY}")), 200),
            ("upper-case scheme", s(&format!("BEARER {KEY}")), 200),
        ];
        let mut wrong = Vec::new();
        for (name, value, want) in &cases {
            if let Err(e) = serving(&gw, &w, "/v1/chat/completions", CHAT, Some(value), *want) {
                wrong.push(format!("{name}: {e}"));
            }
            if !gw.alive() {
                panic!("the gateway died on {name}; log:\n{}", gw.log_text());
            }
        }
        // x-api-key is for provider workers: the chat route reads only Authorization.
        let before = w.requests().len();
        match ask(
            gw.port,
            &raw_request("POST", "/v1/chat/completions", Some(CHAT), None, &[&format!("x-api-key: {KEY}")]),
        ) {
            Ok(r) => {
                if let Err(e) = empty_401(&r) {
                    wrong.push(format!("x-api-key instead of Authorization: {e}"));
                }
            }
            Err(e) => wrong.push(format!("x-api-key instead of Authorization: {e}")),
        }
        if w.requests().len() != before {
            wrong.push("x-api-key instead of Authorization: relayed".into());
        }
        report("malformed Authorization", &wrong);

        // A refused request whose body is itself a well-formed, authorized request: the body
        // must be skipped (or the connection closed), never served as the next request.
        let smuggled = r#"{"model":"m","messages":[{"role":"user","content":"smuggled"}],"tag":"smuggled"}"#;
        let inner = raw_request("POST", "/v1/chat/completions", Some(smuggled), Some(&bearer(KEY)), &[]);
        let mut outer = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            inner.len()
        )
        .into_bytes();
        outer.extend_from_slice(&inner);
        let mut c = connect_with(gw.port, secs(10)).unwrap();
        c.write_all(&outer).unwrap();
        let mut rest = Vec::new();
        let r = read_response(&mut c, &mut rest, false).expect("an answer to the request without a key");
        empty_401(&r).unwrap_or_else(|e| panic!("request without a key: {e}"));
        let follow = r#"{"model":"m","messages":[{"role":"user","content":"follow-up"}]}"#;
        let closing = r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let sent = c.write_all(&raw_request("POST", "/v1/chat/completions", Some(follow), Some(&bearer(KEY)), &[]));
        // Closing the connection after a 401 is fine; serving the follow-up is too.
        if let (true, Ok(r)) = (sent.is_ok(), read_response(&mut c, &mut rest, false)) {
            assert!(!closing, "the 401 said Connection: close, yet the connection served another request");
            assert_eq!(r.status, 200, "the request after a 401 on the same connection: {}", r.text());
            assert_eq!(
                r.json()["sha"].as_str(),
                Some(sha_hex(follow.as_bytes()).as_str()),
                "the answer after a 401 is not the follow-up's: {}",
                r.text()
            );
        }
        // A barrier: by the time a later request has been answered, the smuggled one, had the
        // gateway forwarded it, has reached the worker.
        serving(&gw, &w, "/v1/chat/completions", CHAT, Some(&bearer(KEY)), 200).unwrap();
        let tags = tags_seen(&w);
        assert!(!tags.iter().any(|t| t == "smuggled"), "the body of a refused request was served as a request");
        assert!(gw.alive(), "the gateway died; log:\n{}", gw.log_text());
    });
}

/// Malformed key flags stop the gateway at start with an error that names the flag.
#[test]
fn malformed_key_flags_fail_at_start() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        // The well-formed flags are known and accepted (if not, this fails with the gateway's
        // stderr, and the checks below would be about the wrong error).
        drop(gateway(
            legacy,
            &url,
            &[
                "--api-key",
                "k0",
                "--tenant-api-key",
                "team-red:red-secret",
                "--control-plane-api-keys",
                "ops:Ops:admin:cp-admin",
                "--control-plane-api-keys",
                "dev:Dev:user:cp-user",
            ],
        ));
        let cases: [(Config, &[&str]); 5] = [
            (("tenant key without a colon", &["--tenant-api-key", "nocolon"], &[]), &["--tenant-api-key"]),
            (("unknown role", &["--control-plane-api-keys", "a:b:superuser:k"], &[]), &["--control-plane-api-keys"]),
            (("two fields", &["--control-plane-api-keys", "a:b"], &[]), &["--control-plane-api-keys"]),
            (
                (
                    "unknown role after a good key",
                    &["--control-plane-api-keys", "ops:Ops:admin:cp-admin", "--control-plane-api-keys", "a:b:root:k"],
                    &[],
                ),
                &["--control-plane-api-keys"],
            ),
            (
                (
                    "two fields in CONTROL_PLANE_API_KEYS",
                    &[],
                    &[("CONTROL_PLANE_API_KEYS", "ops:Ops:admin:cp-admin,a:b")],
                ),
                &["--control-plane-api-keys", "CONTROL_PLANE_API_KEYS"],
            ),
        ];
        let mut wrong = Vec::new();
        for ((name, flags, env), names) in cases {
            let mut args = vec!["--worker-urls", url.as_str(), "--cores", "2"];
            args.extend_from_slice(flags);
            let (status, err) = launch_outcome(legacy, &args, env);
            if status.success() {
                wrong.push(format!("{name}: exited with success; stderr: {err}"));
            } else if !names.iter().any(|n| err.contains(n)) {
                wrong.push(format!("{name}: the error does not name {names:?}: {err}"));
            } else if err.contains("unexpected argument") {
                wrong.push(format!("{name}: the flag is unknown: {err}"));
            }
        }
        report("malformed key flags", &wrong);
    });
}

// === Admission ===

fn slow_chat(tag: &str, events: usize, gap_ms: u64) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi {tag}"}}],"stream":true,"fake":"sse","events":{events},"gap_ms":{gap_ms},"tag":"{tag}"}}"#
    )
}

fn quick_chat(tag: &str) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {tag}"}}],"tag":"{tag}"}}"#)
}

/// A chat request of exactly `len` bytes.
fn padded_chat(tag: &str, len: usize) -> String {
    let frame = quick_chat(tag).len() - format!("hi {tag}").len();
    assert!(len > frame);
    let words = "the quick brown fox jumps over a lazy dog ".repeat((len - frame) / 42 + 1);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}],"tag":"{tag}"}}"#,
        &words[..len - frame]
    );
    assert_eq!(body.len(), len);
    body
}

/// Sends `body` to the chat route on a new connection and returns the connection.
fn send(port: u16, body: &str) -> TcpStream {
    let mut s = connect_with(port, secs(60)).unwrap();
    s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
    s
}

/// Reads a streamed answer to the end: Ok when it is a 200 carrying the fake worker's
/// `events` events and `[DONE]`, complete.
fn whole_stream(s: &mut TcpStream, events: usize) -> Result<(), String> {
    let r = read_response(s, &mut Vec::new(), false).map_err(|e| format!("no response: {e}"))?;
    if r.status != 200 {
        return Err(format!("{} {}", r.status, r.text()));
    }
    let want: String = (0..events).map(|i| format!("data: {{\"i\":{i}}}\n\n")).collect::<String>() + "data: [DONE]\n\n";
    if !r.complete || r.text() != want {
        return Err(format!("stream incomplete (complete: {}): {:?}", r.complete, r.text()));
    }
    Ok(())
}

/// The `tag` of every request the worker got, in the order it got them.
fn tags_seen(w: &FakeWorker) -> Vec<String> {
    w.requests()
        .iter()
        .map(|r| {
            let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).unwrap_or_default();
            v["tag"].as_str().unwrap_or("").to_string()
        })
        .collect()
}

fn seen(w: &FakeWorker, tag: &str) -> bool {
    tags_seen(w).iter().any(|t| t == tag)
}

/// Ok when nothing arrives on `s` within `within` and it stays open (a queued request).
fn no_answer_within(s: &mut TcpStream, within: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    let got = s.read(&mut buf);
    s.set_read_timeout(Some(secs(60))).unwrap();
    match got {
        Ok(0) => Err("the connection was closed".into()),
        Ok(n) => {
            let t = String::from_utf8_lossy(&buf[..n]);
            Err(format!("answered: {:?}", t.lines().next().unwrap_or("")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
        Err(e) => Err(format!("read failed: {e}")),
    }
}

/// An admission shed: `status`, the error envelope with `code`, `X-SMG-Error-Code` and
/// `Retry-After: 2`.
fn assert_shed(r: &Response, status: u16, kind: &str, code: &str) {
    assert_eq!(r.status, status, "want a {status} {code}: {}", r.text());
    assert!(
        r.header("content-type").is_some_and(|v| v.starts_with("application/json")),
        "{code}: Content-Type {:?}",
        r.header("content-type")
    );
    let j = r.json();
    assert_eq!(j["error"]["code"].as_str(), Some(code), "{}", r.text());
    assert_eq!(j["error"]["type"].as_str(), Some(kind), "{}", r.text());
    assert!(j["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", r.text());
    assert!(j["error"]["param"].is_null(), "{}", r.text());
    assert_eq!(r.header("x-smg-error-code"), Some(code), "X-SMG-Error-Code");
    assert_eq!(r.header("retry-after"), Some("2"), "Retry-After");
}

/// 64 clients at once, each a slow stream, under --max-concurrent-requests 4: the worker
/// never has more than 4 of them (and does reach 4), and every client gets its whole stream.
#[test]
fn concurrency_cap_holds_for_64_clients() {
    both_drivers(|legacy| {
        const CLIENTS: usize = 64;
        let w = FakeWorker::start("m");
        let gw = gateway(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "4", "--rate-limit-tokens-per-second", "0", "--queue-size", "200"],
        );
        let port = gw.port;
        let barrier = Arc::new(Barrier::new(CLIENTS));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut s = connect_with(port, secs(60)).map_err(|e| format!("client {i}: connect: {e}"))?;
                    s.write_all(
                        post_bytes("/v1/chat/completions", &slow_chat(&format!("c{i}"), 5, 50), &[]).as_bytes(),
                    )
                    .map_err(|e| format!("client {i}: write: {e}"))?;
                    whole_stream(&mut s, 5).map_err(|e| format!("client {i}: {e}"))
                })
            })
            .collect();
        let failed: Vec<String> = clients.into_iter().filter_map(|c| c.join().unwrap().err()).collect();
        let max = w.state.max_in_flight();
        assert!(max <= 4, "the worker had {max} requests at once under --max-concurrent-requests 4");
        assert!(
            failed.is_empty(),
            "{} of {CLIENTS} clients failed; first: {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
        assert_eq!(w.requests().len(), CLIENTS, "the worker got {} requests", w.requests().len());
        assert_eq!(max, 4, "64 clients never had 4 requests at the worker at once");
    });
}

/// With the one slot taken and --queue-size 0, another request is refused at once with 429
/// admission_queue_full and never reaches the worker; the slot serves again afterwards.
#[test]
fn full_queue_is_429_at_once() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0", "--queue-size", "0"],
        );
        let mut held = send(gw.port, &slow_chat("held", 20, 50));
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 1),
            "precondition: the held stream never reached the worker"
        );
        let t0 = Instant::now();
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let body = if path == "/v1/completions" {
                r#"{"model":"m","prompt":"hi","tag":"late"}"#.to_string()
            } else {
                quick_chat("late")
            };
            let r = ask(gw.port, &raw_request("POST", path, Some(&body), None, &[])).unwrap();
            assert_shed(&r, 429, "Too Many Requests", "admission_queue_full");
        }
        let took = t0.elapsed();
        assert!(took < secs(1) / 2, "the refusals took {took:?}: they waited for the slot");
        assert_eq!(w.state.in_flight(), 1, "precondition: the held stream ended before the refusals were checked");
        whole_stream(&mut held, 20).unwrap_or_else(|e| panic!("the held stream: {e}"));
        // "after" is the barrier: once it is answered, what the gateway forwarded before it
        // has reached the worker.
        let r = post(gw.port, "/v1/chat/completions", &quick_chat("after"), &[]);
        assert_eq!(r.status, 200, "after the slot freed: {}", r.text());
        assert!(!seen(&w, "late"), "a refused request reached the worker");
    });
}

/// A request that waits longer than --queue-timeout-secs for the slot gets 503
/// admission_queue_timeout after about that long, and never reaches the worker.
#[test]
fn queue_timeout_is_503() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0", "--queue-timeout-secs", "1"],
        );
        let mut held = send(gw.port, &slow_chat("held", 40, 100));
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 1),
            "precondition: the held stream never reached the worker"
        );
        let t0 = Instant::now();
        let r =
            ask(gw.port, &raw_request("POST", "/v1/chat/completions", Some(&quick_chat("late")), None, &[])).unwrap();
        let took = t0.elapsed();
        assert_shed(&r, 503, "Service Unavailable", "admission_queue_timeout");
        assert!(
            took >= Duration::from_millis(500) && took <= secs(4),
            "the queue timeout of 1 s answered after {took:?}"
        );
        whole_stream(&mut held, 40).unwrap_or_else(|e| panic!("the held stream: {e}"));
        // "after" is the barrier: once it is answered, what the gateway forwarded before it
        // has reached the worker.
        let r = post(gw.port, "/v1/chat/completions", &quick_chat("after"), &[]);
        assert_eq!(r.status, 200, "after the slot freed: {}", r.text());
        assert!(!seen(&w, "late"), "a request that timed out in the queue reached the worker");
    });
}

/// A queued request's body stays unread: the client can write no more of it than socket
/// buffers hold until the request is admitted, and a body that arrives only after admission
/// is read then; both requests are served whole.
#[test]
fn queued_request_body_is_left_unread() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let (gw, mport) = gateway_metrics(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0"],
        );

        // A 100 KB body of which 16 bytes come before admission and the rest after.
        let mut held = send(gw.port, &slow_chat("held", 20, 50));
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 1),
            "precondition: the held stream never reached the worker"
        );
        let body = padded_chat("partial", 100_000);
        let req = post_bytes("/v1/chat/completions", &body, &[]);
        let head_len = req.len() - body.len();
        let mut a = connect_with(gw.port, secs(30)).unwrap();
        a.write_all(&req.as_bytes()[..head_len + 16]).unwrap();
        no_answer_within(&mut a, Duration::from_millis(300))
            .unwrap_or_else(|e| panic!("a request waiting for the slot, its body unsent: {e}"));
        assert!(
            wait_until(secs(5), || queued(mport) == Some(1)),
            "precondition: the request is not in the admission queue ({:?} queued)",
            queued(mport)
        );
        whole_stream(&mut held, 20).unwrap_or_else(|e| panic!("the held stream: {e}"));
        // The rest of the body goes only once the request has left the queue with the slot.
        assert!(
            wait_until(secs(5), || queued(mport) == Some(0)),
            "precondition: the queued request was not admitted when the slot freed ({:?} queued)",
            queued(mport)
        );
        a.write_all(&req.as_bytes()[head_len + 16..]).unwrap();
        let r = read_response(&mut a, &mut Vec::new(), false).expect("an answer once the body was sent");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["len"].as_u64(), Some(100_000), "the worker got {}", r.text());
        assert_eq!(r.json()["sha"].as_str(), Some(sha_hex(body.as_bytes()).as_str()), "the worker got another body");

        // A body larger than socket buffers: while queued, the client's writes block.
        let cap = unread_capacity();
        let len = cap + (8 << 20);
        let mut held = send(gw.port, &slow_chat("held2", 40, 50));
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 1),
            "precondition: the held stream never reached the worker"
        );
        let big = Arc::new(padded_chat("big", len));
        let req = post_bytes("/v1/chat/completions", &big, &[]);
        let head = req[..req.len() - big.len()].to_string();
        let mut b = connect_with(gw.port, secs(60)).unwrap();
        b.write_all(head.as_bytes()).unwrap();
        let written = Arc::new(AtomicUsize::new(0));
        // Writes in a row that timed out (100 ms each, nothing taken): the writer is blocked.
        let stalled = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (mut b, big, written, stalled) =
                (b.try_clone().unwrap(), Arc::clone(&big), Arc::clone(&written), Arc::clone(&stalled));
            b.set_write_timeout(Some(Duration::from_millis(100))).unwrap();
            std::thread::spawn(move || {
                let bytes = big.as_bytes();
                let until = Instant::now() + secs(60);
                let mut at = 0;
                while at < bytes.len() && Instant::now() < until {
                    match b.write(&bytes[at..(at + 65536).min(bytes.len())]) {
                        Ok(n) => {
                            at += n;
                            written.store(at, Ordering::SeqCst);
                            stalled.store(0, Ordering::SeqCst);
                        }
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            stalled.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => return Err(format!("write failed after {at} bytes: {e}")),
                    }
                }
                if at < bytes.len() {
                    return Err(format!("only {at} of {} body bytes were taken", bytes.len()));
                }
                Ok(())
            })
        };
        // Measured once the writes block (300 ms without a byte taken), or the whole body went.
        wait_until(secs(10), || stalled.load(Ordering::SeqCst) >= 3 || written.load(Ordering::SeqCst) == big.len());
        let while_queued = written.load(Ordering::SeqCst);
        assert_eq!(w.state.in_flight(), 1, "precondition: the held stream ended before the queued body was measured");
        assert!(
            while_queued <= cap + (4 << 20),
            "the gateway took {} KB of a queued request's body (socket buffers hold about {} KB here)",
            while_queued >> 10,
            cap >> 10
        );
        whole_stream(&mut held, 40).unwrap_or_else(|e| panic!("the second held stream: {e}"));
        writer.join().unwrap().unwrap_or_else(|e| panic!("the big body after admission: {e}"));
        let r = read_response(&mut b, &mut Vec::new(), false).expect("an answer to the big body");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["len"].as_u64(), Some(len as u64), "the worker got {}", r.text());
        assert_eq!(r.json()["sha"].as_str(), Some(sha_hex(big.as_bytes()).as_str()), "the worker got another body");
    });
}

/// A queued client that hangs up leaves the queue at once: with --queue-size 1 taken by A
/// (a third client is refused 429), A hangs up, and B then waits in the queue instead of
/// being refused, and is served when the slot frees. A never reaches the worker.
#[test]
fn a_client_hanging_up_leaves_the_queue() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let (gw, mport) = gateway_metrics(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0", "--queue-size", "1"],
        );
        // A, B and C on one shard: the place A frees is the one B needs, whether the queue
        // is the shard's or the gateway's.
        let groups = conns_by_shard(&gw, 8, |g| g.iter().any(|c| c.len() >= 3));
        let mut trio = groups.into_iter().find(|g| g.len() >= 3).unwrap();
        let (mut c, mut b, mut a) = (trio.pop().unwrap(), trio.pop().unwrap(), trio.pop().unwrap());
        let mut held = send(gw.port, &slow_chat("held", 40, 50));
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 1),
            "precondition: the held stream never reached the worker"
        );
        a.write_all(post_bytes("/v1/chat/completions", &quick_chat("A"), &[]).as_bytes()).unwrap();
        no_answer_within(&mut a, Duration::from_millis(300)).unwrap_or_else(|e| panic!("A, queued: {e}"));
        c.write_all(post_bytes("/v1/chat/completions", &quick_chat("C"), &[]).as_bytes()).unwrap();
        let r = read_response(&mut c, &mut Vec::new(), false).expect("C, past the queue size: an answer");
        assert_shed(&r, 429, "Too Many Requests", "admission_queue_full");
        drop(a);
        // Right, A's place frees as soon as the gateway sees the hang-up; wrong, A keeps it
        // until the held stream's slot frees (its 2 s, most of which is still to come).
        assert!(
            wait_until(patience(Duration::from_millis(800)), || queued(mport) == Some(0)),
            "A hung up, yet the admission queue still holds {:?}",
            queued(mport)
        );
        b.write_all(post_bytes("/v1/chat/completions", &quick_chat("B"), &[]).as_bytes()).unwrap();
        no_answer_within(&mut b, Duration::from_millis(300))
            .unwrap_or_else(|e| panic!("B, after queued A hung up: want B queued, but {e}"));
        assert_eq!(w.state.in_flight(), 1, "precondition: the held stream ended before B was checked");
        whole_stream(&mut held, 40).unwrap_or_else(|e| panic!("the held stream: {e}"));
        let r = read_response(&mut b, &mut Vec::new(), false).expect("B: an answer once the slot freed");
        assert_eq!(r.status, 200, "B: {}", r.text());
        // "after" is the barrier: once it is answered, whatever the gateway forwarded before
        // it (A, had it been) has reached the worker.
        let r = post(gw.port, "/v1/chat/completions", &quick_chat("after"), &[]);
        assert_eq!(r.status, 200, "after: {}", r.text());
        let tags = tags_seen(&w);
        assert_eq!(tags, ["held", "B", "after"], "what the worker got");
    });
}

/// Requests queued on one shard are admitted in the order they arrived.
#[test]
fn queued_requests_are_admitted_in_arrival_order() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let (gw, mport) = gateway_metrics(
            legacy,
            &w.url(),
            &["--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0"],
        );
        let groups = conns_by_shard(&gw, 8, |g| g.iter().any(|c| c.len() >= 3));
        let mut trio = groups.into_iter().find(|g| g.len() >= 3).unwrap();
        trio.truncate(3);
        for round in 0..2 {
            let held_tag = format!("held{round}");
            let mut held = send(gw.port, &slow_chat(&held_tag, 20, 50));
            assert!(
                wait_until(secs(5), || w.state.in_flight() == 1 && seen(&w, &held_tag)),
                "precondition: the held stream never reached the worker"
            );
            let tags: Vec<String> = (0..3).map(|i| format!("r{round}-q{i}")).collect();
            // Each one sent once the one before is in the queue: that is their arrival order.
            for (k, (c, tag)) in trio.iter_mut().zip(&tags).enumerate() {
                c.write_all(post_bytes("/v1/chat/completions", &quick_chat(tag), &[]).as_bytes()).unwrap();
                assert!(
                    wait_until(secs(5), || queued(mport) == Some(k + 1)),
                    "round {round}: {tag} never joined the admission queue ({:?} queued)",
                    queued(mport)
                );
            }
            assert_eq!(w.state.in_flight(), 1, "precondition: the held stream ended before the three were queued");
            assert!(tags.iter().all(|t| !seen(&w, t)), "a request passed the full slot");
            whole_stream(&mut held, 20).unwrap_or_else(|e| panic!("the held stream: {e}"));
            for (c, tag) in trio.iter_mut().zip(&tags) {
                let r = read_response(c, &mut Vec::new(), false).unwrap_or_else(|e| panic!("{tag}: {e}"));
                assert_eq!(r.status, 200, "{tag}: {}", r.text());
            }
            let order: Vec<String> = tags_seen(&w).into_iter().filter(|t| tags.contains(t)).collect();
            assert_eq!(order, tags, "round {round}: the order the worker got the queued requests in");
        }
    });
}

/// ~2,000 requests that end every way (answers, worker errors, cut streams, clients leaving
/// mid-stream or at once, request timeouts) return every slot: afterwards exactly 4 slow
/// streams are in flight at once again, and a fifth request waits.
#[test]
fn no_slot_is_lost_to_errors_aborts_or_timeouts() {
    both_drivers(|legacy| {
        const TOTAL: usize = 2000;
        const STALLS: usize = 6;
        let w = FakeWorker::start("m");
        let (gw, mport) = gateway_metrics(
            legacy,
            &w.url(),
            &[
                "--max-concurrent-requests",
                "4",
                "--rate-limit-tokens-per-second",
                "0",
                "--request-timeout-secs",
                "1",
                // The faults here are deliberate: a retry or an open breaker would hide
                // what this test counts (each request's own permit).
                "--disable-retries",
                "--disable-circuit-breaker",
            ],
        );
        let port = gw.port;
        let next = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + secs(120);
        let one = |i: usize| -> Result<(), String> {
            let chat = |extra: &str| {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}],"tag":"m{i}"{extra}}}"#)
            };
            let (body, kind) = match i % 10 {
                0..=3 => (chat(""), "echo"),
                4 => (chat(r#","fake":"error","status":500"#), "error 500"),
                5 => (chat(r#","stream":true,"fake":"sse","events":3,"gap_ms":2"#), "stream"),
                6 => (chat(r#","stream":true,"fake":"sse","events":20,"gap_ms":20"#), "leave mid-stream"),
                7 => (chat(r#","stream":true,"fake":"die","events":2,"gap_ms":2"#), "cut stream"),
                8 => (chat(""), "leave at once"),
                _ => (chat(r#","fake":"error","status":400"#), "error 400"),
            };
            let fail = |why: String| Err(format!("request {i} ({kind}): {why}"));
            let mut s = match connect_with(port, secs(30)) {
                Ok(s) => s,
                Err(e) => return fail(format!("connect: {e}")),
            };
            if let Err(e) = s.write_all(post_bytes("/v1/chat/completions", &body, &[]).as_bytes()) {
                return fail(format!("write: {e}"));
            }
            match kind {
                "leave at once" => return Ok(()),
                "leave mid-stream" => {
                    let mut raw = Vec::new();
                    while !raw.windows(5).any(|x| x == b"data:") {
                        if let Err(e) = fill(&mut s, &mut raw) {
                            return fail(format!(
                                "first event never came: {e}; got {:?}",
                                String::from_utf8_lossy(&raw)
                            ));
                        }
                    }
                    if !raw.starts_with(b"HTTP/1.1 200") {
                        return fail(format!("{:?}", String::from_utf8_lossy(&raw)));
                    }
                    return Ok(());
                }
                _ => {}
            }
            let r = match read_response(&mut s, &mut Vec::new(), false) {
                Ok(r) => r,
                Err(e) => return fail(format!("no response: {e}")),
            };
            let ok = match kind {
                "echo" => r.status == 200 && r.complete,
                "error 500" => r.status == 500,
                "error 400" => r.status == 400,
                "stream" => r.status == 200 && r.complete && r.text().ends_with("data: [DONE]\n\n"),
                _ => r.status == 200 && !r.complete,
            };
            if !ok {
                return fail(format!("{} (complete: {}) {:?}", r.status, r.complete, r.text()));
            }
            Ok(())
        };
        let stalls = {
            let (wrong, stop) = (Arc::clone(&wrong), Arc::clone(&stop));
            std::thread::spawn(move || {
                for k in 0..STALLS {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let body = format!(
                        r#"{{"model":"m","messages":[{{"role":"user","content":"stall {k}"}}],"fake":"hang"}}"#
                    );
                    match ask(port, &raw_request("POST", "/v1/chat/completions", Some(&body), None, &[])) {
                        Ok(r) if r.status == 504 => {}
                        Ok(r) => {
                            wrong.lock().unwrap().push(format!("stall {k}: want 504, got {} {:?}", r.status, r.text()))
                        }
                        Err(e) => wrong.lock().unwrap().push(format!("stall {k}: {e}")),
                    }
                }
            })
        };
        std::thread::scope(|scope| {
            for _ in 0..7 {
                let (next, done, wrong) = (Arc::clone(&next), Arc::clone(&done), Arc::clone(&wrong));
                let one = &one;
                scope.spawn(move || loop {
                    if wrong.lock().unwrap().len() >= 20 || Instant::now() > deadline {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= TOTAL {
                        return;
                    }
                    if let Err(e) = one(i) {
                        wrong.lock().unwrap().push(e);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        stop.store(true, Ordering::SeqCst);
        stalls.join().unwrap();
        {
            let wrong = wrong.lock().unwrap();
            assert!(
                wrong.is_empty(),
                "{} requests went wrong (a run stops soon after 20):\n{}",
                wrong.len(),
                wrong.join("\n")
            );
        }
        assert_eq!(
            done.load(Ordering::SeqCst),
            TOTAL,
            "only {} requests were done within {:?}",
            done.load(Ordering::SeqCst),
            secs(120)
        );
        assert!(
            wait_until(secs(5), || w.state.in_flight() == 0),
            "the worker still has {} requests open after every client is done",
            w.state.in_flight()
        );

        // Exactly 4 at once again: four slow streams all get a slot, and two more requests wait.
        w.state.reset_max_in_flight();
        let mut streams: Vec<TcpStream> =
            (0..4).map(|k| send(port, &slow_chat(&format!("after{k}"), 24, 25))).collect();
        assert!(
            wait_until(secs(1) / 2, || w.state.in_flight() == 4),
            "after the mixed traffic only {} of 4 slow streams got a slot at once: a slot leaked",
            w.state.in_flight()
        );
        let mut waiting: Vec<TcpStream> = (0..2).map(|k| send(port, &quick_chat(&format!("waiting{k}")))).collect();
        assert!(
            wait_until(secs(5), || queued(mport) == Some(2)),
            "after the mixed traffic the two requests past the cap do not wait: {:?} queued, {} at the worker",
            queued(mport),
            w.state.in_flight()
        );
        for (k, s) in streams.iter_mut().enumerate() {
            whole_stream(s, 24).unwrap_or_else(|e| panic!("slow stream {k} after the mixed traffic: {e}"));
        }
        for (k, s) in waiting.iter_mut().enumerate() {
            let r = read_response(s, &mut Vec::new(), false).unwrap_or_else(|e| panic!("waiting request {k}: {e}"));
            assert_eq!(r.status, 200, "waiting request {k}: {}", r.text());
        }
        assert_eq!(
            w.state.max_in_flight(),
            4,
            "requests at the worker at once after the mixed traffic (want the cap, 4)"
        );
    });
}

/// The cap is the gateway's, not each shard's: 8 slow streams, 4 accepted by each shard,
/// under --max-concurrent-requests 2 never have more than 2 at the worker, and all finish.
#[test]
fn the_cap_is_gateway_wide_across_shards() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &["--max-concurrent-requests", "2", "--rate-limit-tokens-per-second", "0"]);
        let groups = conns_by_shard(&gw, 40, |g| g.len() >= 2 && g.iter().all(|c| c.len() >= 4));
        let conns: Vec<TcpStream> = groups.into_iter().flat_map(|g| g.into_iter().take(4)).collect();
        assert_eq!(conns.len(), 8);
        let barrier = Arc::new(Barrier::new(conns.len()));
        let clients: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    s.write_all(
                        post_bytes("/v1/chat/completions", &slow_chat(&format!("s{i}"), 10, 50), &[]).as_bytes(),
                    )
                    .map_err(|e| format!("client {i}: write: {e}"))?;
                    whole_stream(&mut s, 10).map_err(|e| format!("client {i}: {e}"))
                })
            })
            .collect();
        let failed: Vec<String> = clients.into_iter().filter_map(|c| c.join().unwrap().err()).collect();
        let max = w.state.max_in_flight();
        assert!(max <= 2, "the worker had {max} requests at once under --max-concurrent-requests 2 on two shards");
        assert!(failed.is_empty(), "{} of 8 clients failed: {failed:?}", failed.len());
        assert_eq!(max, 2, "8 clients never had 2 requests at the worker at once");
    });
}
