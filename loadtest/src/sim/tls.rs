//! `--tls-dir DIR`: every worker also serves HTTPS, as a cloud provider does, so a gateway's
//! TLS upstreams (and its providers' keys) can be tested on one box.
//!
//! At start a CA is made (`DIR/ca.pem`, new every run) and, signed by it, one certificate for
//! the providers' API hosts (`api.openai.com`, `api.anthropic.com`,
//! `generativelanguage.googleapis.com`, `api.x.ai`), `localhost` and `127.0.0.1`. A client
//! that trusts `ca.pem` (`SSL_CERT_FILE`) and resolves those names to this box (or asks for
//! them by SNI through a CONNECT proxy) talks TLS to the simulator.
//!
//! One thread of its own (`smg-sim-tls`, a current-thread tokio runtime, as the ZMQ sockets'
//! thread) terminates TLS and pipes the plaintext to the worker's own HTTP port on this host:
//! the workers' code is the same over both.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The names the certificate holds.
pub const NAMES: [&str; 6] =
    ["api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com", "api.x.ai", "localhost", "127.0.0.1"];

/// Makes the CA and the certificate, writes `dir/ca.pem`, and returns the server's config.
pub fn server_config(dir: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let err = |e: rcgen::Error| format!("--tls-dir: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "smg-sim test CA");
    let ca = ca_params.self_signed(&ca_key).map_err(err)?;
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(NAMES.iter().map(|n| n.to_string()).collect::<Vec<_>>()).map_err(err)?;
    params.distinguished_name.push(DnType::CommonName, "smg-sim");
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(err)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("--tls-dir {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".ca.pem.{}", std::process::id()));
    std::fs::write(&tmp, ca.pem())
        .and_then(|_| std::fs::rename(&tmp, dir.join("ca.pem")))
        .map_err(|e| format!("--tls-dir {}: {e}", dir.display()))?;
    let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    // rustls deprecates ring's provider for lacking post-quantum key exchange, which a local
    // test server does not need; aws-lc-rs, which has it, needs a cmake build of C.
    #[allow(deprecated)]
    let provider = rustls::crypto::ring::default_provider();
    rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("--tls-dir: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map(Arc::new)
        .map_err(|e| format!("--tls-dir: {e}"))
}

/// What the CONNECT proxy was asked: each tunnel's `host:port`, and its `Proxy-Authorization`
/// if sent, oldest first (`GET /sim/connects` on any worker).
pub type ConnectLog = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// Binds one TLS listener per worker on `host` (`base` 0: a free port each, else `base + i`),
/// each piping to `plain[i]`, and starts the thread. Returns the TLS ports, in order, and
/// the proxy's.
/// With `proxy` (port, log), also a CONNECT proxy on that port: every tunnel, whatever it asks
/// for, leads to the first worker's TLS port (one worker plays every provider by Host).
pub fn start(
    config: Arc<rustls::ServerConfig>,
    host: IpAddr,
    base: u16,
    plain: &[u16],
    proxy: Option<(u16, ConnectLog)>,
) -> Result<(Vec<u16>, Option<u16>), String> {
    let mut listeners = Vec::with_capacity(plain.len());
    for (i, &to) in plain.iter().enumerate() {
        let port = if base == 0 {
            0
        } else {
            u16::try_from(base as usize + i)
                .map_err(|_| format!("--tls-port {base}: worker {i} would be past 65535"))?
        };
        let addr = SocketAddr::new(host, port);
        let l = std::net::TcpListener::bind(addr).map_err(|e| format!("--tls-port: bind {addr}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        listeners.push((l, SocketAddr::new(host, to)));
    }
    let ports: Vec<u16> = listeners.iter().map(|(l, _)| l.local_addr().map(|a| a.port()).unwrap_or(0)).collect();
    let proxy = match proxy {
        Some((port, log)) => {
            let addr = SocketAddr::new(host, port);
            let l = std::net::TcpListener::bind(addr).map_err(|e| format!("--connect-proxy-port: bind {addr}: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            Some((l, SocketAddr::new(host, ports[0]), log))
        }
        None => None,
    };
    let proxy_port = proxy.as_ref().and_then(|(l, _, _)| l.local_addr().ok()).map(|a| a.port());
    std::thread::Builder::new()
        .name("smg-sim-tls".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_io().build();
            match rt {
                Ok(rt) => rt.block_on(async move {
                    if let Some((l, to, log)) = proxy {
                        tokio::spawn(connect_proxy(l, to, log));
                    }
                    serve(config, listeners).await
                }),
                Err(e) => eprintln!("smg-sim: TLS: no runtime: {e}"),
            }
        })
        .map_err(|e| format!("spawn: {e}"))?;
    Ok((ports, proxy_port))
}

async fn serve(config: Arc<rustls::ServerConfig>, listeners: Vec<(std::net::TcpListener, SocketAddr)>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let mut loops = Vec::new();
    for (l, to) in listeners {
        let Ok(l) = tokio::net::TcpListener::from_std(l) else { continue };
        let acceptor = acceptor.clone();
        loops.push(tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A failed handshake (a client that does not trust the CA) just ends.
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(to).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        }));
    }
    for l in loops {
        let _ = l.await;
    }
}

/// The CONNECT proxy: reads `CONNECT target HTTP/1.1` and its headers, logs the target (and any
/// `Proxy-Authorization`), answers 200 and pipes the tunnel to `to`. Anything else: 405.
async fn connect_proxy(l: std::net::TcpListener, to: SocketAddr, log: ConnectLog) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(l) = tokio::net::TcpListener::from_std(l) else { return };
    while let Ok((mut client, _)) = l.accept().await {
        let log = log.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(512);
            let mut byte = [0u8; 1];
            // Byte by byte to the blank line: nothing of the tunnel is read with the head.
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                match client.read(&mut byte).await {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
            }
            let text = String::from_utf8_lossy(&head);
            let mut lines = text.split("\r\n");
            let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
            if first.len() != 3 || first[0] != "CONNECT" {
                let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n").await;
                return;
            }
            let auth = lines
                .filter_map(|h| h.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("proxy-authorization"))
                .map(|(_, v)| v.trim().to_string());
            if let Ok(mut g) = log.lock() {
                g.push((first[1].to_string(), auth));
            }
            let Ok(mut up) = tokio::net::TcpStream::connect(to).await else { return };
            if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        });
    }
}
