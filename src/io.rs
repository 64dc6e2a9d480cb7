//! The ground floor: every monoio I/O call and every libc socket call the data plane makes,
//! so the layers above speak in buffers and outcomes, and a runtime swap changes this file.
//!
//! Buffers are rented to the kernel and handed back (monoio's BufResult): each helper takes a
//! Vec by value and returns it with the result. A helper wrapped in a deadline that expires
//! drops its in-flight operation; monoio keeps the buffer alive until the kernel lets go and
//! the caller gets a fresh one (only on error paths, which then close the connection).

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::Either;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

pub use monoio::net::TcpListener;

/// An upstream connection's bytes: plain TCP, or TLS over it (a cloud provider: the session
/// the egress thread established, continued here). Self-hosted workers are `Plain`: one
/// branch per I/O call is all TLS costs them.
pub enum Upstream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// A TLS session on this shard's socket, and that socket's descriptor (for the idle check,
/// which looks at the socket itself).
pub struct TlsStream {
    pub(crate) inner: monoio_rustls::ClientTlsStream<TcpStream>,
    fd: RawFd,
}

impl TlsStream {
    /// Continues `session`, whose handshake is done, on `tcp`.
    pub fn resume(tcp: std::net::TcpStream, session: rustls::ClientConnection) -> io::Result<TlsStream> {
        tcp.set_nonblocking(true)?;
        let _ = tcp.set_nodelay(true);
        let fd = tcp.as_raw_fd();
        let tcp = TcpStream::from_std(tcp)?;
        Ok(TlsStream { inner: monoio_rustls::ClientTlsStream::new(tcp, session), fd })
    }
}

impl AsRawFd for Upstream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Upstream::Plain(s) => s.as_raw_fd(),
            Upstream::Tls(t) => t.fd,
        }
    }
}

// Each call is the plain stream's own future, or a boxed TLS one: no wrapper future, so the
// plain path moves exactly what it moved before TLS existed (an async-block wrapper measured
// +570 instructions a request in memcpy alone, `bench/callgrind-per-request`).
impl AsyncReadRent for Upstream {
    fn read<T: IoBufMut>(&mut self, buf: T) -> impl Future<Output = monoio::BufResult<usize, T>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.read(buf)),
            Upstream::Tls(t) => Either::Right(Box::pin(t.inner.read(buf))),
        }
    }

    fn readv<T: monoio::buf::IoVecBufMut>(&mut self, buf: T) -> impl Future<Output = monoio::BufResult<usize, T>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.readv(buf)),
            Upstream::Tls(t) => Either::Right(Box::pin(t.inner.readv(buf))),
        }
    }
}

impl AsyncWriteRent for Upstream {
    fn write<T: IoBuf>(&mut self, buf: T) -> impl Future<Output = monoio::BufResult<usize, T>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.write(buf)),
            Upstream::Tls(t) => Either::Right(Box::pin(t.inner.write(buf))),
        }
    }

    fn writev<T: IoVecBuf>(&mut self, buf: T) -> impl Future<Output = monoio::BufResult<usize, T>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.writev(buf)),
            // monoio-rustls writes only the first part of a vector; gathered here, a request's
            // head and body go as one TLS record and one write.
            Upstream::Tls(t) => Either::Right(Box::pin(async move {
                let (ptr, len) = (buf.read_iovec_ptr(), buf.read_iovec_len());
                let mut all = Vec::new();
                for i in 0..len {
                    // SAFETY: `buf` owns `len` iovecs at `ptr`, each over memory it keeps alive
                    // and unchanged while it is borrowed here.
                    #[allow(unsafe_code)]
                    let part = unsafe {
                        let v = &*ptr.add(i);
                        std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
                    };
                    all.extend_from_slice(part);
                }
                let (res, _) = t.inner.write_all(all).await;
                (res, buf)
            })),
        }
    }

    fn flush(&mut self) -> impl Future<Output = io::Result<()>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.flush()),
            Upstream::Tls(t) => Either::Right(Box::pin(t.inner.flush())),
        }
    }

    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> {
        match self {
            Upstream::Plain(s) => Either::Left(s.shutdown()),
            Upstream::Tls(t) => Either::Right(Box::pin(t.inner.shutdown())),
        }
    }
}

