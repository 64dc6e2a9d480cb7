//! Typed reads of single JSON values; a wrong type is a schema mismatch (`json_parse_error`).
//!
//! `null` reads as absent everywhere, which is how SMG's `Option` fields deserialize.

use std::borrow::Cow;

use super::error::ContractError;
use super::json::{Doc, Kind};

pub type Result<T> = std::result::Result<T, ContractError>;

/// serde-style description of what was found, for "invalid type" messages.
pub fn found(doc: &Doc<'_>, v: usize) -> String {
    let raw = doc.raw(v);
    let short = |r: &[u8]| String::from_utf8_lossy(&r[..r.len().min(40)]).into_owned();
    match doc.kind(v) {
        Kind::Null => "null".into(),
        Kind::Bool => format!("boolean `{}`", doc.node(v).flag),
        Kind::Number if doc.node(v).flag => format!("integer `{}`", short(raw)),
        Kind::Number => format!("floating point `{}`", short(raw)),
        Kind::String => "string".into(),
        Kind::Array => "sequence".into(),
        Kind::Object => "map".into(),
    }
}

pub fn invalid_type(doc: &Doc<'_>, v: usize, field: &str, expected: &str) -> ContractError {
    ContractError::data(format!("{field}: invalid type: {}, expected {expected}", found(doc, v)))
}

pub fn missing(field: &str) -> ContractError {
    ContractError::data(format!("missing field `{field}`"))
}

/// A number (`f32` on SMG's side, so callers compare ranges in `f32`).
pub fn number(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<f64>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::Number => Ok(Some(doc.number(v))),
        _ => Err(invalid_type(doc, v, field, "a number")),
    }
}

/// An integer in `min..=max`; `ty` names the Rust type for the message (`u32`, `i32`, …).
pub fn integer(doc: &Doc<'_>, v: usize, field: &str, ty: &str, min: i128, max: i128) -> Result<Option<i64>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::Number if doc.node(v).flag => {
            let text = std::str::from_utf8(doc.raw(v)).unwrap_or("");
            match text.parse::<i128>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n as i64)),
                _ => Err(ContractError::data(format!(
                    "{field}: invalid value: integer `{}`, expected {ty}",
                    &text[..text.len().min(40)]
                ))),
            }
        }
        _ => Err(invalid_type(doc, v, field, ty)),
    }
}

pub fn uint32(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<u32>> {
    Ok(integer(doc, v, field, "u32", 0, u32::MAX as i128)?.map(|n| n as u32))
}

pub fn boolean(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<bool>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::Bool => Ok(Some(doc.node(v).flag)),
        _ => Err(invalid_type(doc, v, field, "a boolean")),
    }
}

pub fn string<'a>(doc: &Doc<'a>, v: usize, field: &str) -> Result<Option<Cow<'a, str>>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::String => Ok(Some(doc.str(v))),
        _ => Err(invalid_type(doc, v, field, "a string")),
    }
}

/// Like [`string`], keeping only the tape index (no unescape).
pub fn string_idx(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<usize>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::String => Ok(Some(v)),
        _ => Err(invalid_type(doc, v, field, "a string")),
    }
}

pub fn object(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<usize>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::Object => Ok(Some(v)),
        _ => Err(invalid_type(doc, v, field, "a map")),
    }
}

pub fn array(doc: &Doc<'_>, v: usize, field: &str) -> Result<Option<usize>> {
    match doc.kind(v) {
        Kind::Null => Ok(None),
        Kind::Array => Ok(Some(v)),
        _ => Err(invalid_type(doc, v, field, "a sequence")),
    }
}

/// An object whose values are all numbers (`logit_bias`).
pub fn number_map(doc: &Doc<'_>, v: usize, field: &str) -> Result<()> {
    if let Some(obj) = object(doc, v, field)? {
        for (_, val) in doc.members(obj) {
            if doc.kind(val) != Kind::Number {
                return Err(invalid_type(doc, val, field, "f32"));
            }
        }
    }
    Ok(())
}

/// An array of `u32` (`stop_token_ids`).
pub fn uint32_array(doc: &Doc<'_>, v: usize, field: &str) -> Result<()> {
    if let Some(arr) = array(doc, v, field)? {
        for el in doc.elements(arr) {
            if doc.is_null(el) {
                return Err(invalid_type(doc, el, field, "u32"));
            }
            uint32(doc, el, field)?;
        }
    }
    Ok(())
}
