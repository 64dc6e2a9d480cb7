//! A GGUF file's metadata: the header and its typed key/value pairs, read in order and
//! stopped before the tensor infos and data (a tokenizer needs nothing past the metadata, and
//! a model file is hundreds of MB). Format (little-endian): magic `GGUF`, u32 version,
//! u64 tensor count, u64 kv count (u32 both in version 1), then per kv a string key, a u32
//! type and the value; strings are a u64 length and UTF-8 bytes (u32 in version 1); an array
//! is a u32 element type, a u64 count and the elements.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// One metadata value. Integers of every width are widened (the converter only needs ids
/// and flags); arrays keep their elements in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Uint(v) => i64::try_from(v).ok(),
            Value::Int(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The metadata of one GGUF file.
#[derive(Debug, Default)]
pub struct Metadata {
    pub version: u32,
    pub tensor_count: u64,
    pub kv: HashMap<String, Value>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }
}

/// Reads the metadata of the GGUF file at `path`, leaving the rest of the file unread.
pub fn read_metadata(path: &Path) -> io::Result<Metadata> {
    let f = std::fs::File::open(path)?;
    parse(&mut BufReader::with_capacity(1 << 16, f))
}

/// Parses a GGUF header and metadata from `r`.
pub fn parse(r: &mut impl Read) -> io::Result<Metadata> {
    let mut rd = Reader { r, version: 0 };
    let magic = rd.bytes4()?;
    if &magic != b"GGUF" {
        return Err(bad("not a GGUF file (bad magic)"));
    }
    rd.version = rd.u32()?;
    if !(1..=3).contains(&rd.version) {
        return Err(bad(&format!("unsupported GGUF version {}", rd.version)));
    }
    let tensor_count = rd.count()?;
    let kv_count = rd.count()?;
    let mut kv = HashMap::with_capacity(kv_count.min(4096) as usize);
    for _ in 0..kv_count {
        let key = rd.string()?;
        let ty = rd.u32()?;
        let value = rd.value(ty, 0)?;
        kv.insert(key, value);
    }
    Ok(Metadata { version: rd.version, tensor_count, kv })
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

// Value type codes of the GGUF spec.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// A corrupt length must not allocate gigabytes: strings and arrays are capped far above
/// any real vocabulary (a few hundred thousand entries of a few bytes each).
const MAX_STRING: u64 = 64 << 20;
const MAX_ARRAY: u64 = 16 << 20;

struct Reader<'a, R: Read> {
    r: &'a mut R,
    version: u32,
}

impl<R: Read> Reader<'_, R> {
    fn fill<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }

    fn bytes4(&mut self) -> io::Result<[u8; 4]> {
        self.fill::<4>()
    }

    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.fill()?))
    }

    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.fill()?))
    }

    /// Counts and lengths: u32 in version 1, u64 since.
    fn count(&mut self) -> io::Result<u64> {
        if self.version == 1 {
            Ok(self.u32()? as u64)
        } else {
            self.u64()
        }
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.count()?;
        if len > MAX_STRING {
            return Err(bad("GGUF string too long"));
        }
        let mut buf = vec![0u8; len as usize];
        self.r.read_exact(&mut buf)?;
        // Token texts are UTF-8 in every writer; a stray invalid byte is kept visible.
        Ok(String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn value(&mut self, ty: u32, depth: u32) -> io::Result<Value> {
        Ok(match ty {
            T_U8 => Value::Uint(self.fill::<1>()?[0] as u64),
            T_I8 => Value::Int(self.fill::<1>()?[0] as i8 as i64),
            T_U16 => Value::Uint(u16::from_le_bytes(self.fill()?) as u64),
            T_I16 => Value::Int(i16::from_le_bytes(self.fill()?) as i64),
            T_U32 => Value::Uint(self.u32()? as u64),
            T_I32 => Value::Int(i32::from_le_bytes(self.fill()?) as i64),
            T_F32 => Value::Float(f32::from_le_bytes(self.fill()?) as f64),
            T_BOOL => Value::Bool(self.fill::<1>()?[0] != 0),
            T_STRING => Value::Str(self.string()?),
            T_U64 => Value::Uint(self.u64()?),
            T_I64 => Value::Int(i64::from_le_bytes(self.fill()?)),
            T_F64 => Value::Float(f64::from_le_bytes(self.fill()?)),
            T_ARRAY => {
                if depth > 4 {
                    return Err(bad("GGUF arrays nested too deep"));
                }
                let elem = self.u32()?;
                let n = self.count()?;
                if n > MAX_ARRAY {
                    return Err(bad("GGUF array too long"));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            other => return Err(bad(&format!("unknown GGUF value type {other}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }

    #[test]
    fn reads_typed_values_and_arrays() {
        let mut f = b"GGUF".to_vec();
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&7u64.to_le_bytes());
        f.extend_from_slice(&3u64.to_le_bytes());
        s(&mut f, "general.architecture");
        f.extend_from_slice(&T_STRING.to_le_bytes());
        s(&mut f, "llama");
        s(&mut f, "tokenizer.ggml.bos_token_id");
        f.extend_from_slice(&T_U32.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        s(&mut f, "tokenizer.ggml.token_type");
        f.extend_from_slice(&T_ARRAY.to_le_bytes());
        f.extend_from_slice(&T_I32.to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes());
        f.extend_from_slice(&3i32.to_le_bytes());
        f.extend_from_slice(&(-1i32).to_le_bytes());
        f.extend_from_slice(b"tensor infos follow and are never read");
        let m = parse(&mut &f[..]).unwrap();
        assert_eq!((m.version, m.tensor_count), (3, 7));
        assert_eq!(m.str("general.architecture"), Some("llama"));
        assert_eq!(m.u64("tokenizer.ggml.bos_token_id"), Some(1));
        assert_eq!(m.get("tokenizer.ggml.token_type"), Some(&Value::Array(vec![Value::Int(3), Value::Int(-1)])));
    }

    #[test]
    fn rejects_other_files_and_truncation() {
        assert!(parse(&mut &b"GGML\x03\0\0\0"[..]).is_err());
        let mut f = b"GGUF".to_vec();
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        f.extend_from_slice(&1u64.to_le_bytes());
        s(&mut f, "k");
        f.extend_from_slice(&T_STRING.to_le_bytes());
        f.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&mut &f[..]).is_err());
    }
}
