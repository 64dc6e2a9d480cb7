//! GetTokenizer: the tokenizer files as one zip archive (stored, not compressed: the files are
//! small and the format stays a few lines), streamed in chunks; the last chunk carries the
//! archive's SHA-256 so the client can check what it reassembled.

use std::sync::OnceLock;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use sha2::{Digest, Sha256};
use smg_proto::common::{GetTokenizerChunk, GetTokenizerRequest};

use crate::sim::grpc::wire::{self, reject};
use crate::sim::tokenizer;

/// Bytes of archive per streamed message.
const CHUNK: usize = 64 * 1024;

pub async fn serve(mut body: RecvStream, mut respond: SendResponse<Bytes>) {
    if let Err(s) = wire::read_request::<GetTokenizerRequest>(&mut body).await {
        return reject(respond, &s);
    }
    let (zip, sha256) = archive();
    let Ok(mut send) = respond.send_response(wire::response_head(), false) else { return };
    let mut pieces = zip.chunks(CHUNK).peekable();
    while let Some(piece) = pieces.next() {
        let last = pieces.peek().is_none();
        let chunk =
            GetTokenizerChunk { data: piece.to_vec(), sha256: if last { sha256.clone() } else { String::new() } };
        if send.send_data(wire::frame(&chunk), false).is_err() {
            return;
        }
    }
    let _ = send.send_trailers(wire::trailers(None));
}

/// The archive and its lowercase hex SHA-256, built once per process.
fn archive() -> &'static (Vec<u8>, String) {
    static ZIP: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    ZIP.get_or_init(|| {
        let files = tokenizer::files();
        let zip = stored_zip(files.iter().map(|(name, body)| (*name, body.as_bytes())));
        let hex = Sha256::digest(&zip).iter().map(|b| format!("{b:02x}")).collect();
        (zip, hex)
    })
}

/// A zip archive (PKWARE APPNOTE: local headers, central directory, end record) holding
/// `files` uncompressed, dated 1980-01-01.
pub fn stored_zip<'a>(files: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<u8> {
    const DOS_DATE: u16 = (1 << 5) | 1;
    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut count: u16 = 0;
    for (name, data) in files {
        let (crc, size, offset) = (crc32(data), data.len() as u32, out.len() as u32);
        // Local file header.
        put32(&mut out, 0x0403_4b50);
        for v in [20u16, 0, 0, 0, DOS_DATE] {
            put16(&mut out, v);
        }
        for v in [crc, size, size] {
            put32(&mut out, v);
        }
        put16(&mut out, name.len() as u16);
        put16(&mut out, 0);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        // Its central directory entry.
        put32(&mut central, 0x0201_4b50);
        for v in [20u16, 20, 0, 0, 0, DOS_DATE] {
            put16(&mut central, v);
        }
        for v in [crc, size, size] {
            put32(&mut central, v);
        }
        for v in [name.len() as u16, 0, 0, 0, 0] {
            put16(&mut central, v);
        }
        put32(&mut central, 0o100644 << 16);
        put32(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
        count += 1;
    }
    let (cd_offset, cd_size) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    put32(&mut out, 0x0605_4b50);
    for v in [0u16, 0, count, count] {
        put16(&mut out, v);
    }
    put32(&mut out, cd_size);
    put32(&mut out, cd_offset);
    put16(&mut out, 0);
    out
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// CRC-32 (IEEE, reflected, as zip uses), bit by bit: the archive is built once.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_of_the_check_string() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn archive_layout() {
        let zip = stored_zip([("a.txt", &b"hi"[..])].into_iter());
        assert_eq!(&zip[..4], b"PK\x03\x04");
        assert_eq!(&zip[zip.len() - 22..zip.len() - 18], b"PK\x05\x06");
        let (zip, sha) = archive();
        assert_eq!(sha.len(), 64);
        assert!(zip.windows(14).any(|w| w == b"tokenizer.json"));
    }
}
