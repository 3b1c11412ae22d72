//! OCI pulls from a real registry (the CNCF distribution registry, Debian's `docker-registry`, over TLS on a
//! loopback port), pushed to by an independent OCI client (oci-client): the Wasm artifact layout, the "compat"
//! tar.gz image (OCI and Docker manifests), by tag and by digest, basic auth from a docker config.json, and
//! tampering caught: a blob or manifest whose bytes do not match its digest, and a module whose sha256 is not
//! the one the resource pins.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use base64::Engine as _;
use oci_client::client::{Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, manifest};
use weft_fetch::testing::{Registry, TestCa, module, oci_client, push_artifact, tar_gz};
use weft_fetch::{Backoff, FetchConfig, FetchError, Fetcher, Request, Roots, sha256_hex};

fn fetcher(ca_file: &std::path::Path, cache: Option<std::path::PathBuf>) -> Fetcher {
    Fetcher::new(FetchConfig {
        roots: Roots::File(ca_file.to_path_buf()),
        cache_dir: cache,
        retries: 1,
        backoff: Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(20),
        },
        ..FetchConfig::default()
    })
    .unwrap()
}

/// Pushes `m` as a Wasm artifact (Istio's `oci` variant); returns the manifest digest.
#[tokio::test]
async fn pulls_wasm_artifacts_and_compat_images_by_tag_and_digest() {
    let ca = TestCa::new("registry CA");
    let reg = Registry::start(&ca, None).await;
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = ca.write(tmp.path());
    let client = oci_client(&ca);
    let anon = RegistryAuth::Anonymous;

    // The Wasm artifact layout, by tag.
    let m1 = module("artifact");
    let digest = push_artifact(&client, &format!("{}/weft/authz:v1", reg.addr), &m1, &anon).await;
    let f = fetcher(&ca_file, Some(tmp.path().join("cache")));
    let got = f
        .fetch(&Request::new(format!("oci://{}/weft/authz:v1", reg.addr)))
        .await
        .unwrap();
    assert_eq!(*got.bytes, m1);
    assert_eq!(got.sha256, sha256_hex(&m1));
    assert_eq!(got.manifest_digest.as_deref(), Some(digest.as_str()));
    assert!(!got.from_cache);

    // By digest: from the registry (the manifest is verified against the digest).
    let by_digest = format!("oci://{}/weft/authz@{digest}", reg.addr);
    let got = f.fetch(&Request::new(&by_digest)).await.unwrap();
    assert_eq!((*got.bytes == m1, got.from_cache), (true, false));
    // Pinned by sha256: the module is in the cache under it, so no request is made.
    let got = f
        .fetch(
            &Request::new(format!("oci://{}/weft/authz:v1", reg.addr)).with_sha256(sha256_hex(&m1)),
        )
        .await
        .unwrap();
    assert_eq!((*got.bytes == m1, got.from_cache), (true, true));

    // The compat variant: an OCI image whose last layer is a tar.gz holding plugin.wasm.
    let m2 = module("compat");
    let r: Reference = format!("{}/weft/compat:v2", reg.addr).parse().unwrap();
    let layer = ImageLayer::oci_v1_gzip(tar_gz(&[("plugin.wasm", &m2)]), None);
    client
        .push(
            &r,
            &[layer],
            Config::oci_v1(b"{}".to_vec(), None),
            &anon,
            None,
        )
        .await
        .unwrap();
    let got = f
        .fetch(&Request::new(format!("oci://{}/weft/compat:v2", reg.addr)))
        .await
        .unwrap();
    assert_eq!(*got.bytes, m2);

    // The compat variant with a Docker v2 manifest and a docker rootfs layer.
    let m3 = module("docker");
    let layer = tar_gz(&[("./plugin.wasm", &m3)]);
    let layer_digest = format!("sha256:{}", sha256_hex(&layer));
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_digest = format!("sha256:{}", sha256_hex(config));
    let r: Reference = format!("{}/weft/docker:v3", reg.addr).parse().unwrap();
    client
        .push_blob(&r, layer.clone(), &layer_digest)
        .await
        .unwrap();
    client
        .push_blob(&r, config.to_vec(), &config_digest)
        .await
        .unwrap();
    let docker_manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "size": config.len(), "digest": config_digest},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": layer.len(), "digest": layer_digest}],
    });
    client
        .push_manifest_raw(
            &r,
            serde_json::to_vec(&docker_manifest).unwrap(),
            http::HeaderValue::from_static(manifest::IMAGE_MANIFEST_MEDIA_TYPE),
        )
        .await
        .unwrap();
    let got = f
        .fetch(&Request::new(format!("oci://{}/weft/docker:v3", reg.addr)))
        .await
        .unwrap();
    assert_eq!(*got.bytes, m3);

    // An image that is not a Wasm image says what it holds.
    let r: Reference = format!("{}/weft/notwasm:v1", reg.addr).parse().unwrap();
    let layer = ImageLayer::new(b"hello".to_vec(), "text/plain".to_string(), None);
    client
        .push(
            &r,
            &[layer],
            Config::oci_v1(b"{}".to_vec(), None),
            &anon,
            None,
        )
        .await
        .unwrap();
    let e = f
        .fetch(&Request::new(format!("oci://{}/weft/notwasm:v1", reg.addr)))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Image { .. }), "{e}");
    assert!(e.to_string().contains("text/plain"), "{e}");

    // A tag that does not exist: 404 with the registry's explanation, not retried.
    let e = f
        .fetch(&Request::new(format!("oci://{}/weft/authz:nope", reg.addr)))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Status { status: 404, .. }), "{e}");
    assert!(e.to_string().contains("MANIFEST_UNKNOWN"), "{e}");

    // The registry goes away: the digest reference is served from the disk cache, verified; a tag is not.
    drop(reg);
    let got = f.fetch(&Request::new(&by_digest)).await.unwrap();
    assert!(got.from_cache);
    assert_eq!(*got.bytes, m1);
    // A fresh fetcher on the same cache directory finds it too.
    let f2 = fetcher(&ca_file, Some(tmp.path().join("cache")));
    assert!(
        f2.fetch(&Request::new(&by_digest))
            .await
            .unwrap()
            .from_cache
    );
}