/// Reads more bytes, appending to `buf` (grows it so at least `min_spare` bytes fit).
pub async fn read_more<S: AsyncReadRent>(
    s: &mut S,
    mut buf: Vec<u8>,
    min_spare: usize,
) -> (io::Result<usize>, Vec<u8>) {
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare);
    }
    let len = buf.len();
    let cap = buf.capacity();
    let (res, slice) = s.read(buf.slice_mut(len..cap)).await;
    (res, slice.into_inner())
}

/// Reads at most `max` bytes into `buf`, replacing what it held (a body pumped through
/// one buffer must not read past its end into the next request).
pub async fn read_into<S: AsyncReadRent>(s: &mut S, mut buf: Vec<u8>, max: usize) -> (io::Result<usize>, Vec<u8>) {
    buf.clear();
    buf.reserve(max);
    let (res, slice) = s.read(buf.slice_mut(0..max)).await;
    (res, slice.into_inner())
}

/// How a read with a deadline ended.
pub enum Timed<T> {
    Done(T),
    Expired,
}

/// [`read_more`] that gives up after `limit`. On expiry the buffer stays with the cancelled
/// operation and an empty one comes back.
pub async fn read_more_within<S: AsyncReadRent>(
    s: &mut S,
    buf: Vec<u8>,
    min_spare: usize,
    limit: Duration,
) -> (Timed<io::Result<usize>>, Vec<u8>) {
    // Both futures pinned where they are made and polled in turn: `monoio::time::timeout`
    // took the read by value, and the read and the timer were copied twice a request.
    let mut read = pin!(read_more(s, buf, min_spare));
    let mut timer = pin!(crate::clock::timer(limit));
    std::future::poll_fn(|cx| {
        if let Poll::Ready((res, buf)) = read.as_mut().poll(cx) {
            return Poll::Ready((Timed::Done(res), buf));
        }
        timer.as_mut().poll(cx).map(|()| (Timed::Expired, Vec::new()))
    })
    .await
}

/// Writes all of `buf`.
pub async fn write_all<S: AsyncWriteRent>(s: &mut S, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
    let (res, buf) = s.write_all(buf).await;
    (res.map(|_| ()), buf)
}

/// Writes `buf[start..end]` completely.
pub async fn write_range<S: AsyncWriteRent>(
    s: &mut S,
    buf: Vec<u8>,
    start: usize,
    end: usize,
) -> (io::Result<()>, Vec<u8>) {
    if start == end {
        return (Ok(()), buf);
    }
    let (res, slice) = s.write_all(buf.slice(start..end)).await;
    (res.map(|_| ()), slice.into_inner())
}

/// Two owned buffers written with one `writev`: a head we built and a range of a buffer
/// we received (a request body, or the first body bytes of a response). The iovec array
/// lives in a Box so its address is stable while the kernel holds it.
pub struct Writev2 {
    a: Vec<u8>,
    b: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

thread_local! {
    /// The iovec pair of the shard's last finished write, for its next: a request writes
    /// twice, and malloc and free cost more in cycles than their instruction count says
    /// (`Shard::candidates`). A write cancelled mid-way leaves its pair with the driver.
    static SPARE_IOV: std::cell::Cell<Option<Box<[libc::iovec; 2]>>> = const { std::cell::Cell::new(None) };
}

// SAFETY: the iovecs live in a Box (a stable address while monoio holds the buffer) and point
// into `a` and `b`, which this struct owns and leaves untouched while an operation holds it.
#[allow(unsafe_code)]
unsafe impl IoVecBuf for Writev2 {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        let first = if self.iov[0].iov_len == 0 { 1 } else { 0 };
        // SAFETY: index 0 or 1 of a 2-element array.
        unsafe { self.iov.as_ptr().add(first) }
    }
    fn read_iovec_len(&self) -> usize {
        if self.iov[0].iov_len == 0 {
            1
        } else {
            2
        }
    }
}

