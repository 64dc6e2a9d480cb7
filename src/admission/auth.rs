//! Who may come in: API keys, tenant keys, control-plane keys, and the tenant identity of
//! every request. Decided from the head alone, before a byte of the body is read.
//!
//! Keys are never compared as given: each configured key is stored as its SHA-256, and a
//! presented key is hashed once and looked up by digest. The lookup's timing depends only
//! on the digest, which tells an attacker nothing about any key, and the matched digest is
//! compared again in constant time. A key never appears in a log line or an error message.
//! One SHA-256 of a short key is ~0.1 µs with the CPU's SHA extensions.

use std::collections::HashMap;
use std::rc::Rc;

use sha2::{Digest, Sha256};

type KeyHash = [u8; 32];

fn hash(key: &[u8]) -> KeyHash {
    Sha256::digest(key).into()
}

/// Equal in time independent of where the inputs differ.
fn ct_eq(a: &KeyHash, b: &KeyHash) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    User,
}

/// The validated key configuration (shared read-only by every shard).
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Serving keys (`--api-key`, `--tenant-api-key`) by digest → tenant identity. The
    /// identities live as long as the process (leaked once at start), so a request names its
    /// tenant without touching a refcount shared between cores.
    serving: HashMap<KeyHash, &'static str>,
    /// The digest of `--api-key`.
    shared: Option<KeyHash>,
    /// Control-plane keys by digest → role.
    control: HashMap<KeyHash, Role>,
    /// `--trust-tenant-header`: the (lowercase) header to take the tenant from.
    tenant_header: Option<String>,
}

/// What a request presented, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// 401, empty body: no key, or one that matches nothing.
    Unauthorized,
    /// 403, empty body: a valid control-plane key without the admin role.
    Forbidden,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl AuthConfig {
    /// Parses the flags; errors name the flag and never echo a key.
    pub fn parse(
        api_key: Option<&str>,
        tenant_keys: &[String],
        control_keys: &[String],
        tenant_header: Option<String>,
    ) -> Result<AuthConfig, String> {
        let mut cfg = AuthConfig { tenant_header, ..AuthConfig::default() };
        if let Some(k) = api_key {
            if k.is_empty() {
                return Err("--api-key: must not be empty".into());
            }
            let h = hash(k.as_bytes());
            let mut id = String::with_capacity(5 + 64);
            id.push_str("auth:");
            for b in h {
                id.push(HEX[(b >> 4) as usize] as char);
                id.push(HEX[(b & 15) as usize] as char);
            }
            cfg.shared = Some(h);
            cfg.serving.insert(h, id.leak());
        }
        for entry in tenant_keys {
            let Some((tenant, key)) = entry.split_once(':') else {
                return Err("--tenant-api-key: expected TENANT:KEY (missing ':')".into());
            };
            if tenant.is_empty() || key.is_empty() {
                return Err("--tenant-api-key: TENANT and KEY must not be empty".into());
            }
            let h = hash(key.as_bytes());
            if cfg.serving.insert(h, format!("auth:{tenant}").leak()).is_some() {
                return Err(format!("--tenant-api-key: tenant '{tenant}' reuses a key given before"));
            }
        }
        for entry in control_keys.iter().filter(|e| !e.trim().is_empty()) {
            let parts: Vec<&str> = entry.trim().splitn(4, ':').collect();
            let [id, _name, role, key] = parts[..] else {
                return Err("--control-plane-api-keys: expected ID:NAME:ROLE:KEY".into());
            };
            let role = match role.to_ascii_lowercase().as_str() {
                "admin" => Role::Admin,
                "user" => Role::User,
                other => {
                    return Err(format!("--control-plane-api-keys: key '{id}': unknown role '{other}' (admin or user)"))
                }
            };
            if id.is_empty() || key.is_empty() {
                return Err("--control-plane-api-keys: ID and KEY must not be empty".into());
            }
            cfg.control.insert(hash(key.as_bytes()), role);
        }
        Ok(cfg)
    }

    /// Serving routes need a key when any serving key is configured.
    pub fn serving_enabled(&self) -> bool {
        !self.serving.is_empty()
    }

    /// Checks a serving request; on success, the tenant its key names (None: no key needed
    /// and none given).
    pub fn check_serving(&self, authorization: Option<&[u8]>) -> Result<Option<&'static str>, Verdict> {
        if !self.serving_enabled() {
            return Ok(None);
        }
        let h = bearer(authorization).map(hash).ok_or(Verdict::Unauthorized)?;
        match self.serving.get_key_value(&h) {
            Some((k, tenant)) if ct_eq(k, &h) => Ok(Some(*tenant)),
            _ => Err(Verdict::Unauthorized),
        }
    }

    /// Checks an admin request (the contract's rules, in its order).
    pub fn check_admin(&self, authorization: Option<&[u8]>) -> Verdict {
        let presented = bearer(authorization).map(hash);
        if !self.control.is_empty() {
            return match presented.and_then(|h| self.control.get_key_value(&h).filter(|(k, _)| ct_eq(k, &h))) {
                Some((_, Role::Admin)) => Verdict::Pass,
                Some((_, Role::User)) => Verdict::Forbidden,
                None => Verdict::Unauthorized,
            };
        }
        match (self.shared, presented) {
            (Some(s), Some(h)) if ct_eq(&s, &h) => Verdict::Pass,
            (Some(_), _) => Verdict::Unauthorized,
            // Only tenant keys: admin routes are closed to everyone.
            (None, _) if self.serving_enabled() => Verdict::Unauthorized,
            (None, _) => Verdict::Pass,
        }
    }

    /// `key` is one of the gateway's own (a serving or a control-plane key): it never goes to
    /// a provider, whatever header it came in.
    pub fn is_gateway_key(&self, key: &[u8]) -> bool {
        let h = hash(key);
        self.serving.get_key_value(&h).is_some_and(|(k, _)| ct_eq(k, &h))
            || self.control.get_key_value(&h).is_some_and(|(k, _)| ct_eq(k, &h))
    }

    /// The header `--trust-tenant-header` reads, if on.
    pub fn tenant_header(&self) -> Option<&str> {
        self.tenant_header.as_deref()
    }
}

