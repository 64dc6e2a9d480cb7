//! The chat templates' `tojson` filter, writing what transformers' does: Python's
//! `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`. Jinja's and
//! minijinja's own `tojson` escape `<`, `>`, `&` and `'` for HTML and space differently; a
//! template that shows tool schemas to the model must produce the very text the model was
//! trained on, so Python's spacing (`{"a": 1, "b": [1, 2]}`) and key order are kept.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `value | tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        },
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none()) {
        Some(v) => {
            let item = v.get_item_by_index(0)?;
            let key = v.get_item_by_index(1)?;
            (item.as_str().unwrap_or(",").to_string(), key.as_str().unwrap_or(": ").to_string())
        }
        // Python: ", " without an indent, "," with one (the newline separates).
        None => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let mut w = Writer { out: String::new(), indent, item_sep, key_sep, sort_keys, ensure_ascii };
    w.value(value, 0)?;
    // Marked safe: the text is inserted as is (chat templates never HTML-escape).
    Ok(Value::from_safe_string(w.out))
}

struct Writer {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Writer {
    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        if depth > 64 {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deep"));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v),
            ValueKind::String | ValueKind::Bytes => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    self.separator(i, depth + 1, keys.len());
                    match k.as_str() {
                        Some(s) => self.string(s),
                        // Python turns int/float/bool/None keys into their JSON text, quoted.
                        None => self.string(&k.to_string()),
                    }
                    self.out.push_str(&self.key_sep.clone());
                    self.value(&v.get_item(k)?, depth + 1)?;
                }
                self.close(depth, keys.is_empty(), '}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, depth + 1, items.len());
                    self.value(item, depth + 1)?;
                }
                self.close(depth, items.is_empty(), ']');
            }
            _ => self.string(&v.to_string()),
        }
        Ok(())
    }

    /// Before item `i`: the item separator (after the first), then a newline and indent.
    fn separator(&mut self, i: usize, depth: usize, _len: usize) {
        if i > 0 {
            self.out.push_str(&self.item_sep.clone());
        }
        if let Some(ind) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
    }

    fn close(&mut self, depth: usize, empty: bool, c: char) {
        if let (Some(ind), false) = (&self.indent, empty) {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
        self.out.push(c);
    }

    fn number(&mut self, v: &Value) {
        if v.is_integer() {
            self.out.push_str(&v.to_string());
        } else {
            self.out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)));
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0C}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 and from 1e16.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust's `{:e}` gives the same shortest digits: "1.5e-5" → Python "1.5e-05".
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(tpl: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(tpl, ctx).unwrap()
    }

    #[test]
    fn writes_python_json_dumps() {
        let mut m = indexmap::IndexMap::new();
        m.insert(Value::from("z"), Value::from(1));
        m.insert(Value::from("a"), Value::from(vec![Value::from(1.5), Value::from(2.0), Value::from(())]));
        m.insert(Value::from("s"), Value::from("<é\"\n>"));
        let ctx = Value::from(std::collections::BTreeMap::from([("x", Value::from(m))]));
        assert_eq!(render("{{ x | tojson }}", ctx.clone()), r#"{"z": 1, "a": [1.5, 2.0, null], "s": "<é\"\n>"}"#);
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}", ctx.clone()),
            r#"{"a": [1.5, 2.0, null], "s": "<é\"\n>", "z": 1}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", ctx.clone()),
            "{\n  \"z\": 1,\n  \"a\": [\n    1.5,\n    2.0,\n    null\n  ],\n  \"s\": \"<é\\\"\\n>\"\n}"
        );
        assert_eq!(
            render("{{ x | tojson(separators=(',', ':')) }}", ctx.clone()),
            r#"{"z":1,"a":[1.5,2.0,null],"s":"<é\"\n>"}"#
        );
        assert_eq!(render("{{ 'é' | tojson(ensure_ascii=true) }}", ctx), r#""\u00e9""#);
    }

    #[test]
    fn python_float_reprs() {
        assert_eq!(py_float(1e-5), "1e-05");
        assert_eq!(py_float(1.5e20), "1.5e+20");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.0), "0.0");
    }
}