impl Writev2 {
    /// Writes `a` then `b[b_start..b_end]`, looping over short writes; both come back.
    #[allow(unsafe_code)]
    pub async fn write<S: AsyncWriteRent>(
        s: &mut S,
        a: Vec<u8>,
        b: Vec<u8>,
        b_start: usize,
        b_end: usize,
    ) -> (io::Result<()>, Vec<u8>, Vec<u8>) {
        let mut a = a;
        let mut b = b;
        let mut iov = SPARE_IOV
            .with(std::cell::Cell::take)
            .unwrap_or_else(|| Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]));
        *iov = [
            libc::iovec { iov_base: a.as_mut_ptr().cast(), iov_len: a.len() },
            libc::iovec { iov_base: b[b_start..].as_mut_ptr().cast(), iov_len: b_end - b_start },
        ];
        let mut pair = Writev2 { a, b, iov };
        loop {
            let total = pair.iov[0].iov_len + pair.iov[1].iov_len;
            if total == 0 {
                return pair.end(Ok(()));
            }
            let (res, p) = s.writev(pair).await;
            pair = p;
            match res {
                Ok(0) => return pair.end(Err(io::ErrorKind::WriteZero.into())),
                Ok(mut n) => {
                    for v in pair.iov.iter_mut() {
                        let take = n.min(v.iov_len);
                        // SAFETY: advancing within the same allocation by at most its length.
                        v.iov_base = unsafe { v.iov_base.cast::<u8>().add(take).cast() };
                        v.iov_len -= take;
                        n -= take;
                    }
                }
                Err(e) => return pair.end(Err(e)),
            }
        }
    }

    /// The buffers back, and the iovec pair kept for the next write.
    fn end(self, res: io::Result<()>) -> (io::Result<()>, Vec<u8>, Vec<u8>) {
        let Writev2 { a, b, iov } = self;
        SPARE_IOV.with(|s| s.set(Some(iov)));
        (res, a, b)
    }
}

/// Stops sending on `s` (FIN), keeping it open for reading.
pub async fn shutdown_write<S: AsyncWriteRent>(s: &mut S) {
    let _ = s.shutdown().await;
}

/// One non-blocking `MSG_PEEK` of a byte: Some(true) = the peer closed or the socket failed,
/// Some(false) = bytes are waiting, None = nothing yet.
#[allow(unsafe_code)]
fn peek_now(fd: RawFd) -> Option<bool> {
    let mut byte = 0u8;
    // SAFETY: one-byte buffer on a socket the caller owns.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n == 0 {
        return Some(true);
    }
    if n > 0 {
        return Some(false);
    }
    let err = io::Error::last_os_error();
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => None,
        _ => Some(true),
    }
}

/// An idle connection is clean when the peer has sent nothing and not closed it: anything
/// readable on a connection with no request outstanding is either a close or bytes that
/// belong to no request, and the connection must not be used.
pub fn idle_is_clean(s: &impl AsRawFd) -> bool {
    peek_now(s.as_raw_fd()).is_none()
}

/// Waits until the peer sent something or closed; true means it closed (or reset).
/// Uses MSG_PEEK so pipelined bytes stay in the socket for the next request.
///
/// Readiness must be strict (`relaxed = false`): on the epoll driver a relaxed check
/// returns at once on readiness left over from reading the request, the peek says
/// EAGAIN, and the loop would spin without ever yielding to the reactor.
pub async fn peer_closed(s: &TcpStream) -> bool {
    loop {
        if s.readable(false).await.is_err() {
            return true;
        }
        if let Some(closed) = peek_now(s.as_raw_fd()) {
            return closed;
        }
    }
}

