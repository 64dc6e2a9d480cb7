//! Sampling fields shared by Chat Completions and Completions: typed reads and range rules.

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};

/// Fields both endpoints model, read from the top-level object.
#[derive(Default)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_tokens: Option<u32>,
    pub n: Option<u32>,
    /// `stop` value: a string or an array of strings.
    pub stop: Option<usize>,
    pub stream: bool,
    /// `stream_options` object (`null` reads as absent).
    pub stream_options: Option<usize>,
    pub regex: bool,
    pub ebnf: bool,
}

// === impl Sampling ===

impl Sampling {
    /// Read `key` if it is a shared field; `Ok(false)` leaves it to the endpoint.
    pub fn read(&mut self, doc: &Doc<'_>, key: &[u8], v: usize) -> Result<bool> {
        match key {
            b"temperature" => self.temperature = fields::number(doc, v, "temperature")?,
            b"top_p" => self.top_p = fields::number(doc, v, "top_p")?,
            b"presence_penalty" => self.presence_penalty = fields::number(doc, v, "presence_penalty")?,
            b"frequency_penalty" => self.frequency_penalty = fields::number(doc, v, "frequency_penalty")?,
            b"repetition_penalty" => self.repetition_penalty = fields::number(doc, v, "repetition_penalty")?,
            b"min_p" => self.min_p = fields::number(doc, v, "min_p")?,
            b"top_k" => self.top_k = fields::integer(doc, v, "top_k", "i32", i32::MIN as i128, i32::MAX as i128)?,
            b"min_tokens" => self.min_tokens = fields::uint32(doc, v, "min_tokens")?,
            b"n" => self.n = fields::uint32(doc, v, "n")?,
            b"stream" => self.stream = fields::boolean(doc, v, "stream")?.unwrap_or(false),
            b"stream_options" => {
                self.stream_options = fields::object(doc, v, "stream_options")?;
                if let Some(obj) = self.stream_options {
                    // Modeled keys are typed; any other key is forwarded untouched.
                    for (k, val) in doc.members(obj) {
                        match &*doc.key(k) {
                            b"include_usage" => {
                                fields::boolean(doc, val, "stream_options.include_usage")?;
                            }
                            b"continuous_usage_stats" => {
                                fields::boolean(doc, val, "stream_options.continuous_usage_stats")?;
                            }
                            _ => {}
                        }
                    }
                }
            }
            b"stop" => {
                self.stop = match doc.kind(v) {
                    Kind::Null => None,
                    Kind::String => Some(v),
                    Kind::Array => {
                        for el in doc.elements(v) {
                            if doc.kind(el) != Kind::String {
                                return Err(fields::invalid_type(doc, el, "stop", "a string"));
                            }
                        }
                        Some(v)
                    }
                    _ => return Err(fields::invalid_type(doc, v, "stop", "a string or an array of strings")),
                }
            }
            b"regex" => self.regex = fields::string_idx(doc, v, "regex")?.is_some(),
            b"ebnf" => self.ebnf = fields::string_idx(doc, v, "ebnf")?.is_some(),
            b"logit_bias" => fields::number_map(doc, v, "logit_bias")?,
            b"stop_token_ids" => fields::uint32_array(doc, v, "stop_token_ids")?,
            b"user" => {
                fields::string_idx(doc, v, "user")?;
            }
            b"rid" => {
                fields::string_idx(doc, v, "rid")?;
            }
            b"sampling_seed" => {
                fields::integer(doc, v, "sampling_seed", "u64", 0, u64::MAX as i128)?;
            }
            b"ignore_eos" | b"no_stop_trim" | b"skip_special_tokens" | b"return_hidden_states" => {
                fields::boolean(doc, v, std::str::from_utf8(key).unwrap_or("field"))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub fn check_temperature(&self) -> Result<()> {
        range("temperature", self.temperature, 0.0, 2.0)
    }

    pub fn check_top_p(&self) -> Result<()> {
        match self.top_p.map(|p| p as f32) {
            Some(p) if !(p > 0.0 && p <= 1.0) => {
                Err(ContractError::field("top_p must be in (0, 1] - greater than 0.0 and at most 1.0"))
            }
            _ => Ok(()),
        }
    }

    pub fn check_penalties(&self) -> Result<()> {
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)
    }

    /// The SGLang extensions: `top_k`, `min_p`, `repetition_penalty`.
    pub fn check_extensions(&self) -> Result<()> {
        if let Some(k) = self.top_k {
            if k != -1 && k < 1 {
                return Err(ContractError::field("top_k must be -1 (disabled) or at least 1"));
            }
        }
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("repetition_penalty", self.repetition_penalty, 0.0, 2.0)
    }

    pub fn check_n(&self, max: u32) -> Result<()> {
        match self.n {
            Some(n) if !(1..=max).contains(&n) => Err(ContractError::field(format!("n must be between 1 and {max}"))),
            _ => Ok(()),
        }
    }

    /// At most 4 stop sequences, none empty.
    pub fn check_stop(&self, doc: &Doc<'_>) -> Result<()> {
        let Some(stop) = self.stop else { return Ok(()) };
        let empty = |s: usize| doc.node(s).end - doc.node(s).start == 2;
        if doc.kind(stop) == Kind::String {
            if empty(stop) {
                return Err(ContractError::field("stop sequences cannot be empty"));
            }
            return Ok(());
        }
        if doc.elements(stop).count() > 4 {
            return Err(ContractError::field("maximum 4 stop sequences allowed"));
        }
        if doc.elements(stop).any(empty) {
            return Err(ContractError::field("stop sequences cannot be empty"));
        }
        Ok(())
    }

    pub fn check_stream_options(&self) -> Result<()> {
        if self.stream_options.is_some() && !self.stream {
            return Err(ContractError::rule("The 'stream_options' parameter is only allowed when 'stream' is enabled"));
        }
        Ok(())
    }
}

/// `lo <= v <= hi`, compared in `f32` like SMG's typed fields.
pub fn range(name: &str, v: Option<f64>, lo: f32, hi: f32) -> Result<()> {
    match v.map(|x| x as f32) {
        Some(x) if !(x >= lo && x <= hi) => Err(ContractError::field(format!("{name} must be between {lo} and {hi}"))),
        _ => Ok(()),
    }
}
