//! Pulling a Wasm module from an OCI registry (distribution API v2), in the image formats Istio's agent accepts:
//! a Docker or OCI image whose last layer is a tar(.gz) holding `plugin.wasm` (the "compat" variant), or an
//! artifact with a Wasm layer (`application/vnd.module.wasm.content.layer.v1+wasm`, or `application/wasm` as the
//! Wasm OCI artifact layout uses, or `application/vnd.wasm.content.layer.v1+wasm`). The manifest is verified against its digest, every blob against its own.

use http::{HeaderValue, StatusCode, Uri, header};
use serde::Deserialize;

use crate::auth::{self, Challenge, Credentials};
use crate::http::{Client, Headers, Response};
use crate::{FetchError, OciReference, sha256_hex};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
const WASM_ARTIFACT_LAYER: &str = "application/wasm";
const WASM_CONTENT_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// What a pull produced.
pub(crate) struct Pulled {
    pub module: Vec<u8>,
    /// `sha256:...` of the manifest the reference named.
    pub manifest_digest: String,
}

#[derive(Deserialize, Debug, Clone)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize, Debug, Clone, Default)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize, Debug)]
struct Manifest {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// One pull's requests to one registry, with the auth the challenge asked for.
struct Session<'a> {
    client: &'a Client,
    image: &'a OciReference,
    creds: Option<Credentials>,
    auth: Option<HeaderValue>,
    manifest_limit: u64,
}

impl Session<'_> {
    fn url(&self, path: &str) -> Result<Uri, FetchError> {
        format!(
            "https://{}/v2/{}/{path}",
            self.image.registry, self.image.repository
        )
        .parse()
        .map_err(|e| FetchError::BadUri {
            uri: self.image.display(),
            reason: format!("{e}"),
        })
    }

    fn auth_err(&self, reason: String) -> FetchError {
        FetchError::Auth {
            registry: self.image.registry.clone(),
            reason,
        }
    }

    /// GET with the session's auth; on 401 answers the challenge once and retries.
    async fn get(&mut self, url: &Uri, accept: &str, limit: u64) -> Result<Response, FetchError> {
        let mut answered = false;
        loop {
            let mut headers = Headers::new();
            headers.insert(
                header::ACCEPT,
                HeaderValue::from_str(accept).map_err(|e| self.auth_err(e.to_string()))?,
            );
            if let Some(a) = &self.auth {
                headers.insert(header::AUTHORIZATION, a.clone());
            }
            let resp = self.client.get(url, headers, limit).await?;
            if resp.status != StatusCode::UNAUTHORIZED {
                return Ok(resp);
            }
            if answered {
                return Err(self.auth_err(match &self.creds {
                    Some(_) => "the registry refused the pull secret's credentials".into(),
                    None => {
                        "the registry wants credentials and the pull secret has none for it".into()
                    }
                }));
            }
            answered = true;
            let challenge = resp
                .headers
                .get_all(header::WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(auth::parse_challenge)
                .ok_or_else(|| self.auth_err("401 without a Bearer or Basic challenge".into()))?;
            self.auth = Some(match &challenge {
                Challenge::Bearer { .. } => {
                    let scope = format!("repository:{}:pull", self.image.repository);
                    auth::bearer_token(
                        self.client,
                        &self.image.registry,
                        &challenge,
                        &scope,
                        self.creds.as_ref(),
                        self.manifest_limit,
                    )
                    .await?
                }
                Challenge::Basic => self
                    .creds
                    .as_ref()
                    .and_then(Credentials::basic_header)
                    .ok_or_else(|| {
                        self.auth_err(
                            "basic auth required and the pull secret has no username/password for it"
                                .into(),
                        )
                    })?,
            });
        }
    }

    /// Fetches a manifest by tag or digest and checks its digest; returns (digest, parsed, media type).
    async fn manifest(
        &mut self,
        reference: &str,
        expected: Option<&str>,
    ) -> Result<(String, Manifest, String), FetchError> {
        let url = self.url(&format!("manifests/{reference}"))?;
        let accept = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST].join(", ");
        let resp = self.get(&url, &accept, self.manifest_limit).await?;
        if !resp.status.is_success() {
            return Err(FetchError::status(url.to_string(), &resp));
        }
        let digest = format!("sha256:{}", sha256_hex(&resp.body));
        let mismatch = |exp: &str| FetchError::DigestMismatch {
            what: "manifest",
            url: url.to_string(),
            expected: exp.to_string(),
            actual: digest.clone(),
        };
        if let Some(exp) = expected
            && exp != digest
        {
            return Err(mismatch(exp));
        }
        if let Some(claimed) = resp
            .headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            && claimed.starts_with("sha256:")
            && claimed != digest
        {
            return Err(mismatch(claimed));
        }
        let manifest: Manifest =
            serde_json::from_slice(&resp.body).map_err(|e| FetchError::Image {
                image: self.image.display(),
                reason: format!("manifest is not JSON: {e}"),
            })?;
        let content_type = resp
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let media_type = manifest.media_type.clone().unwrap_or_else(|| {
            content_type
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        });
        Ok((digest, manifest, media_type))
    }

    /// Fetches a blob and checks its size and digest.
    async fn blob(&mut self, d: &Descriptor, limit: u64) -> Result<Vec<u8>, FetchError> {
        let url = self.url(&format!("blobs/{}", d.digest))?;
        if d.size > limit {
            return Err(FetchError::TooLarge {
                what: "layer",
                url: url.to_string(),
                limit,
            });
        }
        if !d.digest.starts_with("sha256:") {
            return Err(FetchError::Image {
                image: self.image.display(),
                reason: format!("layer digest {} is not sha256", d.digest),
            });
        }
        let resp = self.get(&url, "*/*", d.size).await?;
        if !resp.status.is_success() {
            return Err(FetchError::status(url.to_string(), &resp));
        }
        let actual = format!("sha256:{}", sha256_hex(&resp.body));
        if actual != d.digest {
            return Err(FetchError::DigestMismatch {
                what: "blob",
                url: url.to_string(),
                expected: d.digest.clone(),
                actual,
            });
        }
        Ok(resp.body.to_vec())
    }
}

