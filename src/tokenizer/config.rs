//! `tokenizer_config.json`: what the chat template and the detokenizer need beyond
//! `tokenizer.json` (the template, bos/eos and the other named special tokens, whether bos/eos
//! are added). Hugging Face writes these fields in several shapes over its versions (a token
//! as a string or as an `AddedToken` object, the template as a string or a list of named
//! templates); all are read here, once, at load.

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerConfig {
    /// The default chat template (`chat_template`, or the one named `default` in a list).
    pub chat_template: Option<String>,
    /// Other named templates (`tool_use`, `rag`, …) of a list-shaped `chat_template`.
    pub named_templates: Vec<(String, String)>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    pub model_max_length: Option<u64>,
}

impl TokenizerConfig {
    /// Parses the JSON text of a `tokenizer_config.json`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let v = crate::bounded_json::value(json.as_bytes()).map_err(|e| format!("tokenizer_config.json: {e}"))?;
        if !v.is_object() {
            return Err("tokenizer_config.json: not an object".into());
        }
        let mut cfg = TokenizerConfig {
            bos_token: token_text(&v["bos_token"]),
            eos_token: token_text(&v["eos_token"]),
            unk_token: token_text(&v["unk_token"]),
            pad_token: token_text(&v["pad_token"]),
            add_bos_token: v["add_bos_token"].as_bool().unwrap_or(false),
            add_eos_token: v["add_eos_token"].as_bool().unwrap_or(false),
            // HF writes a huge sentinel (1e30) for "no limit"; that is no limit here either.
            model_max_length: v["model_max_length"].as_u64().filter(|&n| n < (1 << 40)),
            ..Default::default()
        };
        let t = &v["chat_template"];
        if let Some(s) = t.as_str() {
            cfg.chat_template = Some(s.to_string());
        } else if let Some(list) = t.as_array() {
            for item in list.iter() {
                if let (Some(name), Some(tpl)) = (item["name"].as_str(), item["template"].as_str()) {
                    if name == "default" {
                        cfg.chat_template = Some(tpl.to_string());
                    } else {
                        cfg.named_templates.push((name.to_string(), tpl.to_string()));
                    }
                }
            }
        }
        Ok(cfg)
    }

    /// The named special tokens as template variables, as transformers passes its
    /// `special_tokens_map` to the template.
    pub fn special_tokens(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("pad_token", &self.pad_token),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    }
}

/// A token written as `"<s>"` or as `{"content": "<s>", "__type": "AddedToken", …}`.
fn token_text(v: &sonic_rs::Value) -> Option<String> {
    v.as_str().or_else(|| v["content"].as_str()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_config_is_an_error_not_a_stack_overflow() {
        let deep = format!(r#"{{"eos_token":"</s>","x":{}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(TokenizerConfig::parse(&deep).unwrap_err().contains("recursion limit exceeded"));
    }

    #[test]
    fn reads_strings_objects_and_named_templates() {
        let cfg = TokenizerConfig::parse(
            r#"{"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
                "add_bos_token": true, "model_max_length": 1000000000000000019884624838656,
                "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}"#,
        )
        .unwrap();
        assert_eq!(cfg.bos_token.as_deref(), Some("<s>"));
        assert_eq!(cfg.eos_token.as_deref(), Some("</s>"));
        assert!(cfg.add_bos_token && !cfg.add_eos_token);
        assert_eq!(cfg.model_max_length, None);
        assert_eq!(cfg.chat_template.as_deref(), Some("D"));
        assert_eq!(cfg.named_templates, vec![("tool_use".to_string(), "T".to_string())]);
        assert_eq!(cfg.special_tokens().collect::<Vec<_>>(), vec![("bos_token", "<s>"), ("eos_token", "</s>")]);
    }

    #[test]
    fn a_plain_template_and_garbage() {
        let cfg = TokenizerConfig::parse(r#"{"chat_template": "{{ x }}", "model_max_length": 8192}"#).unwrap();
        assert_eq!(cfg.chat_template.as_deref(), Some("{{ x }}"));
        assert_eq!(cfg.model_max_length, Some(8192));
        assert!(TokenizerConfig::parse("[1]").is_err());
        assert!(TokenizerConfig::parse("{").is_err());
    }
}
