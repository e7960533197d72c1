//! `source.amqp_url`, `source.management_url`, `target.amqp_url` and `target.management_url`:
//! one URL, or a list of URLs naming the nodes of a cluster, tried in order (the convention of
//! RabbitMQ's clients: a list of addresses, the first that answers is used).
//!
//! ```yaml
//! amqp_url: "amqp://user:pw@rabbit-0:5672/%2f"          # one node
//! amqp_url:                                           # or several
//!   - "amqp://user:pw@rabbit-0:5672/%2f"
//!   - "amqp://user:pw@rabbit-1:5672/%2f"
//! ```

use std::fmt;

use serde::Deserialize;

use super::checks::{check_scheme, config_err};
use super::redact_url;
use crate::error::Result;

/// One URL or more, in the order they are tried; never empty once deserialized.
#[derive(Clone, PartialEq, Eq)]
pub struct Urls(Vec<String>);

impl Urls {
    /// One URL.
    pub fn one(url: impl Into<String>) -> Urls {
        Urls(vec![url.into()])
    }

    /// The first URL (the one a single-node configuration gives).
    pub fn first(&self) -> &str {
        self.0.first().map_or("", String::as_str)
    }

    /// Every URL, in order.
    pub fn all(&self) -> &[String] {
        &self.0
    }

    /// Every URL, to rewrite in place (`${ENV}` interpolation).
    pub(super) fn all_mut(&mut self) -> impl Iterator<Item = &mut String> {
        self.0.iter_mut()
    }

    /// Checks that every URL starts with one of `schemes` and that all use the same one (a
    /// list mixing `amqp://` and `amqps://` would send credentials in plain text to some
    /// nodes). `field` names the setting in the errors.
    ///
    /// Errors: `Configuration error: <field> ...`.
    pub(super) fn check(&self, field: &str, schemes: &[&str]) -> Result<()> {
        if self.0.is_empty() {
            return Err(config_err(format!("{field} must name at least one URL")));
        }
        for (i, url) in self.0.iter().enumerate() {
            let name = if self.0.len() == 1 {
                field.to_string()
            } else {
                format!("{field}[{i}]")
            };
            check_scheme(url, &name, schemes)?;
        }
        let scheme = |u: &str| {
            u.trim()
                .split("://")
                .next()
                .unwrap_or("")
                .to_ascii_lowercase()
        };
        let first = scheme(self.first());
        if let Some(other) = self.0.iter().find(|u| scheme(u) != first) {
            return Err(config_err(format!(
                "{field} mixes {first}:// and {}:// URLs: use the same scheme for every node",
                scheme(other)
            )));
        }
        Ok(())
    }
}

impl From<&str> for Urls {
    fn from(url: &str) -> Urls {
        Urls::one(url)
    }
}

impl PartialEq<&str> for Urls {
    fn eq(&self, other: &&str) -> bool {
        self.0.len() == 1 && self.0[0] == *other
    }
}

impl fmt::Debug for Urls {
    /// The URLs with their passwords masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked: Vec<String> = self.0.iter().map(|u| redact_url(u)).collect();
        if masked.len() == 1 {
            write!(f, "{:?}", masked[0])
        } else {
            write!(f, "{masked:?}")
        }
    }
}

impl<'de> Deserialize<'de> for Urls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Urls, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        match OneOrMany::deserialize(d) {
            Ok(OneOrMany::One(u)) => Ok(Urls(vec![u])),
            Ok(OneOrMany::Many(v)) if v.is_empty() => Err(serde::de::Error::custom(
                "an empty list of URLs: give one URL or a list of them",
            )),
            Ok(OneOrMany::Many(v)) => Ok(Urls(v)),
            Err(_) => Err(serde::de::Error::custom("expected a URL or a list of URLs")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> std::result::Result<Urls, String> {
        serde_norway::from_str::<Urls>(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn one_url_or_a_list() {
        assert_eq!(parse("amqp://h:5672/%2f").unwrap(), "amqp://h:5672/%2f");
        let many = parse("[\"amqp://a\", \"amqp://b\"]").unwrap();
        assert_eq!(many.all(), ["amqp://a", "amqp://b"]);
        assert_eq!(many.first(), "amqp://a");
        assert!(parse("[]").unwrap_err().contains("empty list of URLs"));
        assert!(parse("{a: 1}")
            .unwrap_err()
            .contains("a URL or a list of URLs"));
    }

    #[test]
    fn every_url_is_checked_and_schemes_are_not_mixed() {
        let ok = parse("[\"amqp://a\", \"AMQP://b\"]").unwrap();
        assert!(ok
            .check("source.amqp_url", &["amqp://", "amqps://"])
            .is_ok());
        let bad = parse("[\"amqp://a\", \"http://b\"]").unwrap();
        let e = bad
            .check("source.amqp_url", &["amqp://", "amqps://"])
            .unwrap_err();
        assert!(e.to_string().contains("source.amqp_url[1]"), "{e}");
        let mixed = parse("[\"amqps://a\", \"amqp://b\"]").unwrap();
        let e = mixed
            .check("source.amqp_url", &["amqp://", "amqps://"])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Configuration error: source.amqp_url mixes amqps:// and amqp:// URLs: use the same scheme for every node"
        );
    }

    #[test]
    fn debug_masks_every_password() {
        let many = parse("[\"amqp://u:secret1@a\", \"amqp://u:secret2@b\"]").unwrap();
        let shown = format!("{many:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
