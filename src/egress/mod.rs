//! Egress: TLS to `https://` workers (cloud providers), established off the shards.
//!
//! One thread (`smg-egress`, a current-thread tokio runtime, started only when a fleet has an
//! `https://` worker) makes every connection to an origin: DNS, the `HTTPS_PROXY` tunnel
//! unless `NO_PROXY` names the host (`proxy.rs`), and the TLS handshake (rustls, the system's
//! roots, `SSL_CERT_FILE` honoured). Then it hands the socket and the established session to
//! whoever asked:
//! - a shard (`Dial`, through the worker's [`TlsRoute`]): the session continues on the shard's
//!   own reactor (`io::TlsStream`), pooled and kept alive like any upstream connection, so a
//!   request's bytes never cross a core. Nothing that can block (a name lookup, a proxy, a
//!   handshake's round trips) runs on a shard;
//! - the control thread, whose probes and model listings speak plain HTTP to a loopback port
//!   per origin: each connection accepted there is piped to a TLS connection of its own.

mod proxy;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use proxy::ProxyConfig;

/// How long a connection may take to reach the origin (proxy, TCP and TLS handshakes). The
/// shard's own deadline bounds what a client waits; this bounds the pipe when it has gone.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest proxy answer to a CONNECT read.
const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// Where TLS goes: the host (for SNI, the certificate and a proxy's CONNECT) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    pub host: String,
    pub port: u16,
}

/// The egress thread's handle, and its loopback port per origin (the control thread's).
pub struct Egress {
    rt: tokio::runtime::Handle,
    ports: HashMap<Origin, SocketAddr>,
    shared: Arc<Shared>,
    dial: flume::Sender<Dial>,
}

/// A shard's way to a TLS origin: ask the egress thread for a connection.
#[derive(Debug)]
pub struct TlsRoute {
    origin: Arc<Origin>,
    dial: flume::Sender<Dial>,
}

/// A connection to `origin` wanted: its socket and established session go back on `reply`.
struct Dial {
    origin: Arc<Origin>,
    reply: flume::Sender<Result<(std::net::TcpStream, rustls::ClientConnection), String>>,
}

impl TlsRoute {
    /// A new TLS connection to the origin, made on the egress thread and continued here.
    pub async fn connect(&self) -> std::io::Result<crate::io::TlsStream> {
        let (tx, rx) = flume::bounded(1);
        let gone = || std::io::Error::other("egress thread is gone");
        self.dial.send(Dial { origin: Arc::clone(&self.origin), reply: tx }).map_err(|_| gone())?;
        let (tcp, session) = rx.recv_async().await.map_err(|_| gone())?.map_err(std::io::Error::other)?;
        crate::io::TlsStream::resume(tcp, session)
    }
}

/// What every pipe reads.
struct Shared {
    tls: tokio_rustls::TlsConnector,
    proxy: ProxyConfig,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("ports", &self.ports).finish_non_exhaustive()
    }
}

