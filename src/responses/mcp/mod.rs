//! MCP (Model Context Protocol) servers for the Responses API's `mcp` tools: the gateway
//! lists a server's tools, offers them to the model, and runs each call the model makes
//! (the loop: src/serve/grpc/mcp_loop.rs). Messages are JSON-RPC over Streamable HTTP
//! (`rpc.rs`, `http.rs`; an https:// server through the egress thread's TLS), sent by one thread, `smg-mcp` (tokio, never a shard: a call may
//! take seconds), which shards ask by message ([`Mcp::list`], [`Mcp::call`]).
//!
//! A server comes from the request (`server_url`, `authorization`, `headers`) or, by its
//! `server_label`, from `--mcp-config-path` (SMG's YAML: `servers: [{name, protocol:
//! streamable, url, token, required}]`). `authorization` and `headers` go with every message.

mod http;
pub(crate) mod rpc;
mod server;

use std::time::Duration;

use serde::Deserialize;
use sonic_rs::Value;

pub(crate) use rpc::Tool;
pub(crate) use server::{McpUrl, Server};

/// `--mcp-config-path`: SMG's file.
#[derive(Debug, Clone, Deserialize)]
pub struct McpConfig {
    #[serde(default)]
    pub servers: Vec<ConfiguredServer>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConfiguredServer {
    pub name: String,
    #[serde(default)]
    pub protocol: Option<String>,
    pub url: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub required: bool,
}

impl McpConfig {
    /// Reads and checks the file: each server streamable HTTP with an http:// URL.
    pub fn load(path: &std::path::Path) -> Result<McpConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--mcp-config-path {}: {e}", path.display()))?;
        let cfg: McpConfig =
            serde_yaml::from_str(&text).map_err(|e| format!("--mcp-config-path {}: {e}", path.display()))?;
        for s in &cfg.servers {
            match s.protocol.as_deref() {
                None | Some("streamable") | Some("streamable_http") | Some("http") => {}
                Some(p) => {
                    return Err(format!(
                        "--mcp-config-path: server '{}': protocol '{p}' is not served (streamable is)",
                        s.name
                    ))
                }
            }
            let url = s.url.as_deref().ok_or_else(|| format!("--mcp-config-path: server '{}' has no url", s.name))?;
            McpUrl::parse(url).map_err(|e| format!("--mcp-config-path: {e}"))?;
        }
        Ok(cfg)
    }

    pub(crate) fn server(&self, label: &str) -> Option<Server> {
        let s = self.servers.iter().find(|s| s.name == label)?;
        let url = McpUrl::parse(s.url.as_deref()?).ok()?;
        let headers = s.token.iter().map(|t| ("Authorization".to_string(), format!("Bearer {t}"))).collect();
        Some(Server { label: s.name.clone(), url, headers })
    }
}

/// A server's tools, and the session they were listed in.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub session: Option<String>,
    pub tools: Vec<Tool>,
}

/// What a call gave the model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Called {
    Output(String),
    /// The tool or the server failed: the message the model and the client get.
    Failed(String),
}

enum Ask {
    List {
        server: Server,
        within: Duration,
        reply: flume::Sender<Result<Listed, String>>,
    },
    Call {
        server: Server,
        session: Option<String>,
        name: String,
        arguments: Value,
        within: Duration,
        reply: flume::Sender<Called>,
    },
}

/// The shards' way to the MCP thread.
#[derive(Clone)]
pub struct Mcp {
    tx: flume::Sender<Ask>,
}

/// Most pages of `tools/list` read from one server.
const MAX_PAGES: usize = 20;

// === impl Mcp ===