/// The key of `Authorization: Bearer <key>` (scheme case-insensitive, one space, a key of
/// visible ASCII).
fn bearer(value: Option<&[u8]>) -> Option<&[u8]> {
    let v = value?;
    if v.len() < 8 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let key = &v[7..];
    (!key.is_empty() && key.iter().all(|b| b.is_ascii_graphic())).then_some(key)
}

/// A request's tenant identity, as the contract names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenant {
    /// `auth:<tenant>` from a tenant key, or `auth:<sha256>` for the shared `--api-key`.
    Key(&'static str),
    /// `header:<value>` from a trusted tenant header.
    Header(Rc<str>),
    Anonymous,
}

impl Tenant {
    pub fn as_str(&self) -> &str {
        match self {
            Tenant::Key(k) => k,
            Tenant::Header(h) => h,
            Tenant::Anonymous => "anonymous",
        }
    }
}

/// The identity of a caller no key identified: `header:<value>` when the tenant header is
/// trusted and present, else anonymous.
pub fn unauthenticated_tenant(header: Option<&[u8]>) -> Tenant {
    match header.filter(|v| !v.is_empty() && v.len() <= 256 && v.iter().all(|b| b.is_ascii_graphic())) {
        Some(v) => Tenant::Header(Rc::from(format!("header:{}", String::from_utf8_lossy(v)))),
        None => Tenant::Anonymous,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(api: Option<&str>, tenants: &[&str], control: &[&str]) -> AuthConfig {
        let t: Vec<String> = tenants.iter().map(|s| s.to_string()).collect();
        let c: Vec<String> = control.iter().map(|s| s.to_string()).collect();
        AuthConfig::parse(api, &t, &c, None).unwrap()
    }

    #[test]
    fn serving_keys_name_their_tenant() {
        let a = cfg(Some("shared"), &["team-red:red", "team-blue:blue"], &[]);
        assert_eq!(a.check_serving(Some(b"Bearer red")).unwrap(), Some("auth:team-red"));
        assert_eq!(a.check_serving(Some(b"bearer blue")).unwrap(), Some("auth:team-blue"));
        let shared = a.check_serving(Some(b"Bearer shared")).unwrap().unwrap();
        assert!(shared.starts_with("auth:") && shared.len() == 5 + 64);
        for bad in [&b"Bearer nope"[..], b"Basic red", b"Bearer", b"Bearer  red", b"Bearer r\xffd", b"red"] {
            assert_eq!(a.check_serving(Some(bad)), Err(Verdict::Unauthorized), "{bad:?}");
        }
        assert_eq!(a.check_serving(None), Err(Verdict::Unauthorized));
        assert_eq!(cfg(None, &[], &[]).check_serving(None), Ok(None));
    }

    #[test]
    fn admin_rules_in_the_contracts_order() {
        let open = cfg(None, &[], &[]);
        assert_eq!(open.check_admin(None), Verdict::Pass);
        let tenants_only = cfg(None, &["t:k"], &[]);
        assert_eq!(tenants_only.check_admin(Some(b"Bearer k")), Verdict::Unauthorized);
        let shared = cfg(Some("s"), &["t:k"], &[]);
        assert_eq!(shared.check_admin(Some(b"Bearer s")), Verdict::Pass);
        assert_eq!(shared.check_admin(Some(b"Bearer k")), Verdict::Unauthorized);
        let control = cfg(Some("s"), &[], &["1:ops:admin:root", "2:dev:user:dev"]);
        assert_eq!(control.check_admin(Some(b"Bearer root")), Verdict::Pass);
        assert_eq!(control.check_admin(Some(b"Bearer dev")), Verdict::Forbidden);
        assert_eq!(control.check_admin(Some(b"Bearer s")), Verdict::Unauthorized);
        assert_eq!(control.check_serving(Some(b"Bearer root")), Err(Verdict::Unauthorized));
    }

    #[test]
    fn bad_flags_name_the_flag_and_hide_the_key() {
        let e = AuthConfig::parse(None, &["nocolon-secret".into()], &[], None).unwrap_err();
        assert!(e.starts_with("--tenant-api-key") && !e.contains("secret"), "{e}");
        let e = AuthConfig::parse(None, &[], &["a:b:superuser:k".into()], None).unwrap_err();
        assert!(e.contains("--control-plane-api-keys") && e.contains("superuser"), "{e}");
        assert!(AuthConfig::parse(None, &[], &["a:b".into()], None).is_err());
        assert!(AuthConfig::parse(None, &["a:k".into(), "b:k".into()], &[], None).is_err());
    }

    #[test]
    fn tenant_header_identity() {
        assert_eq!(unauthenticated_tenant(Some(b"acme")).as_str(), "header:acme");
        assert_eq!(unauthenticated_tenant(None), Tenant::Anonymous);
        assert_eq!(unauthenticated_tenant(Some(b"a b")).as_str(), "anonymous");
    }
}
