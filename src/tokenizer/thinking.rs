//! Whether a chat request starts the model in reasoning mode, and how its template is told.
//!
//! A template is read once, when it is compiled, for the two things the decision needs: the
//! variable it toggles thinking with (`enable_thinking` — Qwen3, GLM, Nemotron — or
//! `thinking` — DeepSeek V3.1, Kimi) and that toggle's default, and whether it has effort
//! levels of its own (it compares `reasoning_effort` with named levels). Per request the
//! contract's order decides (the first that applies):
//!
//! 1. an explicit toggle in `chat_template_kwargs`;
//! 2. for a template with effort levels, the effort (`chat_template_kwargs.reasoning_effort`,
//!    else the effective effort): `none`/`minimal` off, one of its levels on;
//! 3. `thinking.type`: `enabled` on, `disabled` off;
//! 4. the effective effort: `none`/`minimal` off.
//!
//! Otherwise the template's default stands. The decision is written under the template's
//! own toggle variable (an explicit kwarg for that variable is left as it is).

/// What a template's source says about thinking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThinkingStyle {
    /// The variable the template toggles thinking with.
    pub key: Option<&'static str>,
    /// The toggle's value when nobody sets it.
    pub default_on: bool,
    /// The effort levels the template compares `reasoning_effort` with; None when it names
    /// none (it may still print the variable: that is not a level of its own).
    pub levels: Option<Vec<String>>,
}

/// What the request says; JSON values as the gateway parsed them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThinkingAsk<'a> {
    pub kwargs: Option<&'a sonic_rs::Value>,
    /// `thinking.effort`, else `reasoning_effort`.
    pub effort: Option<&'a str>,
    /// `thinking.type`.
    pub kind: Option<&'a str>,
}

impl<'a> ThinkingAsk<'a> {
    /// What a chat body asks (validated by the contract, which already turned a numeric
    /// `reasoning_effort` into its decimal string).
    pub fn of_body(body: &'a sonic_rs::Value) -> Self {
        use sonic_rs::JsonValueTrait;
        let thinking = body.get("thinking");
        let effort = thinking
            .and_then(|t| t.get("effort"))
            .and_then(|e| e.as_str())
            .or_else(|| body.get("reasoning_effort").and_then(|v| v.as_str()));
        ThinkingAsk {
            kwargs: body.get("chat_template_kwargs").filter(|v| v.is_object()),
            effort,
            kind: thinking.and_then(|t| t.get("type")).and_then(|t| t.as_str()),
        }
    }
}

impl ThinkingStyle {
    /// Reads `source` (the heuristics SMG's template detection uses for the toggle: the
    /// variable's name and an explicit `set … = false` default).
    pub fn detect(source: &str) -> Self {
        let enable = source.contains("enable_thinking");
        // A trailing space or operator keeps `thinking_mode`, `thinking_budget` out.
        let plain = ["if thinking ", "thinking is ", "thinking ==", "set thinking "].iter().any(|p| source.contains(p));
        let key = if enable {
            Some("enable_thinking")
        } else if plain {
            Some("thinking")
        } else {
            None
        };
        let default_off = key.is_some_and(|k| {
            let compact: String = source.split_whitespace().collect();
            compact.contains(&format!("set{k}=false"))
        });
        ThinkingStyle { key, default_on: key.is_some() && !default_off, levels: effort_levels(source) }
    }

    /// The decision, or None when the template's default stands.
    pub fn decide(&self, ask: &ThinkingAsk<'_>) -> Option<bool> {
        use sonic_rs::JsonValueTrait;
        let kw = |k: &str| ask.kwargs.and_then(|o| o.get(k));
        // 1. An explicit toggle: the template's own variable first, then the other name.
        let toggles = self.key.into_iter().chain(["enable_thinking", "thinking"]);
        if let Some(b) = toggles.filter_map(|k| kw(k).and_then(|v| v.as_bool())).next() {
            return Some(b);
        }
        let off = |e: &str| matches!(e, "none" | "minimal");
        // 2. A template with its own levels.
        if let Some(levels) = &self.levels {
            let effort = kw("reasoning_effort").and_then(|v| v.as_str()).or(ask.effort);
            if let Some(e) = effort {
                if off(e) {
                    return Some(false);
                }
                if levels.iter().any(|l| l == e) {
                    return Some(true);
                }
            }
        }
        // 3. thinking.type.
        match ask.kind {
            Some("enabled") => return Some(true),
            Some("disabled") => return Some(false),
            _ => {}
        }
        // 4. The effective effort.
        ask.effort.filter(|e| off(e)).map(|_| false)
    }

    /// Whether the model reasons under `decision` (the template default when None).
    pub fn thinks(&self, decision: Option<bool>) -> bool {
        decision.unwrap_or(self.default_on)
    }
}