#[tokio::test]
async fn tampered_blobs_and_manifests_and_wrong_pins_are_refused() {
    let ca = TestCa::new("registry CA");
    let reg = Registry::start(&ca, None).await;
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = ca.write(tmp.path());
    let client = oci_client(&ca);
    let anon = RegistryAuth::Anonymous;
    let f = fetcher(&ca_file, None);

    // The resource pins another sha256 than the module's.
    let m = module("pinned");
    push_artifact(&client, &format!("{}/weft/pinned:v1", reg.addr), &m, &anon).await;
    let wrong = sha256_hex(b"something else");
    let e = f
        .fetch(&Request::new(format!("oci://{}/weft/pinned:v1", reg.addr)).with_sha256(&wrong))
        .await
        .unwrap_err();
    match &e {
        FetchError::Sha256Mismatch {
            expected, actual, ..
        } => {
            assert_eq!((expected, actual), (&wrong, &sha256_hex(&m)))
        }
        other => panic!("{other}"),
    }

    // The registry's stored blob is tampered with: same length, other bytes. It serves them as they are; the
    // fetcher refuses them against the layer digest.
    let m = module("tampered-blob");
    push_artifact(&client, &format!("{}/weft/blob:v1", reg.addr), &m, &anon).await;
    let layer_digest = format!("sha256:{}", sha256_hex(&m));
    let mut evil = m.clone();
    let last = evil.len() - 1;
    evil[last] ^= 0xff;
    std::fs::write(reg.blob_path(&layer_digest), &evil).unwrap();
    let e = f
        .fetch(&Request::new(format!("oci://{}/weft/blob:v1", reg.addr)))
        .await
        .unwrap_err();
    match &e {
        FetchError::DigestMismatch { what, expected, .. } => {
            assert_eq!((*what, expected.as_str()), ("blob", layer_digest.as_str()))
        }
        other => panic!("{other}"),
    }

    // The stored manifest is tampered with (a pull by tag): refused against the registry's own digest header.
    let m = module("tampered-manifest");
    let digest = push_artifact(
        &client,
        &format!("{}/weft/manifest:v1", reg.addr),
        &m,
        &anon,
    )
    .await;
    let path = reg.blob_path(&digest);
    let original = std::fs::read(&path).unwrap();
    let mut evil = original.clone();
    // Same length, still JSON: change a character inside the config media type string.
    let at = evil.windows(4).position(|w| w == b"wasm").unwrap();
    evil[at] = b'W';
    std::fs::write(&path, &evil).unwrap();
    let e = f
        .fetch(&Request::new(format!(
            "oci://{}/weft/manifest:v1",
            reg.addr
        )))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            FetchError::DigestMismatch {
                what: "manifest",
                ..
            }
        ),
        "{e}"
    );
    // And by digest: the bytes do not hash to the digest asked for.
    let e = f
        .fetch(&Request::new(format!(
            "oci://{}/weft/manifest@{digest}",
            reg.addr
        )))
        .await
        .unwrap_err();
    match &e {
        FetchError::DigestMismatch {
            what: "manifest",
            expected,
            ..
        } => assert_eq!(expected, &digest),
        other => panic!("{other}"),
    }
}

fn docker_config(registry: &str, user: &str, password: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!(r#"{{"auths": {{"https://{registry}": {{"auth": "{auth}"}}}}}}"#)
}

#[tokio::test]
async fn basic_auth_from_a_pull_secret() {
    let ca = TestCa::new("registry CA");
    let reg = Registry::start(&ca, Some(("weft", "s3cret"))).await;
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = ca.write(tmp.path());
    let client = oci_client(&ca);
    let creds = RegistryAuth::Basic("weft".into(), "s3cret".into());
    let m = module("private");
    push_artifact(
        &client,
        &format!("{}/private/authz:v1", reg.addr),
        &m,
        &creds,
    )
    .await;
    let uri = format!("oci://{}/private/authz:v1", reg.addr);

    // No credentials: the registry's challenge is answered with a clear error.
    let e = fetcher(&ca_file, None)
        .fetch(&Request::new(&uri))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Auth { .. }), "{e}");
    assert!(e.to_string().contains("no username/password"), "{e}");

    // The node's pull secret file.
    let secret = tmp.path().join("config.json");
    std::fs::write(&secret, docker_config(&reg.addr, "weft", "s3cret")).unwrap();
    let f = Fetcher::new(FetchConfig {
        roots: Roots::File(ca_file.clone()),
        pull_secret: Some(secret.clone()),
        ..FetchConfig::default()
    })
    .unwrap();
    let got = f.fetch(&Request::new(&uri)).await.unwrap();
    assert_eq!(*got.bytes, m);

    // Wrong password in the file: refused, named.
    std::fs::write(&secret, docker_config(&reg.addr, "weft", "wrong")).unwrap();
    let e = f.fetch(&Request::new(&uri)).await.unwrap_err();
    assert!(e.to_string().contains("refused the pull secret"), "{e}");

    // The resource's own pull secret (Istio's ISTIO_META_WASM_IMAGE_PULL_SECRET) wins over the node's.
    let mut req = Request::new(&uri);
    req.pull_secret = Some(docker_config(&reg.addr, "weft", "s3cret").into_bytes());
    assert_eq!(*f.fetch(&req).await.unwrap().bytes, m);
}