fn is_wasm_platform(p: &Platform) -> bool {
    p.architecture == "wasm" || matches!(p.os.as_str(), "wasi" | "wasip1" | "wasip2")
}

/// Pulls `image` and returns its Wasm module.
pub(crate) async fn pull(
    client: &Client,
    image: &OciReference,
    creds: Option<Credentials>,
    limit: u64,
    manifest_limit: u64,
) -> Result<Pulled, FetchError> {
    let mut s = Session {
        client,
        image,
        creds,
        auth: None,
        manifest_limit,
    };
    let bad = |reason: String| FetchError::Image {
        image: image.display(),
        reason,
    };
    let (digest, mut manifest, mut media_type) = s
        .manifest(image.reference(), image.digest.as_deref())
        .await?;
    if media_type == OCI_INDEX || media_type == DOCKER_LIST || !manifest.manifests.is_empty() {
        let pick = manifest
            .manifests
            .iter()
            .find(|m| m.platform.as_ref().is_some_and(is_wasm_platform))
            .or_else(|| {
                manifest.manifests.iter().find(|m| {
                    m.platform
                        .as_ref()
                        .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
                })
            })
            .or(if manifest.manifests.len() == 1 {
                manifest.manifests.first()
            } else {
                None
            })
            .cloned()
            .ok_or_else(|| bad("an index with no wasm (or linux/amd64) manifest".into()))?;
        let (_, m, t) = s.manifest(&pick.digest, Some(&pick.digest)).await?;
        manifest = m;
        media_type = t;
    }
    let last = manifest
        .layers
        .last()
        .cloned()
        .ok_or_else(|| bad("the manifest has no layers".into()))?;
    let module = if media_type == DOCKER_MANIFEST {
        if last.media_type != DOCKER_LAYER {
            return Err(bad(format!(
                "a Docker image's last layer must be {DOCKER_LAYER}, found {}",
                last.media_type
            )));
        }
        let blob = s.blob(&last, limit).await?;
        crate::archive::plugin_wasm(&blob, true, limit).map_err(bad)?
    } else if last.media_type == OCI_LAYER_GZIP || last.media_type == OCI_LAYER_TAR {
        let blob = s.blob(&last, limit).await?;
        crate::archive::plugin_wasm(&blob, last.media_type == OCI_LAYER_GZIP, limit).map_err(bad)?
    } else if let Some(layer) = manifest
        .layers
        .iter()
        .find(|l| {
            [WASM_LAYER, WASM_ARTIFACT_LAYER, WASM_CONTENT_LAYER].contains(&l.media_type.as_str())
        })
        .cloned()
    {
        s.blob(&layer, limit).await?
    } else {
        let types: Vec<&str> = manifest
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect();
        return Err(bad(format!(
            "not a Wasm image: no {WASM_LAYER} or {WASM_ARTIFACT_LAYER} layer, and the last layer is not a \
             tar(.gz) with plugin.wasm (layers: {types:?})"
        )));
    };
    Ok(Pulled {
        module,
        manifest_digest: digest,
    })
}
