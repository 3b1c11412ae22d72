//! Registry auth: credentials from a docker `config.json` pull secret, the `WWW-Authenticate` challenge
//! (`Bearer realm=...,service=...,scope=...` or `Basic`), and the bearer token exchange of the distribution
//! token protocol.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderValue, Uri};
use serde::Deserialize;

use crate::FetchError;
use crate::http::{Client, Headers, encode_query};

/// Credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// Username and password (or a token used as password).
    Basic { username: String, password: String },
    /// A registry token sent as a bearer token as is.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

impl Credentials {
    pub fn basic_header(&self) -> Option<HeaderValue> {
        match self {
            Credentials::Basic { username, password } => {
                let v = format!(
                    "Basic {}",
                    STANDARD.encode(format!("{username}:{password}"))
                );
                let mut h = HeaderValue::from_str(&v).ok()?;
                h.set_sensitive(true);
                Some(h)
            }
            Credentials::Token(_) => None,
        }
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The registry host a config.json key names: `https://r.io/v1/` and `r.io` both name `r.io`.
fn key_host(key: &str) -> &str {
    let k = key.split_once("://").map_or(key, |(_, rest)| rest);
    k.split('/').next().unwrap_or(k)
}

/// The credentials a docker `config.json` holds for `registry`.
pub(crate) fn parse_config(
    bytes: &[u8],
    registry: &str,
    source_name: &str,
) -> Result<Option<Credentials>, FetchError> {
    let err = |reason: String| FetchError::PullSecret {
        source_name: source_name.to_string(),
        reason,
    };
    let trimmed = String::from_utf8_lossy(bytes);
    if trimmed.trim().is_empty() || trimmed.trim() == "null" {
        return Ok(None);
    }
    let cfg: DockerConfig =
        serde_json::from_slice(bytes).map_err(|e| err(format!("not a docker config.json: {e}")))?;
    let docker_hub = registry == "registry-1.docker.io";
    let entry = cfg.auths.iter().find(|(k, _)| {
        let h = key_host(k);
        h == registry || (docker_hub && (h == "index.docker.io" || h == "docker.io"))
    });
    let Some((key, e)) = entry else {
        return Ok(None);
    };
    if let Some(t) = e.registrytoken.as_ref().filter(|t| !t.is_empty()) {
        return Ok(Some(Credentials::Token(t.clone())));
    }
    if let Some(a) = e.auth.as_ref().filter(|a| !a.is_empty()) {
        let decoded = STANDARD
            .decode(a.trim())
            .map_err(|e| err(format!("auths.{key}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| err(format!("auths.{key}.auth is not UTF-8")))?;
        let (u, p) = decoded
            .split_once(':')
            .ok_or_else(|| err(format!("auths.{key}.auth is not user:password")))?;
        return Ok(Some(Credentials::Basic {
            username: u.to_string(),
            password: p.to_string(),
        }));
    }
    match (&e.username, &e.password) {
        (Some(u), Some(p)) => Ok(Some(Credentials::Basic {
            username: u.clone(),
            password: p.clone(),
        })),
        _ => Err(err(format!(
            "auths.{key} has neither auth, username/password nor registrytoken"
        ))),
    }
}

/// The credentials for `registry`: from the resource's own pull secret first, then the node's file.
pub(crate) fn credentials_for(
    registry: &str,
    resource_secret: Option<&[u8]>,
    file: Option<&Path>,
) -> Result<Option<Credentials>, FetchError> {
    if let Some(bytes) = resource_secret
        && let Some(c) = parse_config(bytes, registry, "in the resource")?
    {
        return Ok(Some(c));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let bytes = std::fs::read(path).map_err(|e| FetchError::PullSecret {
        source_name: path.display().to_string(),
        reason: format!("cannot read: {e}"),
    })?;
    parse_config(&bytes, registry, &path.display().to_string())
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    Basic,
}

/// Parses `Bearer realm="...",service="...",scope="..."` or `Basic realm="..."`.
pub(crate) fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, params) = value.split_once(' ').unwrap_or((value, ""));
    let mut map = BTreeMap::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (k, after) = rest.split_once('=')?;
        let k = k.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &q[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        map.insert(k, v);
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    match scheme.to_ascii_lowercase().as_str() {
        "bearer" => Some(Challenge::Bearer {
            realm: map.remove("realm")?,
            service: map.remove("service"),
            scope: map.remove("scope"),
        }),
        "basic" => Some(Challenge::Basic),
        _ => None,
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// A realm the token request may go to: https, and not a link-local or cloud metadata address (a registry must
/// not be able to point the node at its metadata service).
fn check_realm(registry: &str, realm: &Uri) -> Result<(), FetchError> {
    let refuse = |reason: &str| FetchError::Auth {
        registry: registry.to_string(),
        reason: format!("token realm {realm} refused: {reason}"),
    };
    if realm.scheme_str() != Some("https") {
        return Err(refuse("not https"));
    }
    let host = realm.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("metadata.google.internal") {
        return Err(refuse("a cloud metadata service"));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80 || v6.segments()[0] == 0xfd00,
        };
        if link_local {
            return Err(refuse("a link-local or metadata address"));
        }
    }
    Ok(())
}

/// Runs the token exchange for a bearer challenge; returns the `Authorization` value to retry with.
pub(crate) async fn bearer_token(
    client: &Client,
    registry: &str,
    challenge: &Challenge,
    default_scope: &str,
    creds: Option<&Credentials>,
    limit: u64,
) -> Result<HeaderValue, FetchError> {
    let auth_err = |reason: String| FetchError::Auth {
        registry: registry.to_string(),
        reason,
    };
    let Challenge::Bearer {
        realm,
        service,
        scope,
    } = challenge
    else {
        return Err(auth_err("not a bearer challenge".into()));
    };
    if let Some(Credentials::Token(t)) = creds {
        return bearer_value(t)
            .ok_or_else(|| auth_err("the registry token is not a header value".into()));
    }
    let mut query = Vec::new();
    if let Some(s) = service {
        query.push(format!("service={}", encode_query(s)));
    }
    query.push(format!(
        "scope={}",
        encode_query(scope.as_deref().unwrap_or(default_scope))
    ));
    let sep = if realm.contains('?') { '&' } else { '?' };
    let url: Uri = format!("{realm}{sep}{}", query.join("&"))
        .parse()
        .map_err(|e| auth_err(format!("bad token realm {realm:?}: {e}")))?;
    check_realm(registry, &url)?;
    let mut headers = Headers::new();
    if let Some(h) = creds.and_then(Credentials::basic_header) {
        headers.insert(http::header::AUTHORIZATION, h);
    }
    let resp = client.get(&url, headers, limit).await?;
    if !resp.status.is_success() {
        let e = FetchError::status(url.to_string(), &resp);
        return Err(if e.is_retryable() {
            e
        } else {
            auth_err(format!("token request refused: {e}"))
        });
    }
    let t: TokenResponse = serde_json::from_slice(&resp.body)
        .map_err(|e| auth_err(format!("token response is not JSON: {e}")))?;
    let token = t
        .token
        .or(t.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| auth_err("token response has no token".into()))?;
    bearer_value(&token).ok_or_else(|| auth_err("the token is not a header value".into()))
}

fn bearer_value(token: &str) -> Option<HeaderValue> {
    let mut h = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    h.set_sensitive(true);
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.r.io/token",service="r.io",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.r.io/token".into(),
                service: Some("r.io".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="basic-realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(r#"bearer realm=https://t/x, service="a\"b""#),
            Some(Challenge::Bearer {
                realm: "https://t/x".into(),
                service: Some("a\"b".into()),
                scope: None,
            })
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
    }

    #[test]
    fn docker_config_credentials() {
        let cfg = br#"{"auths": {
            "https://r.io/v1/": {"auth": "dXNlcjpwYTpzcw=="},
            "other.io:5000": {"username": "u", "password": "p"},
            "tok.io": {"registrytoken": "abc"},
            "https://index.docker.io/v1/": {"auth": "aHViOmh1Yg=="},
            "broken.io": {}
        }}"#;
        let basic = |u: &str, p: &str| {
            Some(Credentials::Basic {
                username: u.into(),
                password: p.into(),
            })
        };
        let get = |r: &str| parse_config(cfg, r, "test").map_err(|e| e.to_string());
        assert_eq!(get("r.io"), Ok(basic("user", "pa:ss")));
        assert_eq!(get("other.io:5000"), Ok(basic("u", "p")));
        assert_eq!(get("tok.io"), Ok(Some(Credentials::Token("abc".into()))));
        assert_eq!(get("registry-1.docker.io"), Ok(basic("hub", "hub")));
        assert_eq!(get("none.io"), Ok(None));
        assert!(get("broken.io").is_err_and(|e| e.contains("auths.broken.io")));
        assert!(
            parse_config(b"{", "r.io", "f").is_err_and(|e| e.to_string().contains("config.json"))
        );
        assert_eq!(parse_config(b"null", "r.io", "f").ok(), Some(None));
    }

    #[test]
    fn realms_to_metadata_services_are_refused() {
        for bad in [
            "http://auth.r.io/token",
            "https://169.254.169.254/latest",
            "https://metadata.google.internal/x",
            "https://[fe80::1]/x",
        ] {
            let u: Uri = bad.parse().unwrap_or_default();
            assert!(check_realm("r.io", &u).is_err(), "{bad}");
        }
        let ok: Uri = "https://127.0.0.1:4000/token".parse().unwrap_or_default();
        assert!(check_realm("r.io", &ok).is_ok());
    }
}
