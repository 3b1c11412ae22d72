//! A plugin resource's registry credentials (a pull secret the controller read from a Secret and sent inline) kept
//! out of what a rollout records in a resource's status, and put back, from the resource as it is served now, when
//! a replica serves the recorded version.

use std::sync::Arc;

use weft_state::xds::encode::plugin::extension_config;
use weft_state::xds::plugin::{Code, decode_resource_with};

use crate::ads::resources::Resource;

fn with_secret(r: &Resource, secret: Option<Vec<u8>>) -> Option<prost_types::Any> {
    let ok = |_: &str| Ok(());
    let mut m = decode_resource_with(&r.name, &r.body, &ok).ok()?;
    if let Code::Remote(rc) = &mut m.code {
        rc.pull_secret = secret.clone();
    }
    if let Some(Code::Remote(rc)) = m.shadow.as_mut().map(|s| &mut s.code) {
        rc.pull_secret = secret;
    }
    Some(weft_proto::to_any(
        weft_proto::type_url::EXTENSION_CONFIG,
        &extension_config(&m),
    ))
}

fn secret_of(r: &Resource) -> Option<Vec<u8>> {
    let ok = |_: &str| Ok(());
    let m = decode_resource_with(&r.name, &r.body, &ok).ok()?;
    match m.code {
        Code::Remote(rc) => rc.pull_secret,
        Code::Inline(_) => None,
    }
}

/// `r` without its pull secret (its version unchanged: it names what the nodes run).
pub fn strip(r: &Resource) -> Resource {
    match with_secret(r, None) {
        Some(body) => Resource { body, ..r.clone() },
        None => r.clone(),
    }
}

/// `base` with the pull secret `current` carries (none when it carries none), its version unchanged.
pub fn restore(base: Arc<Resource>, current: &Resource) -> Arc<Resource> {
    let secret = secret_of(current);
    if secret.is_none() && secret_of(&base).is_none() {
        return base;
    }
    match with_secret(&base, secret) {
        Some(body) => Arc::new(Resource {
            body,
            ..(*base).clone()
        }),
        None => base,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use std::path::Path;

    use super::*;

    fn resource(v: &str, secret: Option<&[u8]>) -> Resource {
        let spec = serde_json::json!({"url": format!("oci://registry.example/p:{v}")});
        let mut p = crate::ads::plugin_file::parse_spec("p", spec, "test").unwrap();
        p.pull_secret = secret.map(<[u8]>::to_vec);
        (*p.into_entry("", Path::new(".")).unwrap().current).clone()
    }

    #[test]
    fn the_secret_leaves_the_record_and_comes_back_from_the_current_resource() {
        let v1 = resource("v1", Some(b"{\"auths\":{}}"));
        let stripped = strip(&v1);
        assert_eq!(stripped.version, v1.version);
        assert_eq!(secret_of(&stripped), None);
        assert!(!String::from_utf8_lossy(&stripped.body.value).contains("auths"));
        let v2 = resource("v2", Some(b"{\"auths\":{\"r\":{}}}"));
        let back = restore(Arc::new(stripped.clone()), &v2);
        assert_eq!(back.version, v1.version);
        assert_eq!(
            secret_of(&back).as_deref(),
            Some(&b"{\"auths\":{\"r\":{}}}"[..])
        );
        // No secret anywhere: the same resource.
        let plain = Arc::new(resource("v1", None));
        assert!(Arc::ptr_eq(
            &restore(plain.clone(), &resource("v2", None)),
            &plain
        ));
    }
}