/// One socket as a read half and a write half that can be busy at once (a relay waits for
/// its next read while it writes the other way), with no second descriptor. Sound for the
/// same reason monoio declares `TcpStream: Split`: its reads and writes take `&mut self`
/// only to clone the shared descriptor into the operation, which then owns what it uses.
pub(crate) fn split(s: &mut TcpStream) -> (ReadHalf<'_>, WriteHalf<'_>) {
    let cell = std::cell::UnsafeCell::from_mut(s);
    (ReadHalf(cell), WriteHalf(cell))
}

/// The reading side of [`split`].
pub(crate) struct ReadHalf<'a>(&'a std::cell::UnsafeCell<TcpStream>);

/// The writing side of [`split`].
pub(crate) struct WriteHalf<'a>(&'a std::cell::UnsafeCell<TcpStream>);

impl ReadHalf<'_> {
    /// [`read_more`] on this half.
    #[allow(unsafe_code)]
    pub(crate) async fn read_more(&mut self, mut buf: Vec<u8>, min_spare: usize) -> (io::Result<usize>, Vec<u8>) {
        if buf.capacity() - buf.len() < min_spare {
            buf.reserve(min_spare);
        }
        let (len, cap) = (buf.len(), buf.capacity());
        // SAFETY: see `split`; the borrow only lasts the call that submits the operation.
        let op = unsafe { &mut *self.0.get() }.read(buf.slice_mut(len..cap));
        let (res, slice) = op.await;
        (res, slice.into_inner())
    }

    /// Resolves once the socket has bytes (or an end) to read; no buffer is held meanwhile.
    #[allow(unsafe_code)]
    pub(crate) async fn readable(&self) -> io::Result<()> {
        // SAFETY: see `split`; `readable` takes `&self`.
        let s = unsafe { &*self.0.get() };
        s.readable(false).await
    }
}

impl WriteHalf<'_> {
    /// [`write_range`] on this half.
    #[allow(unsafe_code)]
    pub(crate) async fn write_range(
        &mut self,
        mut buf: Vec<u8>,
        mut start: usize,
        end: usize,
    ) -> (io::Result<()>, Vec<u8>) {
        while start < end {
            // SAFETY: see `split`; the borrow only lasts the call that submits the operation.
            let op = unsafe { &mut *self.0.get() }.write(buf.slice(start..end));
            let (res, slice) = op.await;
            buf = slice.into_inner();
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => start += n,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }
}

/// A second descriptor for a socket (`dup`), registered with the reactor on its own. A
/// watch armed on it can stay pending while writes go through the original, which monoio's
/// writes need exclusively.
#[allow(unsafe_code)]
pub fn dup_stream(s: &TcpStream) -> io::Result<TcpStream> {
    // SAFETY: dup of a descriptor we own; the new one is owned by the std stream at once.
    let fd = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let std = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    TcpStream::from_std(std)
}

/// Sets TCP_NODELAY: responses and SSE events must not wait for Nagle.
pub fn nodelay(s: &TcpStream) {
    let _ = s.set_nodelay(true);
}

pub async fn connect(addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_addr(addr).await?;
    nodelay(&s);
    Ok(s)
}

/// A SO_REUSEPORT listener: one per shard on the same address; the kernel spreads
/// connections over them.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let opts = monoio::net::ListenerOpts::new().reuse_port(true).reuse_addr(true).backlog(4096);
    TcpListener::bind_with_config(addr, &opts)
}

