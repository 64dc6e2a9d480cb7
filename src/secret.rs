//! A credential the gateway holds for a worker (its stored API key): what `Debug` prints of
//! it is `Secret(..)`, so no log line or error made with `{:?}` of a worker's registration
//! carries the key. The one way to the text is [`Secret::expose`], called where a request to
//! that worker is written.

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Secret(s)
    }

    /// The key itself, for the worker's own `Authorization`.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_key() {
        let s = Secret::new("sk-live-123".into());
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(Secret(..))");
        assert_eq!(s.expose(), "sk-live-123");
    }
}