impl Egress {
    /// Starts the egress thread, with the roots and proxy of this process's environment.
    pub fn start() -> Result<Egress, String> {
        let proxy = ProxyConfig::from_env()?;
        let tls = tokio_rustls::TlsConnector::from(client_config()?);
        let (tx, rx) = flume::bounded(1);
        let (dialer, dials) = flume::unbounded::<Dial>();
        std::thread::Builder::new()
            .name("smg-egress".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() {
                    Ok(rt) => rt,
                    Err(e) => return crate::error!("egress thread: {e}"),
                };
                let _ = tx.send(rt.handle().clone());
                // Every pipe is a task spawned through the handle; this thread only runs them.
                rt.block_on(std::future::pending::<()>());
            })
            .map_err(|e| format!("egress thread: {e}"))?;
        let rt = rx.recv().map_err(|_| "egress thread: no runtime".to_string())?;
        let shared = Arc::new(Shared { tls, proxy });
        let for_dials = Arc::clone(&shared);
        rt.spawn(async move {
            while let Ok(d) = dials.recv_async().await {
                tokio::spawn(dial(d, Arc::clone(&for_dials)));
            }
        });
        Ok(Egress { rt, ports: HashMap::new(), shared, dial: dialer })
    }

    /// The shards' way to `origin`.
    pub fn route(&self, origin: &Origin) -> TlsRoute {
        TlsRoute { origin: Arc::new(origin.clone()), dial: self.dial.clone() }
    }

    /// The loopback address whose connections become TLS connections to `origin`: one port
    /// per origin, however many workers name it.
    pub fn port(&mut self, origin: &Origin) -> Result<SocketAddr, String> {
        if let Some(a) = self.ports.get(origin) {
            return Ok(*a);
        }
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.set_nonblocking(true).map(|_| l))
            .map_err(|e| format!("egress to {}:{}: {e}", origin.host, origin.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (shared, to) = (Arc::clone(&self.shared), Arc::new(origin.clone()));
        self.rt.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => return crate::error!("egress to {}:{}: {e}", to.host, to.port),
            };
            loop {
                match listener.accept().await {
                    Ok((inbound, _)) => {
                        tokio::spawn(pipe(inbound, Arc::clone(&to), Arc::clone(&shared)));
                    }
                    Err(e) => {
                        crate::warn!("egress to {}:{}: accept: {e}", to.host, to.port);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        crate::info!("egress: https://{}:{} through 127.0.0.1:{}", origin.host, origin.port, addr.port());
        self.ports.insert(origin.clone(), addr);
        Ok(addr)
    }
}

/// A shard's connection: reached over TLS here, then the socket and the session handed over.
async fn dial(d: Dial, shared: Arc<Shared>) {
    let to = &d.origin;
    let reached = match tokio::time::timeout(CONNECT_TIMEOUT, reach(to, &shared)).await {
        Ok(Ok(tls)) => {
            let (tcp, session) = tls.into_inner();
            tcp.into_std().map(|tcp| (tcp, session)).map_err(|e| e.to_string())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no TLS connection within {CONNECT_TIMEOUT:?}")),
    };
    if let Err(e) = &reached {
        crate::warn!("egress to {}:{}: {e}", to.host, to.port);
    }
    let _ = d.reply.send(reached.map_err(|e| format!("{}:{}: {e}", to.host, to.port)));
}

/// One control-thread connection: reach the origin over TLS, then copy both ways until either side
/// closes. A failure closes the shard's connection before any answer, which the shard takes
/// as this worker failing (its breaker and retry rules decide the rest).
async fn pipe(mut inbound: TcpStream, to: Arc<Origin>, shared: Arc<Shared>) {
    let _ = inbound.set_nodelay(true);
    let reached = tokio::time::timeout(CONNECT_TIMEOUT, reach(&to, &shared)).await;
    let mut up = match reached {
        Ok(Ok(up)) => up,
        Ok(Err(e)) => return crate::warn!("egress to {}:{}: {e}", to.host, to.port),
        Err(_) => {
            return crate::warn!("egress to {}:{}: no TLS connection within {CONNECT_TIMEOUT:?}", to.host, to.port)
        }
    };
    if let Err(e) = tokio::io::copy_bidirectional(&mut inbound, &mut up).await {
        crate::debug!("egress to {}:{}: {e}", to.host, to.port);
    }
}

/// A TLS connection to `to`, through the proxy unless `NO_PROXY` names it.
async fn reach(to: &Origin, shared: &Shared) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let tcp = match shared.proxy.for_host(&to.host) {
        None => TcpStream::connect((to.host.as_str(), to.port)).await.map_err(|e| format!("connect: {e}"))?,
        Some((proxy, auth)) => tunnel(proxy, auth, to).await?,
    };
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(to.host.clone()).map_err(|e| format!("server name: {e}"))?;
    shared.tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))
}

/// A CONNECT tunnel to `to` through the proxy at `proxy` (`host:port`).
async fn tunnel(proxy: &str, auth: Option<&str>, to: &Origin) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(proxy).await.map_err(|e| format!("proxy {proxy}: {e}"))?;
    let target =
        if to.host.contains(':') { format!("[{}]:{}", to.host, to.port) } else { format!("{}:{}", to.host, to.port) };
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.map_err(|e| format!("proxy {proxy}: {e}"))?;
    // The answer's head, and nothing after it: TLS has not started, so the proxy has nothing
    // of the origin's to send yet.
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_CONNECT_HEAD {
            return Err(format!("proxy {proxy}: CONNECT answer too long"));
        }
        match s.read(&mut byte).await {
            Ok(0) => return Err(format!("proxy {proxy}: closed during CONNECT")),
            Ok(_) => head.push(byte[0]),
            Err(e) => return Err(format!("proxy {proxy}: {e}")),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&head) {
        Ok(httparse::Status::Complete(_)) if resp.code.is_some_and(|c| (200..300).contains(&c)) => Ok(s),
        Ok(_) => Err(format!("proxy {proxy}: CONNECT {target} refused ({})", resp.code.unwrap_or(0))),
        Err(e) => Err(format!("proxy {proxy}: CONNECT answer: {e}")),
    }
}

/// rustls with the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured, as OpenSSL
/// does), HTTP/1.1 by ALPN. ring's provider: aws-lc-rs, rustls's other, needs a cmake build
/// of C; rustls marks ring's as deprecated for its lack of post-quantum key exchange.
fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    for e in found.errors.iter().take(3) {
        crate::warn!("egress: TLS roots: {e}");
    }
    if added == 0 {
        crate::warn!("egress: no TLS root certificates found (set SSL_CERT_FILE): every https:// worker will fail");
    }
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("egress TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