/// Stops a listener from starting new handshakes while handshakes already under way still
/// complete into its accept queue: a socket filter that drops segments with SYN and without
/// ACK (a client's first). The dropped client retries its SYN a second later and finds the
/// socket closed (connection refused), so it never saw a connection that is then reset.
/// Classic BPF sees a TCP socket's segments from their TCP header: byte 13 is the flags.
#[allow(unsafe_code)]
pub(crate) fn refuse_handshakes(l: &TcpListener) -> io::Result<()> {
    const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let prog = [
        op(LDB_ABS, 0, 0, 13),
        op(JSET_K, 2, 0, 0x10), // ACK: a handshake's last segment, or a later one: keep
        op(JSET_K, 0, 1, 0x02), // SYN without ACK: a new handshake: drop
        op(RET_K, 0, 0, 0),
        op(RET_K, 0, 0, u32::MAX),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `prog`, both alive for the call; the kernel copies them.
    let rc = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True when the listener's accept queue holds a connection now (an accept would not wait).
#[allow(unsafe_code)]
pub(crate) fn backlog_ready(l: &TcpListener) -> bool {
    let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd on the stack, timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// A listener on a descriptor someone else opened (systemd's socket activation): a
/// duplicate, so each shard owns its own and the original stays for the others.
#[allow(unsafe_code)]
pub fn listener_from_fd(fd: RawFd) -> io::Result<TcpListener> {
    // SAFETY: dup of a descriptor systemd handed us; the new one is owned at once.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh descriptor nothing else owns.
    let std = unsafe { std::net::TcpListener::from_raw_fd(dup) };
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

pub async fn sleep(d: Duration) {
    crate::clock::timer(d).await
}

/// True for accept errors that mean "out of descriptors or memory": back off, do not spin.
pub fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Bounds how long data we sent may sit unacknowledged, or unsent behind a zero window,
/// before the kernel drops the connection and our pending write fails (TCP_USER_TIMEOUT,
/// which Linux applies to zero-window probing too). A client that stops reading is cut
/// after about `d` without a timer per write: one setsockopt per connection.
#[allow(unsafe_code)]
pub fn send_deadline(s: &TcpStream, d: Duration) {
    let ms: libc::c_uint = d.as_millis().min(u32::MAX as u128) as libc::c_uint;
    // SAFETY: setsockopt with a correctly sized value on a socket we own.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        );
    }
}

/// Raises the soft descriptor limit to the hard one (what nginx's `worker_rlimit_nofile`
/// and Go's runtime do); returns the limit in force.
#[allow(unsafe_code)]
pub fn raise_descriptor_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use monoio::io::AsyncReadRentExt;
    use monoio::net::{TcpListener, TcpStream};

    use super::*;

    /// Two writes in a row over a loopback socket, under both drivers: every byte arrives in
    /// order, and the second write takes the first one's iovec box.
    #[test]
    fn writes_deliver_their_ranges_and_reuse_the_iovec_box() {
        async fn run() {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut tx = TcpStream::connect(addr).await.unwrap();
            let (mut rx, _) = listener.accept().await.unwrap();
            SPARE_IOV.with(|s| s.set(None));
            let (res, a, b) = Writev2::write(&mut tx, b"head|".to_vec(), b"xxbodyyy".to_vec(), 2, 6).await;
            res.unwrap();
            assert_eq!((a, b), (b"head|".to_vec(), b"xxbodyyy".to_vec()), "both buffers come back whole");
            let first = SPARE_IOV.with(|s| s.take()).expect("the box is kept");
            let kept: *const [libc::iovec; 2] = &*first;
            SPARE_IOV.with(|s| s.set(Some(first)));
            // An empty head: only the range goes out.
            let (res, _, _) = Writev2::write(&mut tx, Vec::new(), b"-tail".to_vec(), 0, 5).await;
            res.unwrap();
            let again = SPARE_IOV.with(|s| s.take()).expect("kept again");
            assert!(std::ptr::eq(kept, &*again), "the second write used the first one's box");
            let (res, got) = rx.read_exact(vec![0u8; 14]).await;
            res.unwrap();
            assert_eq!(got, b"head|body-tail");
        }
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().unwrap().block_on(run());
        if monoio::utils::detect_uring() {
            monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().build().unwrap().block_on(run());
        }
    }
}
