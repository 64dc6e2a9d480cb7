//! Request JSON (sonic-rs, as the gateway parses it) as template values. Objects keep their
//! key order (an IndexMap), as Python dicts do: a template's `tojson` of a tool schema then
//! shows the keys as the client sent them. Integers stay integers and floats floats, so
//! `tojson` writes `1` and `1.0` back as they came.

use minijinja::Value;
use sonic_rs::{JsonNumberTrait, ValueRef};

/// `v` as a template value.
pub fn to_value(v: &sonic_rs::Value) -> Value {
    match v.as_ref() {
        ValueRef::Null => Value::from(()),
        ValueRef::Bool(b) => Value::from(b),
        ValueRef::String(s) => Value::from(s),
        ValueRef::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::from(u)
            } else if let Some(i) = n.as_i64() {
                Value::from(i)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        ValueRef::Array(a) => Value::from(a.iter().map(to_value).collect::<Vec<_>>()),
        ValueRef::Object(o) => {
            let mut m = indexmap::IndexMap::with_capacity(o.len());
            for (k, val) in o.iter() {
                m.insert(Value::from(k), to_value(val));
            }
            Value::from(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_types_and_key_order() {
        let v: sonic_rs::Value = sonic_rs::from_str(r#"{"z": 1, "a": [1.0, -2, "x", null, true], "m": {}}"#).unwrap();
        let t = to_value(&v);
        let keys: Vec<String> = t.try_iter().unwrap().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        let a = t.get_attr("a").unwrap();
        assert!(a.get_item_by_index(0).unwrap().is_number() && !a.get_item_by_index(0).unwrap().is_integer());
        assert_eq!(a.get_item_by_index(1).unwrap().as_i64(), Some(-2));
        assert!(a.get_item_by_index(3).unwrap().is_none());
    }
}