/// The string literals compared with `reasoning_effort` (`==`, `!=`, `in [...]`), in the
/// template tags that read it; None when there are none.
fn effort_levels(source: &str) -> Option<Vec<String>> {
    const VAR: &str = "reasoning_effort";
    let mut levels: Vec<String> = Vec::new();
    let mut from = 0;
    while let Some(at) = source[from..].find(VAR).map(|i| i + from) {
        from = at + VAR.len();
        // A longer identifier (`reasoning_effort_map`) is not the variable.
        let next = source[from..].chars().next();
        let prev = source[..at].chars().next_back();
        if next.is_some_and(|c| c.is_alphanumeric() || c == '_')
            || prev.is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let start = source[..at].rfind("{%").into_iter().chain(source[..at].rfind("{{")).max().unwrap_or(0);
        let end = [source[at..].find("%}"), source[at..].find("}}")]
            .into_iter()
            .flatten()
            .min()
            .map_or(source.len(), |e| at + e);
        let tag = &source[start..end];
        if !(tag.contains("==") || tag.contains("!=") || tag.contains(" in ")) {
            continue;
        }
        for lit in literals(tag) {
            let level =
                lit.len() <= 16 && !lit.is_empty() && lit.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if level && !levels.iter().any(|l| l == lit) {
                levels.push(lit.to_string());
            }
        }
    }
    (!levels.is_empty()).then_some(levels)
}

/// Quoted strings ('…' or "…") in a template tag.
fn literals(tag: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = tag;
    while let Some(q) = rest.find(['\'', '"']) {
        let quote = &rest[q..q + 1];
        let body = &rest[q + 1..];
        let Some(close) = body.find(quote) else { break };
        out.push(&body[..close]);
        rest = &body[close + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(s: &str) -> sonic_rs::Value {
        sonic_rs::from_str(s).unwrap()
    }

    #[test]
    fn templates_are_read_for_their_toggle_and_levels() {
        let qwen = ThinkingStyle::detect(
            "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}",
        );
        assert_eq!(qwen, ThinkingStyle { key: Some("enable_thinking"), default_on: true, levels: None });
        let ds = ThinkingStyle::detect(
            "{% if not thinking is defined %}{% set thinking = false %}{% endif %}{% if thinking %}<think>{% endif %}",
        );
        assert_eq!(ds, ThinkingStyle { key: Some("thinking"), default_on: false, levels: None });
        let plain = ThinkingStyle::detect("{{ messages[0].content }}{% set thinking_budget = 3 %}");
        assert_eq!(plain, ThinkingStyle::default());
        let levels = ThinkingStyle::detect(
            "{% if reasoning_effort == 'max' %}M{% elif reasoning_effort in ['high', \"low\"] %}H{% endif %}{{ reasoning_effort_map }}",
        );
        assert_eq!(levels.levels, Some(vec!["max".into(), "high".into(), "low".into()]));
        assert_eq!(ThinkingStyle::detect("Reasoning: {{ reasoning_effort }}").levels, None);
    }

    #[test]
    fn the_first_rule_that_applies_decides() {
        let toggle = ThinkingStyle { key: Some("enable_thinking"), default_on: true, levels: None };
        let leveled = ThinkingStyle { key: Some("thinking"), default_on: false, levels: Some(vec!["max".into()]) };
        let k = kw(r#"{"enable_thinking": false, "reasoning_effort": "max"}"#);
        let none_kw = kw(r#"{"reasoning_effort": "none"}"#);
        let ask = |kwargs, effort, kind| ThinkingAsk { kwargs, effort, kind };
        // 1. An explicit kwarg toggle beats everything.
        assert_eq!(toggle.decide(&ask(Some(&k), Some("high"), Some("enabled"))), Some(false));
        assert_eq!(leveled.decide(&ask(Some(&k), None, None)), Some(false));
        // 2. Levels: the kwarg effort first, a native level is on, none is off, unknown falls through.
        assert_eq!(leveled.decide(&ask(None, Some("max"), Some("disabled"))), Some(true));
        assert_eq!(leveled.decide(&ask(Some(&none_kw), Some("max"), Some("enabled"))), Some(false));
        assert_eq!(leveled.decide(&ask(None, Some("medium"), Some("disabled"))), Some(false));
        // 3. thinking.type; adaptive says nothing.
        assert_eq!(toggle.decide(&ask(None, Some("high"), Some("disabled"))), Some(false));
        assert_eq!(toggle.decide(&ask(None, None, Some("enabled"))), Some(true));
        assert_eq!(toggle.decide(&ask(None, None, Some("adaptive"))), None);
        // 4. The effective effort.
        assert_eq!(toggle.decide(&ask(None, Some("minimal"), Some("adaptive"))), Some(false));
        assert_eq!(toggle.decide(&ask(None, Some("high"), None)), None);
        assert!(toggle.thinks(None) && !toggle.thinks(Some(false)));
    }
}
