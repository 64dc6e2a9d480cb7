//! The only place that touches monoio's I/O calls, so a runtime swap changes one file.
//!
//! Buffers are rented to the kernel and handed back (monoio's BufResult): each helper
//! takes a Vec by value and always returns it, whatever happened.

use std::io;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// Reads more bytes, appending to `buf` (grows it so at least `min_spare` bytes fit).
pub async fn read_more(s: &mut TcpStream, mut buf: Vec<u8>, min_spare: usize) -> (io::Result<usize>, Vec<u8>) {
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare);
    }
    let len = buf.len();
    let cap = buf.capacity();
    let (res, slice) = s.read(buf.slice_mut(len..cap)).await;
    (res, slice.into_inner())
}

/// Writes all of `buf[range]`.
pub async fn write_all(s: &mut TcpStream, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
    let (res, buf) = s.write_all(buf).await;
    (res.map(|_| ()), buf)
}

/// Writes `buf[start..end]` completely.
pub async fn write_range(s: &mut TcpStream, buf: Vec<u8>, start: usize, end: usize) -> (io::Result<()>, Vec<u8>) {
    if start == end {
        return (Ok(()), buf);
    }
    let (res, slice) = s.write_all(buf.slice(start..end)).await;
    (res.map(|_| ()), slice.into_inner())
}

/// Two owned buffers written with one `writev`: a head we built and a range of a buffer
/// we received (a request body, or the first body bytes of a response). The iovec array
/// lives in a Box so its address is stable while the kernel holds it.
pub struct Pair {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
}

unsafe impl IoVecBuf for Pair {
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

impl Pair {
    /// Writes `a` then `b[b_start..b_end]`, looping over short writes.
    pub async fn write(
        s: &mut TcpStream,
        a: Vec<u8>,
        b: Vec<u8>,
        b_start: usize,
        b_end: usize,
    ) -> (io::Result<()>, Vec<u8>, Vec<u8>) {
        let mut a = a;
        let mut b = b;
        let iov = Box::new([
            libc::iovec { iov_base: a.as_mut_ptr().cast(), iov_len: a.len() },
            libc::iovec { iov_base: b[b_start..].as_mut_ptr().cast(), iov_len: b_end - b_start },
        ]);
        let mut pair = Pair { a, b, iov };
        loop {
            let total = pair.iov[0].iov_len + pair.iov[1].iov_len;
            if total == 0 {
                return (Ok(()), pair.a, pair.b);
            }
            let (res, p) = s.writev(pair).await;
            pair = p;
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), pair.a, pair.b),
                Ok(mut n) => {
                    for v in pair.iov.iter_mut() {
                        let take = n.min(v.iov_len);
                        // SAFETY: advancing within the same allocation by at most its length.
                        v.iov_base = unsafe { v.iov_base.cast::<u8>().add(take).cast() };
                        v.iov_len -= take;
                        n -= take;
                    }
                }
                Err(e) => return (Err(e), pair.a, pair.b),
            }
        }
    }
}

/// Waits until the peer sent something or closed; Ok(true) means it closed (or reset).
/// Uses MSG_PEEK so pipelined bytes stay in the socket for the next request.
///
/// Readiness must be strict (`relaxed = false`): on the epoll driver a relaxed check
/// returns at once on readiness left over from reading the request, the peek says
/// EAGAIN, and the loop would spin without ever yielding to the reactor.
pub async fn peer_closed(s: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    loop {
        if s.readable(false).await.is_err() {
            return true;
        }
        let mut byte = 0u8;
        // SAFETY: one-byte buffer on our own socket.
        let n =
            unsafe { libc::recv(s.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n == 0 {
            return true;
        }
        if n > 0 {
            return false;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::WouldBlock && err.kind() != io::ErrorKind::Interrupted {
            return true;
        }
    }
}

/// Sets TCP_NODELAY: responses and SSE events must not wait for Nagle.
pub fn nodelay(s: &TcpStream) {
    let _ = s.set_nodelay(true);
}
