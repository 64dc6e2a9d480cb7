//! The Responses API's MCP tool loop on gRPC workers, through the real binary: a small MCP
//! server over Streamable HTTP (tests/e2e/mcp_server.py, JSON and SSE answers) and
//! `smg-sim --grpc` as an agent model (it calls `get_weather`, then answers quoting the
//! tool's output). The gateway lists the tools, runs the call, feeds the output back and
//! returns `mcp_list_tools`, `mcp_call` and the messages; streamed, their events in order.
// A test's threads are not shards: they read the clock and wait.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::responses::*;
use support::sim::{grpc_gateway as gateway, Sim};
use support::*;

const MODEL: &str = "Qwen/Qwen3-8B";

fn agent() -> Sim {
    Sim::start(
        MODEL,
        &["--grpc", "--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "6", "--tool-call-markup", "qwen"],
    )
}

/// The test MCP server, stopped on drop.
struct McpServer {
    child: Child,
    port: u16,
}

impl McpServer {
    fn start(sse: bool) -> McpServer {
        McpServer::start_with(sse, &[])
    }

    fn start_with(sse: bool, extra: &[&str]) -> McpServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/mcp_server.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(extra).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if sse {
            cmd.arg("--sse");
        }
        let mut child = cmd.spawn().expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening ").expect("the MCP server's port").parse().unwrap();
        McpServer { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every message the server got: (method, session, authorization, x-team header).
    fn log(&self) -> Vec<Value> {
        get(self.port, "/log").json().as_array().unwrap().iter().cloned().collect()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mcp_tool(url: &str, extra: &str) -> String {
    format!(
        r#"{{"type":"mcp","server_label":"wx","server_url":"{url}","require_approval":"never","authorization":"tok-1","headers":{{"X-Team":"blue"}}{extra}}}"#
    )
}

fn turn(tools: &str, extra: &str) -> String {
    format!(r#"{{"model":"{MODEL}","input":"Weather?","tools":[{tools}]{extra}}}"#)
}

fn types(v: &Value) -> Vec<String> {
    v["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap().to_string()).collect()
}

/// A stream's events' data, in order (names checked equal to `type`, numbers contiguous).
fn events(r: &Response) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .split_terminator("\n\n")
        .enumerate()
        .map(|(i, e)| {
            let mut lines = e.lines();
            let name = lines.next().unwrap().strip_prefix("event: ").unwrap().to_string();
            let data: Value = sonic_rs::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"].as_str(), Some(name.as_str()));
            assert_eq!(data["sequence_number"].as_u64(), Some(i as u64));
            data
        })
        .collect()
}

/// The loop's output: the listing, the model's first words, the call with the tool's
/// output, and the answer that quotes it (so the output reached the engine).
fn check_loop_output(v: &Value) {
    assert_eq!(types(v), ["mcp_list_tools", "message", "mcp_call", "message"], "{v:?}");
    let out = v["output"].as_array().unwrap();
    let names: Vec<&str> = out[0]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["get_weather", "add", "broken"]);
    assert_eq!(out[0]["server_label"].as_str(), Some("wx"));
    let call = &out[2];
    assert_eq!(call["name"].as_str(), Some("get_weather"));
    assert_eq!(call["status"].as_str(), Some("completed"));
    let city =
        sonic_rs::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap()["city"].as_str().unwrap().to_string();
    let said = format!("It is 21 C and sunny in {city}.");
    assert_eq!(call["output"].as_str(), Some(said.as_str()));
    let answer = out[3]["content"][0]["text"].as_str().unwrap();
    assert!(answer.contains(&said), "the tool's output reached the engine: {answer}");
    assert_eq!(v["status"].as_str(), Some("completed"));
    // The server's credentials are sent, never echoed.
    let tool = &v["tools"][0];
    assert_eq!(tool["type"].as_str(), Some("mcp"));
    assert!(tool.get("authorization").is_none() && tool.get("headers").is_none(), "{tool:?}");
}

#[test]
fn the_tool_loop_runs_each_call_and_answers_with_its_output() {
    both_drivers(|legacy| {
        for sse in [false, true] {
            let mcp = McpServer::start(sse);
            let sim = agent();
            let gw = gateway(legacy, &[&sim], &[]);
            let tools = mcp_tool(&mcp.url(), "");
            let v = ok(&post(gw.port, "/v1/responses", &turn(&tools, ""), &[]));
            check_loop_output(&v);
            // Every message carried the authorization and the headers; after initialize,
            // the session; the loop listed, then called.
            let log = mcp.log();
            let methods: Vec<&str> = log.iter().map(|m| m["method"].as_str().unwrap()).collect();
            assert_eq!(methods, ["initialize", "notifications/initialized", "tools/list", "tools/call"], "sse {sse}");
            for m in &log {
                assert_eq!(m["authorization"].as_str(), Some("Bearer tok-1"), "{m:?}");
                assert_eq!(m["headers"]["x-team"].as_str(), Some("blue"), "{m:?}");
            }
            assert!(log[1..].iter().all(|m| m["session"].as_str() == Some("sess-1")), "{log:?}");
            // Stored as answered, credentials left out.
            let id = v["id"].as_str().unwrap();
            assert_eq!(ok(&get(gw.port, &format!("/v1/responses/{id}"))), v);

            // Streamed: the listing's, the call's and the messages' events, in order.
            let ev = events(&post(gw.port, "/v1/responses", &turn(&tools, r#","stream":true"#), &[]));
            let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
            let mcp_kinds: Vec<&str> = kinds.iter().copied().filter(|k| k.contains("mcp")).collect();
            assert_eq!(
                mcp_kinds,
                [
                    "response.mcp_list_tools.in_progress",
                    "response.mcp_list_tools.completed",
                    "response.mcp_call.in_progress",
                    "response.mcp_call_arguments.delta",
                    "response.mcp_call_arguments.done",
                    "response.mcp_call.completed"
                ],
                "{kinds:?}"
            );
            let at = |k: &str| kinds.iter().position(|x| *x == k).unwrap();
            assert!(at("response.created") < at("response.mcp_list_tools.in_progress"));
            assert!(
                at("response.mcp_call.completed")
                    < kinds.iter().rposition(|x| *x == "response.output_text.delta").unwrap()
            );
            assert_eq!(*kinds.last().unwrap(), "response.completed");
            let done = &ev.last().unwrap()["response"];
            check_loop_output(done);
            assert_eq!(done["id"], ev[0]["response"]["id"]);

            // A follow-up chains off the MCP turn (its calls replayed as the model saw them).
            let next = format!(
                r#"{{"model":"{MODEL}","input":"And tomorrow?","previous_response_id":"{id}","tools":[{tools}]}}"#
            );
            let v = ok(&post(gw.port, "/v1/responses", &next, &[]));
            assert_eq!(v["status"].as_str(), Some("completed"), "{v:?}");
        }
    });
}

#[test]
fn allowed_tools_narrow_the_list_and_configured_servers_are_named_by_label() {
    both_drivers(|legacy| {
        let mcp = McpServer::start(false);
        let sim = agent();
        let dir = tempfile::Builder::new().prefix("smg-mcp-").tempdir().unwrap();
        let cfg = dir.path().join("mcp.yaml");
        let yaml = format!("servers:\n  - name: configured\n    protocol: streamable\n    url: {}\n    token: cfg-token\n    required: false\n", mcp.url());
        std::fs::write(&cfg, yaml).unwrap();
        let gw = gateway(legacy, &[&sim], &["--mcp-config-path", cfg.to_str().unwrap()]);
        // Only `add` offered: the model's call of get_weather names no tool it was offered,
        // so it stays text (the parsers' rule), and nothing is run.
        let tools = mcp_tool(&mcp.url(), r#","allowed_tools":["add"]"#);
        let v = ok(&post(gw.port, "/v1/responses", &turn(&tools, ""), &[]));
        assert_eq!(types(&v), ["mcp_list_tools", "message"], "{v:?}");
        assert!(v["output"][1]["content"][0]["text"].as_str().unwrap().contains("get_weather"));
        let listed: Vec<&str> =
            v["output"][0]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(listed, ["add"]);
        assert!(mcp.log().iter().all(|m| m["method"].as_str() != Some("tools/call")));
        // A configured server by its label, with its token.
        let v = ok(&post(gw.port, "/v1/responses", &turn(r#"{"type":"mcp","server_label":"configured"}"#, ""), &[]));
        assert_eq!(types(&v), ["mcp_list_tools", "message", "mcp_call", "message"], "{v:?}");
        assert_eq!(v["output"][2]["server_label"].as_str(), Some("configured"));
        assert_eq!(mcp.log().last().unwrap()["authorization"].as_str(), Some("Bearer cfg-token"));
    });
}

#[test]
fn the_loop_is_bounded_and_failures_are_named() {
    both_drivers(|legacy| {
        let mcp = McpServer::start(false);
        let sim = agent();
        let gw = gateway(legacy, &[&sim], &[]);
        // No call allowed: the call is reported failed and the response incomplete.
        let tools = mcp_tool(&mcp.url(), "");
        let v = ok(&post(gw.port, "/v1/responses", &turn(&tools, r#","max_tool_calls":0"#), &[]));
        assert_eq!(v["status"].as_str(), Some("incomplete"), "{v:?}");
        assert_eq!(v["incomplete_details"]["reason"].as_str(), Some("max_tool_calls"));
        let call =
            v["output"].as_array().unwrap().iter().find(|i| i["type"].as_str() == Some("mcp_call")).unwrap().clone();
        assert_eq!(call["status"].as_str(), Some("failed"));
        assert!(call["error"].as_str().unwrap().contains("limit"), "{call:?}");
        assert!(mcp.log().iter().all(|m| m["method"].as_str() != Some("tools/call")), "nothing was run");
        let ev = events(&post(gw.port, "/v1/responses", &turn(&tools, r#","max_tool_calls":0,"stream":true"#), &[]));
        let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert!(kinds.contains(&"response.mcp_call.failed"), "{kinds:?}");
        assert_eq!(*kinds.last().unwrap(), "response.incomplete");

        let served = sim.served();
        let p = |tools: &str| post(gw.port, "/v1/responses", &turn(tools, ""), &[]);
        let code = |r: Response, status: u16| {
            assert_eq!(r.status, status, "{}", r.text());
            r.json()["error"]["code"].as_str().unwrap().to_string()
        };
        // A server that does not answer.
        let down = format!("http://127.0.0.1:{}/mcp", free_port());
        assert_eq!(code(p(&mcp_tool(&down, "")), 424), "mcp_list_tools_failed");
        // A label neither sent with a URL nor configured.
        assert_eq!(code(p(r#"{"type":"mcp","server_label":"nowhere"}"#), 400), "invalid_request_error");
        assert_eq!(sim.served(), served, "nothing generated for a refused turn");
        ok(&p(&tools));
    });
}

/// A test CA and a certificate it signed for `localhost` and 127.0.0.1 (openssl), in a
/// directory of its own, removed when the test is done: (the directory, the CA, the
/// certificate, its key).
fn certificate() -> (tempfile::TempDir, String, String, String) {
    let scratch = tempfile::Builder::new().prefix("smg-mcp-tls-").tempdir().unwrap();
    let dir = scratch.path();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    let steps: [Vec<String>; 3] = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=smg-test-ca", "-keyout"]
            .iter()
            .map(|s| s.to_string())
            .chain([p("ca.key"), "-out".into(), p("ca.pem")])
            .collect(),
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout"]
            .iter()
            .map(|s| s.to_string())
            .chain([p("key.pem"), "-out".into(), p("leaf.csr")])
            .collect(),
        ["x509", "-req", "-days", "1", "-CAcreateserial", "-in"]
            .iter()
            .map(|s| s.to_string())
            .chain([p("leaf.csr"), "-CA".into(), p("ca.pem"), "-CAkey".into(), p("ca.key")])
            .chain(["-extfile".into(), p("san.ext"), "-out".into(), p("cert.pem")])
            .collect(),
    ];
    for args in steps {
        let ok = Command::new("openssl").args(&args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        assert!(ok.expect("openssl").success(), "openssl {args:?}");
    }
    let (ca, cert, key) = (p("ca.pem"), p("cert.pem"), p("key.pem"));
    (scratch, ca, cert, key)
}

#[test]
fn an_https_server_is_reached_through_tls() {
    let (_dir, ca, cert, key) = certificate();
    both_drivers(|legacy| {
        let mcp = McpServer::start_with(false, &["--tls-cert", &cert, "--tls-key", &key]);
        let sim = agent();
        let (mut cmd, port) = launch_command(
            legacy,
            &["--worker-urls", &sim.grpc_url(), "--cores", "2", "--health-check-interval-secs", "1"],
        );
        // The test CA is the only root the gateway trusts.
        cmd.env("SSL_CERT_FILE", &ca).env_remove("HTTPS_PROXY").env_remove("https_proxy");
        let gw = Gateway::spawn(cmd, port, "gateway");
        gw.ready_workers(1);
        let url = format!("https://localhost:{}/mcp", mcp.port);
        let v = ok(&post(gw.port, "/v1/responses", &turn(&mcp_tool(&url, ""), ""), &[]));
        // The listing and the call's output came from the server, over TLS.
        check_loop_output(&v);
        // Plain HTTP to a TLS server is refused by it: the listing fails, named.
        let plain = format!("http://127.0.0.1:{}/mcp", mcp.port);
        let r = post(gw.port, "/v1/responses", &turn(&mcp_tool(&plain, ""), ""), &[]);
        assert_eq!(r.status, 424, "{}", r.text());
    });
}

#[test]
fn a_call_that_needs_approval_waits_for_the_clients_answer() {
    both_drivers(|legacy| {
        let mcp = McpServer::start(false);
        let sim = agent();
        let gw = gateway(legacy, &[&sim], &[]);
        let tools =
            format!(r#"{{"type":"mcp","server_label":"wx","server_url":"{}","require_approval":"always"}}"#, mcp.url());
        let calls = |mcp: &McpServer| mcp.log().iter().filter(|m| m["method"].as_str() == Some("tools/call")).count();
        for stream in [false, true] {
            let before = calls(&mcp);
            // The model's call is asked about, not run; the turn ends there.
            let body = turn(&tools, &format!(r#","stream":{stream}"#));
            let r = post(gw.port, "/v1/responses", &body, &[]);
            let v = if stream { events(&r).last().unwrap()["response"].clone() } else { ok(&r) };
            assert_eq!(types(&v), ["mcp_list_tools", "message", "mcp_approval_request"], "{v:?}");
            let request = &v["output"][2];
            assert_eq!(request["name"].as_str(), Some("get_weather"));
            assert_eq!(request["server_label"].as_str(), Some("wx"));
            assert_eq!(calls(&mcp), before, "nothing runs before the client approves");
            let (id, asked) = (v["id"].as_str().unwrap(), request["id"].as_str().unwrap());
            // Approved: the call runs, and the model answers with its output.
            let answer = |approve: bool| {
                format!(
                    r#"{{"model":"{MODEL}","previous_response_id":"{id}","tools":[{tools}],"stream":{stream},"input":[{{"type":"mcp_approval_response","approval_request_id":"{asked}","approve":{approve}}}]}}"#
                )
            };
            let r = post(gw.port, "/v1/responses", &answer(true), &[]);
            let v = if stream { events(&r).last().unwrap()["response"].clone() } else { ok(&r) };
            assert_eq!(types(&v), ["mcp_list_tools", "mcp_call", "message"], "{v:?}");
            let call = &v["output"][1];
            assert_eq!(call["approval_request_id"].as_str(), Some(asked));
            assert_eq!(call["status"].as_str(), Some("completed"));
            let said = call["output"].as_str().unwrap();
            assert!(v["output"][2]["content"][0]["text"].as_str().unwrap().contains(said), "{v:?}");
            assert_eq!(calls(&mcp), before + 1);
            // Refused: not run; the model hears so.
            let r = post(gw.port, "/v1/responses", &answer(false), &[]);
            let v = if stream { events(&r).last().unwrap()["response"].clone() } else { ok(&r) };
            assert_eq!(v["output"][1]["status"].as_str(), Some("failed"), "{v:?}");
            assert!(v["output"][1]["error"].as_str().unwrap().contains("not approved"));
            assert_eq!(calls(&mcp), before + 1);
        }
        // An answer to a request the history does not hold.
        let body = format!(
            r#"{{"model":"{MODEL}","tools":[{tools}],"input":[{{"type":"mcp_approval_response","approval_request_id":"mcpr_nope","approve":true}}]}}"#
        );
        let r = post(gw.port, "/v1/responses", &body, &[]);
        assert_eq!(r.status, 400, "{}", r.text());
    });
}
