//! A client connection as the phases see it: the socket and its read buffer.

use monoio::net::TcpStream;

pub struct Client {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
    /// Where the next request starts in `buf`, once this one is done with it.
    pub next: usize,
    /// Close with a lingering read (an early answer left the client sending).
    pub linger: bool,
}
