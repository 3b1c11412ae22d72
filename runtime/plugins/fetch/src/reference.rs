//! Where code comes from: an `https://` URL or an OCI reference (`oci://registry[:port]/repo[:tag][@sha256:hex]`,
//! as Istio's WasmPlugin `url` names images; Docker Hub names are expanded as docker does).

use crate::FetchError;

/// A parsed code URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An https URL.
    Https(http::Uri),
    /// An OCI image.
    Oci(OciReference),
}

/// An OCI image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciReference {
    /// `host[:port]` of the registry API.
    pub registry: String,
    /// Repository path (`library/x` on Docker Hub).
    pub repository: String,
    /// Tag (`latest` when neither tag nor digest is given).
    pub tag: Option<String>,
    /// `sha256:<hex>` digest of the manifest.
    pub digest: Option<String>,
}

impl OciReference {
    /// What the manifest is fetched by: the digest if any, else the tag.
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// `registry/repository[:tag][@digest]`.
    pub fn display(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.repository);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(d);
        }
        s
    }
}

fn bad(uri: &str, reason: impl Into<String>) -> FetchError {
    FetchError::BadUri {
        uri: uri.to_string(),
        reason: reason.into(),
    }
}

impl Source {
    /// Parses `https://...` or `oci://...`. Plain `http://` is refused (code must come over TLS), and so is
    /// `file://` (a node-local path is the local config's business, not a control plane's).
    pub fn parse(uri: &str) -> Result<Source, FetchError> {
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad(uri, "no scheme (expected https:// or oci://)"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "https" => {
                let parsed: http::Uri = uri.parse().map_err(|e| bad(uri, format!("{e}")))?;
                if parsed.host().is_none_or(str::is_empty) {
                    return Err(bad(uri, "no host"));
                }
                Ok(Source::Https(parsed))
            }
            "oci" => parse_oci(uri, rest).map(Source::Oci),
            "http" => Err(bad(
                uri,
                "plain http is refused: plugin code must come over https",
            )),
            other => Err(bad(
                uri,
                format!("unsupported scheme {other:?} (expected https or oci)"),
            )),
        }
    }
}

fn parse_oci(uri: &str, rest: &str) -> Result<OciReference, FetchError> {
    let (name, digest) = match rest.split_once('@') {
        Some((n, d)) => {
            let hex = d
                .strip_prefix("sha256:")
                .ok_or_else(|| bad(uri, "only sha256 digests are supported"))?;
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(uri, "the digest is not sha256:<64 hex digits>"));
            }
            (n, Some(format!("sha256:{}", hex.to_ascii_lowercase())))
        }
        None => (rest, None),
    };
    let (first, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_string(), path.to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
    // The tag is after the last ':' of the last path segment (a ':' before it is the registry's port).
    let (repo, tag) = match path.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r.to_string(), Some(t.to_string())),
        _ => (path, None),
    };
    if repo.is_empty() {
        return Err(bad(uri, "no repository"));
    }
    let valid_repo = repo.split('/').all(|c| {
        !c.is_empty()
            && c.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    });
    if !valid_repo {
        return Err(bad(
            uri,
            "the repository must be lowercase path components ([a-z0-9._-])",
        ));
    }
    if let Some(t) = &tag
        && (t.is_empty()
            || t.len() > 128
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
    {
        return Err(bad(uri, "the tag must be 1-128 characters [A-Za-z0-9._-]"));
    }
    let (registry, repository) = if first == "docker.io" || first == "index.docker.io" {
        let repo = if repo.contains('/') {
            repo
        } else {
            format!("library/{repo}")
        };
        ("registry-1.docker.io".to_string(), repo)
    } else {
        (first, repo)
    };
    let tag = if tag.is_none() && digest.is_none() {
        Some("latest".to_string())
    } else {
        tag
    };
    Ok(OciReference {
        registry,
        repository,
        tag,
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oci(s: &str) -> OciReference {
        match Source::parse(s) {
            Ok(Source::Oci(r)) => r,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn oci_references() {
        let r = oci("oci://127.0.0.1:5000/weft/authz:v1");
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "weft/authz");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.reference(), "v1");
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = oci(&format!("oci://ghcr.io/org/plugin@{d}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.reference(), d);
        let r = oci(&format!(
            "oci://localhost:5000/p:1.0@{}",
            d.to_uppercase().replace("SHA256", "sha256")
        ));
        assert_eq!(
            (r.tag.as_deref(), r.digest.as_deref()),
            (Some("1.0"), Some(d.as_str()))
        );
        let r = oci("oci://istio/plugin");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.reference()),
            ("registry-1.docker.io", "istio/plugin", "latest")
        );
        assert_eq!(oci("oci://busybox").repository, "library/busybox");
    }

    #[test]
    fn refused_uris_say_why() {
        for (uri, why) in [
            ("http://example.com/x.wasm", "plain http"),
            ("file:///x.wasm", "unsupported scheme"),
            ("example.com/x.wasm", "no scheme"),
            ("oci://r.io/Upper:v1", "lowercase"),
            ("oci://r.io/x@sha512:00", "sha256"),
            ("oci://r.io/x@sha256:00", "64 hex"),
            ("oci://r.io/x:bad!tag", "tag"),
        ] {
            let e = Source::parse(uri).expect_err(uri).to_string();
            assert!(e.contains(why), "{uri}: {e}");
        }
        assert!(matches!(
            Source::parse("https://h/x.wasm"),
            Ok(Source::Https(_))
        ));
    }
}
