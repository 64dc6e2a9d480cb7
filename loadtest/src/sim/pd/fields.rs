//! Reads a PD request's bootstrap fields (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`),
//! one value each or, for a batch, one array entry per item.
//!
//! A second lazy pass over the body's top-level keys, taken only by PD workers, so the common
//! request parser (request.rs) stays as it is.

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

/// Largest room: SGLang draws rooms in [0, 2^63-1].
pub(crate) const MAX_ROOM: u64 = i64::MAX as u64;

/// One item's handoff: where the prefill's bootstrap server is, and which room holds its KV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leg {
    pub(crate) host: String,
    /// None when the request said null (the decode then uses SGLang's default bootstrap port).
    pub(crate) port: Option<u16>,
    pub(crate) room: u64,
}

/// One field: a single value, or one per batch item.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Field<T> {
    One(T),
    Many(Vec<T>),
}

// === impl Field ===

impl<T: Clone> Field<T> {
    fn len(&self) -> Option<usize> {
        match self {
            Field::One(_) => None,
            Field::Many(v) => Some(v.len()),
        }
    }

    /// Item `i`'s value: a single value applies to every item.
    fn at(&self, i: usize) -> T {
        match self {
            Field::One(v) => v.clone(),
            Field::Many(v) => v[i].clone(),
        }
    }
}

/// The bootstrap fields a request carried (absent or null fields are None).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fields {
    host: Option<Field<String>>,
    port: Option<Field<Option<u16>>>,
    room: Option<Field<u64>>,
}

/// Reads the fields; an error is a malformed value, for a 400.
pub(crate) fn read(body: &[u8]) -> Result<Fields, String> {
    let mut f = Fields::default();
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.map_err(|e| format!("invalid JSON body: {e}"))?;
        let key = key.as_ref();
        // A null port is a value (SGLang sends it when the prefill has no bootstrap port set); a
        // null host or room is as good as none.
        let wanted = match key {
            "bootstrap_port" => true,
            "bootstrap_host" | "bootstrap_room" => !value.is_null(),
            _ => false,
        };
        if !wanted {
            continue;
        }
        let v: sonic_rs::Value = sonic_rs::from_str(value.as_raw_str()).map_err(|e| format!("{key}: {e}"))?;
        match key {
            "bootstrap_host" => f.host = Some(field(&v, key, host)?),
            "bootstrap_port" => f.port = Some(field(&v, key, port)?),
            _ => f.room = Some(field(&v, key, room)?),
        }
    }
    Ok(f)
}

/// Applies `one` to a value, or to each entry of an array.
fn field<T>(v: &sonic_rs::Value, key: &str, one: fn(&sonic_rs::Value) -> Option<T>) -> Result<Field<T>, String> {
    let bad = || format!("{key} has an invalid value");
    match v.as_array() {
        Some(items) if items.is_empty() => Err(format!("{key} is an empty array")),
        Some(items) => items.iter().map(|i| one(i).ok_or_else(bad)).collect::<Result<_, _>>().map(Field::Many),
        None => one(v).map(Field::One).ok_or_else(bad),
    }
}

fn host(v: &sonic_rs::Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// An integer port or null (SGLang sends null when the prefill has no bootstrap port configured).
fn port(v: &sonic_rs::Value) -> Option<Option<u16>> {
    if v.is_null() {
        return Some(None);
    }
    v.as_u64().and_then(|p| u16::try_from(p).ok()).map(Some)
}

fn room(v: &sonic_rs::Value) -> Option<u64> {
    v.as_u64().filter(|r| *r <= MAX_ROOM)
}

// === impl Fields ===

impl Fields {
    /// The rooms a prefill worker marks finished (it needs `bootstrap_room` only).
    pub(crate) fn rooms(&self) -> Result<Vec<u64>, String> {
        match &self.room {
            Some(Field::One(r)) => Ok(vec![*r]),
            Some(Field::Many(rs)) => Ok(rs.clone()),
            None => Err("bootstrap_room is required on a prefill server".into()),
        }
    }

    /// One leg per item for a decode worker, which needs all three fields. Array fields must
    /// agree on the batch size; a single value applies to every item.
    pub(crate) fn legs(&self) -> Result<Vec<Leg>, String> {
        let (Some(host), Some(port), Some(room)) = (&self.host, &self.port, &self.room) else {
            return Err("bootstrap_host, bootstrap_port and bootstrap_room are required on a decode server".into());
        };
        let sizes: Vec<usize> = [host.len(), port.len(), room.len()].into_iter().flatten().collect();
        let n = sizes.first().copied().unwrap_or(1);
        if sizes.iter().any(|s| *s != n) {
            return Err("bootstrap_host, bootstrap_port and bootstrap_room arrays differ in length".into());
        }
        Ok((0..n).map(|i| Leg { host: host.at(i), port: port.at(i), room: room.at(i) }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leg(host: &str, port: Option<u16>, room: u64) -> Leg {
        Leg { host: host.into(), port, room }
    }

    #[test]
    fn single_request() {
        let f = read(br#"{"text":"a","bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":42}"#).unwrap();
        assert_eq!(f.rooms().unwrap(), [42]);
        assert_eq!(f.legs().unwrap(), [leg("10.0.0.1", Some(8998), 42)]);
        let f = read(br#"{"bootstrap_host":"h","bootstrap_port":null,"bootstrap_room":9223372036854775807}"#).unwrap();
        assert_eq!(f.legs().unwrap(), [leg("h", None, i64::MAX as u64)]);
    }

    #[test]
    fn batched_request() {
        let f =
            read(br#"{"prompt":["a","b"],"bootstrap_host":["h1","h2"],"bootstrap_port":[1,2],"bootstrap_room":[7,8]}"#)
                .unwrap();
        assert_eq!(f.rooms().unwrap(), [7, 8]);
        assert_eq!(f.legs().unwrap(), [leg("h1", Some(1), 7), leg("h2", Some(2), 8)]);
        // A single value applies to every item.
        let f = read(br#"{"bootstrap_host":"h","bootstrap_port":[1,null],"bootstrap_room":[7,8]}"#).unwrap();
        assert_eq!(f.legs().unwrap(), [leg("h", Some(1), 7), leg("h", None, 8)]);
        let f = read(br#"{"bootstrap_host":["a"],"bootstrap_port":[1,2],"bootstrap_room":[7,8]}"#).unwrap();
        assert!(f.legs().is_err(), "lengths differ");
    }

    #[test]
    fn missing_and_bad_fields() {
        let f = read(br#"{"text":"a"}"#).unwrap();
        assert!(f.rooms().is_err() && f.legs().is_err());
        // A prefill needs only the room; a decode needs all three.
        let f = read(br#"{"bootstrap_room":1,"bootstrap_host":null}"#).unwrap();
        assert_eq!(f.rooms().unwrap(), [1]);
        assert!(f.legs().is_err());
        for bad in [
            r#"{"bootstrap_room":-1}"#,
            r#"{"bootstrap_room":9223372036854775808}"#,
            r#"{"bootstrap_room":"1"}"#,
            r#"{"bootstrap_room":[]}"#,
            r#"{"bootstrap_room":[1,"x"]}"#,
            r#"{"bootstrap_port":70000}"#,
            r#"{"bootstrap_host":""}"#,
            r#"{"bootstrap_host":3}"#,
            r#"{"bootstrap_room":1"#,
        ] {
            assert!(read(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