impl Mcp {
    /// Starts the MCP thread (it waits for work at no cost).
    pub fn start() -> Result<Mcp, String> {
        let (tx, rx) = flume::unbounded::<Ask>();
        std::thread::Builder::new()
            .name("smg-mcp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        crate::error!("MCP thread: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    // https:// servers: the egress thread's loopback port per origin, each
                    // connection to it piped to TLS (proxy, roots and SNI as for providers).
                    let mut egress: Option<crate::egress::Egress> = None;
                    while let Ok(ask) = rx.recv_async().await {
                        let url = match &ask {
                            Ask::List { server, .. } | Ask::Call { server, .. } => &server.url,
                        };
                        let to = match through(&mut egress, url) {
                            Ok(to) => to,
                            Err(e) => {
                                match ask {
                                    Ask::List { reply, .. } => drop(reply.send(Err(e))),
                                    Ask::Call { reply, .. } => drop(reply.send(Called::Failed(e))),
                                }
                                continue;
                            }
                        };
                        tokio::spawn(async move {
                            match ask {
                                Ask::List { server, within, reply } => {
                                    let _ = reply.send(list(&server, to, within).await);
                                }
                                Ask::Call { server, session, name, arguments, within, reply } => {
                                    let called = call(&server, to, session.as_deref(), &name, &arguments, within).await;
                                    let _ = reply.send(called);
                                }
                            }
                        });
                    }
                });
            })
            .map_err(|e| format!("MCP thread: {e}"))?;
        Ok(Mcp { tx })
    }

    /// The server's tools (a new session), within `within`.
    pub(crate) async fn list(&self, server: Server, within: Duration) -> Result<Listed, String> {
        let (reply, rx) = flume::bounded(1);
        self.tx.send(Ask::List { server, within, reply }).map_err(|_| "the MCP thread is gone".to_string())?;
        rx.recv_async().await.unwrap_or_else(|_| Err("the MCP thread dropped the call".into()))
    }

    /// Runs one tool call, within `within`.
    pub(crate) async fn call(
        &self,
        server: Server,
        session: Option<String>,
        name: String,
        arguments: Value,
        within: Duration,
    ) -> Called {
        let (reply, rx) = flume::bounded(1);
        if self.tx.send(Ask::Call { server, session, name, arguments, within, reply }).is_err() {
            return Called::Failed("the MCP thread is gone".into());
        }
        rx.recv_async().await.unwrap_or_else(|_| Called::Failed("the MCP thread dropped the call".into()))
    }
}

/// Where the MCP thread connects for `url`: its host, or for https:// the egress thread's
/// loopback port for its origin (the egress thread started at the first one).
fn through(egress: &mut Option<crate::egress::Egress>, url: &McpUrl) -> Result<Option<std::net::SocketAddr>, String> {
    if !url.tls {
        return Ok(None);
    }
    if egress.is_none() {
        *egress = Some(crate::egress::Egress::start()?);
    }
    let origin = crate::egress::Origin { host: url.host.clone(), port: url.port };
    egress.as_mut().expect("started").port(&origin).map(Some)
}

async fn list(server: &Server, to: Option<std::net::SocketAddr>, within: Duration) -> Result<Listed, String> {
    let deadline = tokio::time::Instant::now() + within;
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
    let init = http::post(server, to, None, &rpc::initialize(1), Some(1), left()).await?;
    if let Some(rpc::Reply::Error(e)) = init.reply {
        return Err(format!("initialize: {e}"));
    }
    let session = init.session;
    http::post(server, to, session.as_deref(), &rpc::initialized(), None, left()).await?;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..MAX_PAGES {
        let id = 2 + page as u64;
        let a = http::post(server, to, session.as_deref(), &rpc::list_tools(id, cursor.as_deref()), Some(id), left())
            .await?;
        let result = match a.reply {
            Some(rpc::Reply::Result(r)) => r,
            Some(rpc::Reply::Error(e)) => return Err(format!("tools/list: {e}")),
            None => return Err("tools/list: no reply".into()),
        };
        let (mut page_tools, next) = rpc::tools(&result);
        tools.append(&mut page_tools);
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(Listed { session, tools })
}

async fn call(
    server: &Server,
    to: Option<std::net::SocketAddr>,
    session: Option<&str>,
    name: &str,
    arguments: &Value,
    within: Duration,
) -> Called {
    match http::post(server, to, session, &rpc::call_tool(1, name, arguments), Some(1), within).await {
        Ok(http::Answer { reply: Some(rpc::Reply::Result(r)), .. }) => match rpc::call_output(&r) {
            (text, false) => Called::Output(text),
            (text, true) => Called::Failed(text),
        },
        Ok(http::Answer { reply: Some(rpc::Reply::Error(e)), .. }) => Called::Failed(e),
        Ok(_) => Called::Failed("no reply".into()),
        Err(e) => Called::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = McpUrl::parse("http://127.0.0.1:8931/mcp").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str(), u.authority.as_str()),
            ("127.0.0.1", 8931, "/mcp", "127.0.0.1:8931")
        );
        let u = McpUrl::parse("http://example.com").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        let u = McpUrl::parse("https://example.com/mcp").unwrap();
        assert!(u.tls && u.port == 443);
        assert!(McpUrl::parse("ftp://x").is_err());
    }
}
