//! A client connection as the phases see it: the socket and its read buffer.

use monoio::net::TcpStream;

pub struct Client {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
    /// Where the next request starts in `buf`, once this one is done with it.
    pub next: usize,
    /// Close with a lingering read (an early answer left the client sending).
    pub linger: bool,
    /// Held until the first request head arrives: such a connection is read even while the
    /// shard drains (it may come from the backlog, its request on the way).
    pub(crate) unread: Option<crate::shard::UnreadGuard>,
}
