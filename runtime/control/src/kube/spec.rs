//! One WeftPlugin resource into the plugin model. The resource's `spec` is rewritten into the plugin file's form and
//! checked by the same parser (so both formats give the same model and the same field errors), after the
//! resource's own rules: `url` without a scheme is `oci://` (WasmPlugin's default), `file://` and `http://` are
//! refused; `priority` is WasmPlugin's (higher first: the model's is its negation); `selector.matchLabels` is
//! resolved against the Pods of the resource's namespace (every namespace from the root namespace) into workload
//! uids and the nodes they run on; `imagePullSecret` becomes the pull secret sent with the code.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::ads::plugin_file::parse_spec;
use crate::ads::resources::{NodeSelector, PluginEntry};
use crate::kube::watch::{ByName, PodInfo};

/// The xDS name of a resource: `<namespace>.<name>` (a namespace has no dot, so it reads back unambiguously; the
/// name of Istio's own per-WasmPlugin resources is built the same way).
pub fn xds_name(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// What a resource's spec says besides the file format's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// The spec in the plugin file's form (without `selector`; `url` with its scheme, `priority` negated).
    pub file_spec: Map<String, Value>,
    /// `selector.matchLabels` (none: every workload in scope).
    pub match_labels: Option<BTreeMap<String, String>>,
    /// `imagePullSecret`: a Secret of the resource's namespace.
    pub pull_secret: Option<String>,
}

fn string_map(v: &Value, path: &str) -> Result<BTreeMap<String, String>, String> {
    let Value::Object(m) = v else {
        return Err(format!("{path}: expected a map of strings"));
    };
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(format!("{path}.{k}: expected a string")),
        })
        .collect()
}

/// `<at>.url`: required; no scheme is `oci://` (WasmPlugin's default); `file://` and `http://` refused.
fn code_url(m: &mut Map<String, Value>, at: &str) -> Result<(), String> {
    match m.get("url") {
        Some(Value::String(u)) => {
            let lower = u.to_ascii_lowercase();
            if lower.starts_with("file://") {
                return Err(format!(
                    "{at}.url: {u:?}: file:// is not allowed in a WeftPlugin resource (a path on weft-control's \
                     filesystem is neither namespaced nor reviewable; use oci:// or https://)"
                ));
            }
            if lower.starts_with("http://") {
                return Err(format!(
                    "{at}.url: {u:?}: http:// is not allowed (nothing would protect the download); use oci:// or \
                     https:// with sha256"
                ));
            }
            if !u.contains("://") {
                let with_scheme = format!("oci://{u}");
                m.insert("url".into(), Value::String(with_scheme));
            }
            Ok(())
        }
        Some(_) => Err(format!("{at}.url: expected a string")),
        None => Err(format!("{at}.url: required")),
    }
}

/// Check the resource-only fields and rewrite the rest into the file form.
pub fn extract(spec: Option<&Value>) -> Result<Extracted, String> {
    let Some(Value::Object(spec)) = spec else {
        return Err("spec: required, and a map".into());
    };
    let mut out = spec.clone();
    code_url(&mut out, "spec")?;
    match out.get_mut("shadow") {
        None | Some(Value::Null) => {}
        Some(Value::Object(shadow)) => code_url(shadow, "spec.shadow")?,
        Some(_) => return Err("spec.shadow: expected a map".into()),
    }
    if let Some(p) = out.get("priority") {
        let p = p
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| "spec.priority: expected a 32-bit integer".to_owned())?;
        // WasmPlugin runs the higher priority first; the model (and the files) the lower.
        out.insert("priority".into(), json!(p.saturating_neg()));
    }
    let match_labels = match out.remove("selector") {
        None | Some(Value::Null) => None,
        Some(Value::Object(mut sel)) => {
            let labels = sel.remove("matchLabels");
            if let Some(k) = sel.keys().next() {
                return Err(format!(
                    "spec.selector.{k}: unknown field (a WeftPlugin selects by matchLabels)"
                ));
            }
            match labels {
                None | Some(Value::Null) => None,
                Some(l) => Some(string_map(&l, "spec.selector.matchLabels")?),
            }
        }
        Some(_) => return Err("spec.selector: expected a map".into()),
    };
    let pull_secret = match out.remove("imagePullSecret") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        Some(_) => return Err("spec.imagePullSecret: expected a Secret name".into()),
    };
    match out.remove("imagePullPolicy") {
        None | Some(Value::Null) => {}
        Some(Value::String(s))
            if ["UNSPECIFIED_POLICY", "IfNotPresent", "Always"].contains(&s.as_str()) => {}
        Some(v) => {
            return Err(format!(
                "spec.imagePullPolicy: {v}: expected UNSPECIFIED_POLICY, IfNotPresent or Always"
            ));
        }
    }
    Ok(Extracted {
        file_spec: out,
        match_labels,
        pull_secret,
    })
}

