//! GetTokenizer's bundle: the tokenizer files as one zip archive, streamed in chunks whose
//! last carries the archive's SHA-256. Read in memory (nothing is written to disk); stored
//! entries only, since the bundle's files are small and no inflate crate is in the build: a
//! compressed entry is refused with a clear error rather than guessed at.

use sha2::{Digest, Sha256};

use crate::tokenizer::Tokenizer;

/// Checks the digest, reads the archive and builds the tokenizer from its files.
pub fn load(zip: &[u8], sha256: &str) -> Result<Tokenizer, String> {
    if !sha256.is_empty() {
        let got: String = Sha256::digest(zip).iter().map(|b| format!("{b:02x}")).collect();
        if !got.eq_ignore_ascii_case(sha256.trim()) {
            return Err(format!("tokenizer bundle: SHA-256 {got} does not match the advertised {sha256}"));
        }
    }
    let files = entries(zip)?;
    let file = |name: &str| {
        files.iter().find(|(n, _)| n == name || n.ends_with(&format!("/{name}"))).map(|(_, b)| b.as_slice())
    };
    let tj = file("tokenizer.json").ok_or("tokenizer bundle: no tokenizer.json")?;
    let cfg = file("tokenizer_config.json").map(|b| String::from_utf8_lossy(b).into_owned());
    let tpl = file("chat_template.jinja").map(|b| String::from_utf8_lossy(b).into_owned());
    Tokenizer::from_parts(tj, cfg.as_deref(), tpl)
}

/// The archive's files by name, from its central directory (PKWARE APPNOTE 4.3).
fn entries(zip: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let u16_at = |at: usize| zip.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |at: usize| zip.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let bad = || "tokenizer bundle: not a readable zip archive".to_string();
    // The end record is the last 22 bytes plus an optional comment of up to 64 KiB.
    let end = (0..zip.len().saturating_sub(21)).rev().take(65_557).find(|&i| u32_at(i) == Some(0x0605_4b50));
    let end = end.ok_or_else(bad)?;
    let count = u16_at(end + 10).ok_or_else(bad)?;
    let mut at = u32_at(end + 16).ok_or_else(bad)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if u32_at(at) != Some(0x0201_4b50) {
            return Err(bad());
        }
        let method = u16_at(at + 10).ok_or_else(bad)?;
        let size = u32_at(at + 20).ok_or_else(bad)?;
        let (name_len, extra, comment) =
            (u16_at(at + 28).ok_or_else(bad)?, u16_at(at + 30).ok_or_else(bad)?, u16_at(at + 32).ok_or_else(bad)?);
        let local = u32_at(at + 42).ok_or_else(bad)?;
        let name = String::from_utf8_lossy(zip.get(at + 46..at + 46 + name_len).ok_or_else(bad)?).into_owned();
        at += 46 + name_len + extra + comment;
        if name.ends_with('/') {
            continue;
        }
        if method != 0 {
            return Err(format!(
                "tokenizer bundle: {name} is compressed (method {method}); only stored entries are read"
            ));
        }
        if u32_at(local) != Some(0x0403_4b50) {
            return Err(bad());
        }
        let data_at = local + 30 + u16_at(local + 26).ok_or_else(bad)? + u16_at(local + 28).ok_or_else(bad)?;
        out.push((name, zip.get(data_at..data_at + size).ok_or_else(bad)?.to_vec()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_simulators_bundle() {
        let files = smg_loadtest::sim::tokenizer::files();
        let zip = smg_loadtest::sim::grpc::bundle::stored_zip(files.iter().map(|(n, b)| (*n, b.as_bytes())));
        let got = entries(&zip).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, "tokenizer.json");
        let tok = load(&zip, "").unwrap();
        assert!(tok.chat_template().is_some());
        assert!(load(&zip, "00").unwrap_err().contains("SHA-256"));
        assert!(entries(b"nope").is_err());
    }
}
