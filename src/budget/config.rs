//! `--tenant-rate-limit-config`: SMG's YAML schema and its validation rules, unchanged, so an
//! SMG policy file works here. A file that cannot be read or fails validation is an error
//! naming the file (and the line, where the YAML parser knows it); the caller logs it and
//! starts without a limiter, as SMG does.

use std::collections::HashMap;

use serde::Deserialize;

use super::store::ScopeLimits;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    default_policy: RawPolicy,
    #[serde(default)]
    tenants: Vec<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    tenant_key: Option<String>,
    tokens_per_minute: i64,
    requests_per_minute: i64,
    #[serde(default)]
    model_rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    rule_id: String,
    matcher: RawMatcher,
    tokens_per_minute: i64,
    requests_per_minute: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatcher {
    #[serde(rename = "type")]
    kind: MatchKind,
    value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatchKind {
    Exact,
    Prefix,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRule {
    pub id: String,
    pub kind: MatchKind,
    pub value: String,
    pub limits: ScopeLimits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub limits: ScopeLimits,
    pub rules: Vec<ModelRule>,
}

// === impl Policy ===

impl Policy {
    /// The one rule for `model`: an exact match, else the longest matching prefix.
    pub fn rule_for(&self, model: &str) -> Option<&ModelRule> {
        self.rules.iter().find(|r| r.kind == MatchKind::Exact && r.value == model).or_else(|| {
            self.rules
                .iter()
                .filter(|r| r.kind == MatchKind::Prefix && model.starts_with(&r.value))
                .max_by_key(|r| r.value.len())
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetConfig {
    pub default: Policy,
    pub tenants: HashMap<String, Policy>,
}

// === impl BudgetConfig ===

impl BudgetConfig {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let f: File = serde_yaml::from_str(text).map_err(|e| match e.location() {
            Some(l) => format!("line {}, column {}: {e}", l.line(), l.column()),
            None => e.to_string(),
        })?;
        if f.default_policy.tenant_key.is_some() {
            return Err("default_policy must not set tenant_key".into());
        }
        let default = policy(f.default_policy, "default_policy")?;
        let mut tenants = HashMap::new();
        for (i, t) in f.tenants.into_iter().enumerate() {
            let at = format!("tenants[{i}]");
            let key = t.tenant_key.clone().ok_or_else(|| format!("{at}: tenant_key is required"))?;
            if key.is_empty() || key.trim() != key {
                return Err(format!("{at}: tenant_key must be non-empty without surrounding whitespace"));
            }
            let canonical = ["auth:", "header:", "ip:"].iter().any(|p| key.len() > p.len() && key.starts_with(p))
                || key == "anonymous";
            if !canonical {
                return Err(format!(
                    "{at}: tenant_key '{key}' is not a canonical tenant key (auth:…, header:…, ip:… or anonymous)"
                ));
            }
            let p = policy(t, &at)?;
            if tenants.insert(key.clone(), p).is_some() {
                return Err(format!("{at}: tenant_key '{key}' appears twice"));
            }
        }
        Ok(BudgetConfig { default, tenants })
    }

    /// The policy of `tenant` (its own, else the default).
    pub fn policy(&self, tenant: &str) -> &Policy {
        self.tenants.get(tenant).unwrap_or(&self.default)
    }
}

fn limits(at: &str, t: i64, r: i64) -> Result<ScopeLimits, String> {
    if t <= 0 {
        return Err(format!("{at}: tokens_per_minute must be > 0 (got {t})"));
    }
    if r <= 0 {
        return Err(format!("{at}: requests_per_minute must be > 0 (got {r})"));
    }
    Ok(ScopeLimits { tokens_per_minute: t as u64, requests_per_minute: r as u64 })
}

fn policy(p: RawPolicy, at: &str) -> Result<Policy, String> {
    let own = limits(at, p.tokens_per_minute, p.requests_per_minute)?;
    let mut rules: Vec<ModelRule> = Vec::new();
    for (i, r) in p.model_rules.into_iter().enumerate() {
        let rat = format!("{at}.model_rules[{i}]");
        if r.rule_id.is_empty() || !r.rule_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(format!("{rat}: rule_id '{}' must match [A-Za-z0-9._-]+", r.rule_id));
        }
        if rules.iter().any(|x| x.id == r.rule_id) {
            return Err(format!("{rat}: rule_id '{}' appears twice", r.rule_id));
        }
        let v = r.matcher.value;
        if v.is_empty() || v.trim() != v {
            return Err(format!("{rat}: matcher.value must be non-empty without surrounding whitespace"));
        }
        if rules.iter().any(|x| x.kind == r.matcher.kind && x.value == v) {
            return Err(format!("{rat}: another rule already matches {:?} '{v}'", r.matcher.kind));
        }
        let limits = limits(&rat, r.tokens_per_minute, r.requests_per_minute)?;
        rules.push(ModelRule { id: r.rule_id, kind: r.matcher.kind, value: v, limits });
    }
    Ok(Policy { limits: own, rules })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMG_EXAMPLE: &str = r#"
default_policy:
  tokens_per_minute: 100000
  requests_per_minute: 600

tenants:
  - tenant_key: "auth:team-red"
    tokens_per_minute: 500000
    requests_per_minute: 3000
    model_rules:
      - rule_id: gpt4-cap
        matcher:
          type: exact
          value: gpt-4
        tokens_per_minute: 50000
        requests_per_minute: 300
      - rule_id: legacy-models
        matcher:
          type: prefix
          value: "legacy-"
        tokens_per_minute: 10000
        requests_per_minute: 100

  - tenant_key: "anonymous"
    tokens_per_minute: 5000
    requests_per_minute: 60
"#;

    #[test]
    fn smgs_own_example_loads() {
        let c = BudgetConfig::parse(SMG_EXAMPLE).unwrap();
        assert_eq!(c.default.limits.tokens_per_minute, 100_000);
        let red = c.policy("auth:team-red");
        assert_eq!(red.rule_for("gpt-4").unwrap().id, "gpt4-cap");
        assert_eq!(red.rule_for("legacy-x").unwrap().id, "legacy-models");
        assert!(red.rule_for("gpt-4o").is_none());
        assert_eq!(c.policy("auth:someone").limits.requests_per_minute, 600);
        assert_eq!(c.policy("anonymous").limits.tokens_per_minute, 5000);
    }

    #[test]
    fn bad_files_are_refused_with_where() {
        let cases = [
            ("default_policy: [", "line"),
            ("default_policy:\n  tokens_per_minute: -5\n  requests_per_minute: 1\n", "tokens_per_minute must be > 0"),
            ("default_policy:\n  tokens_per_minute: 5\n  requests_per_minute: 1\ntenant: []\n", "unknown field `tenant`"),
            ("default_policy:\n  tokens_per_minute: 5\n  requests_per_minute: 1\ntenants:\n  - tenant_key: team\n    tokens_per_minute: 1\n    requests_per_minute: 1\n", "canonical"),
            ("default_policy:\n  tenant_key: auth:x\n  tokens_per_minute: 5\n  requests_per_minute: 1\n", "must not set tenant_key"),
        ];
        for (text, want) in cases {
            let e = BudgetConfig::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = BudgetConfig::parse("default_policy:\n  tokens_per_minute: 5\n  requests_per_minute: x\n").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
    }
}
