//! Equality-based label selectors (`labelSelector=a=b,c!=d,e,!f`), as list and watch requests carry them. Set-based
//! requirements (`in`, `notin`) are not served: they are answered with 400 BadRequest.

use serde_json::Value;

use crate::status::ApiError;

/// One requirement on an object's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key=value` or `key==value`: the label is present with that value.
    Equals(String, String),
    /// `key!=value`: the label is absent or has another value.
    NotEquals(String, String),
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    NotExists(String),
}

/// A parsed label selector: every requirement must hold. An empty one selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of alphanumerics, `-`, `_` and `.`.
fn valid_key(key: &str) -> bool {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return false;
            }
            name
        }
        None => key,
    };
    !name.is_empty() && name.len() <= 63 && valid_value(name)
}

/// A label value: empty, or alphanumerics, `-`, `_` and `.` (at most 63).
fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

fn invalid(requirement: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {requirement:?}: the stand-in serves equality-based selectors only \
         (key=value, key==value, key!=value, key, !key)"
    ))
}

impl Selector {
    /// Parses a `labelSelector` query value (already percent-decoded).
    pub(crate) fn parse(text: &str) -> Result<Selector, ApiError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Selector::default());
        }
        let mut requirements = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else {
                Requirement::Exists(part.to_owned())
            };
            let ok = match &requirement {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => {
                    valid_key(k) && valid_value(v)
                }
                Requirement::Exists(k) | Requirement::NotExists(k) => valid_key(k),
            };
            if !ok {
                return Err(invalid(part));
            }
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| {
            object
                .pointer("/metadata/labels")
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }

    /// Whether it selects everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test panics to fail

    use serde_json::json;

    use super::Selector;

    fn labeled(labels: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    #[test]
    fn equality_and_existence_requirements_all_must_hold() {
        let sel = Selector::parse("app=web, tier!=db,team,!canary").unwrap();
        assert!(sel.matches(&labeled(json!({"app": "web", "team": "a"}))));
        assert!(sel.matches(&labeled(
            json!({"app": "web", "team": "a", "tier": "front"})
        )));
        assert!(!sel.matches(&labeled(json!({"app": "web", "team": "a", "tier": "db"}))));
        assert!(!sel.matches(&labeled(json!({"app": "web"}))));
        assert!(!sel.matches(&labeled(json!({"app": "web", "team": "a", "canary": ""}))));
        assert!(!sel.matches(&json!({"metadata": {"name": "unlabeled"}})));
        let double = Selector::parse("example.com/app==web").unwrap();
        assert!(double.matches(&labeled(json!({"example.com/app": "web"}))));
        assert!(!double.matches(&labeled(json!({"app": "web"}))));
        let empty_value = Selector::parse("app=").unwrap();
        assert!(empty_value.matches(&labeled(json!({"app": ""}))));
        assert!(Selector::parse("").unwrap().is_empty());
        assert!(Selector::parse("").unwrap().matches(&json!({})));
    }

    #[test]
    fn set_based_and_malformed_selectors_are_bad_requests() {
        for bad in [
            "app in (a,b)",
            "app notin (a)",
            "a=b,",
            "=b",
            "a=b=c",
            "!",
            "a b",
            "a=(b)",
        ] {
            let err = Selector::parse(bad).unwrap_err();
            assert_eq!(err.code, 400, "{bad}");
            assert_eq!(err.reason, "BadRequest", "{bad}");
        }
    }
}