/// Which workloads and nodes a resource selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The namespaces its workloads may be in (empty: any).
    pub namespaces: Vec<String>,
    /// Workload uids (`<cluster>//Pod/<namespace>/<name>`), sorted; empty with `by_labels` false: every workload
    /// of `namespaces`.
    pub workloads: Vec<String>,
    /// The nodes those workloads run on; none: every node (a mesh-wide resource without a selector).
    pub nodes: Option<BTreeSet<String>>,
}

/// Resolve a resource's scope against the pods.
pub fn select(
    namespace: &str,
    root_namespace: &str,
    match_labels: Option<&BTreeMap<String, String>>,
    pods: &ByName<PodInfo>,
    cluster_id: &str,
) -> Selection {
    let mesh_wide = namespace == root_namespace;
    let in_scope = |ns: &str| mesh_wide || ns == namespace;
    let namespaces = if mesh_wide {
        Vec::new()
    } else {
        vec![namespace.to_owned()]
    };
    let selected = pods.iter().filter(|((ns, _), p)| {
        in_scope(ns)
            && match_labels.is_none_or(|want| want.iter().all(|(k, v)| p.labels.get(k) == Some(v)))
    });
    let nodes: BTreeSet<String> = selected
        .clone()
        .filter_map(|(_, p)| p.node.clone())
        .collect();
    match match_labels {
        None if mesh_wide => Selection {
            namespaces,
            workloads: Vec::new(),
            nodes: None,
        },
        None => Selection {
            namespaces,
            workloads: Vec::new(),
            nodes: Some(nodes),
        },
        Some(_) => Selection {
            namespaces,
            workloads: selected
                .map(|((ns, name), _)| format!("{cluster_id}//Pod/{ns}/{name}"))
                .collect(),
            nodes: Some(nodes),
        },
    }
}

/// Build the plugin entry for a resource: its extracted spec, its selection, its pull secret's bytes.
pub fn entry(
    namespace: &str,
    name: &str,
    extracted: &Extracted,
    selection: &Selection,
    pull_secret: Option<Vec<u8>>,
) -> Result<PluginEntry, String> {
    let mut spec = extracted.file_spec.clone();
    if !selection.namespaces.is_empty() || !selection.workloads.is_empty() {
        spec.insert(
            "selector".into(),
            json!({"namespaces": selection.namespaces, "workloads": selection.workloads}),
        );
    }
    let source = format!("weftplugins/{namespace}/{name}");
    let mut parsed = parse_spec(&xds_name(namespace, name), Value::Object(spec), &source)?;
    parsed.pull_secret = pull_secret;
    let mut entry = parsed
        .into_entry("", std::path::Path::new("/"))
        .map_err(|e| match e {
            weft_state::ConfigError::Invalid { message, .. } => message,
            other => other.to_string(),
        })?;
    entry.placement = selection
        .nodes
        .as_ref()
        .map(|n| NodeSelector(n.iter().cloned().collect()));
    Ok(entry)
}

#[cfg(test)]
mod tests;
