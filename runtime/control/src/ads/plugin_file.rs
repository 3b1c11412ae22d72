//! `WeftPlugin` files: a YAML resource modelled on Istio's `WasmPlugin` (extensions.istio.io/v1alpha1), one or more
//! documents a file, and their conversion into weft-state's plugin model, which `weft_state::xds::encode::plugin`
//! turns into the ECDS resource a node receives (an `envoy.config.core.v3.TypedExtensionConfig` named after the
//! plugin whose `typed_config` is a `weft.plugin.v1.WeftPlugin`, built as istiod builds a WasmPlugin's).
//!
//! ```yaml
//! apiVersion: weft.dev/v1alpha1
//! kind: WeftPlugin
//! metadata:
//!   name: allowlist
//! spec:
//!   url: file://port_allowlist.wasm   # relative to the directory (inlined), or https://..., oci://...
//!   sha256: 0167d5...                 # required for https://; checked for file://
//!   pluginConfig: {ports: [8080]}     # handed to configure() as JSON
//!   failStrategy: FAIL_CLOSE          # or FAIL_OPEN; unset: the kind's default
//!   kind: policy                      # or telemetry; unset: taken from the component's world
//!   priority: 0                       # lower runs first (weft's order; Istio's WasmPlugin runs higher first)
//!   directions: [inbound]             # and/or outbound
//!   selector: {namespaces: [shop], workloads: [web-1]}
//!   rollout:                          # automatic rollback on the nodes; unset: the nodes' defaults
//!     window: 30s
//!     maxFailureRatio: 0.2
//!     minCalls: 20
//!     nodes: [node-a]                 # staged: only these nodes get this version, the others keep theirs
//!     stages:                         # or staged automatically by weft control (instead of nodes):
//!     - {nodes: 1, bake: 1m, shadowFirst: true}
//!     - {percent: 50, bake: 5m}
//!     abortWhen: {nacks: 0, rollbacks: 0, failureRatio: 0.01, divergenceRatio: 0.001, minCalls: 20}
//!   shadow:                           # beside the serving version (policy: decided and compared, never
//!                                     # enforced; telemetry: the same events, its metrics at /metrics/shadow)
//!     url: file://port_allowlist.wasm # as spec.url (file:// inlined, https:// needs sha256)
//!     sha256: 0167d5...
//!     pluginConfig: {ports: []}       # the shadow's configure() input
//! ```
//!
//! Every value is checked while it is deserialized, so a refused file names its field path and line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};
use weft_proto::type_url;
use weft_state::xds::encode::plugin::extension_config;
use weft_state::xds::plugin::{Code, PluginResource, RemoteCode, ShadowResource};
use weft_state::{
    ConfigError, FailurePolicy, PluginDirections, PluginKind, PluginRollout, WorkloadSelector,
};

use crate::ads::resources::{NodeSelector, PluginEntry, PluginInfo, Resource};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "accepted as in a Kubernetes resource; any group version"
    )]
    api_version: String,
    #[allow(dead_code, reason = "checked while parsing: it must say WeftPlugin")]
    kind: KindTag,
    metadata: Metadata,
    spec: Spec,
}

/// Deserialize a string and check it inside the scalar's own visitor, so serde_yaml reports the error at that
/// value's field path and line (an error raised after `String::deserialize` returned is placed at the enclosing
/// mapping).
fn checked_str<'de, D, T>(
    d: D,
    expecting: &'static str,
    check: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<F>(&'static str, F);
    impl<'de, T, F: FnOnce(&str) -> Result<T, String>> serde::de::Visitor<'de> for V<F> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            (self.1)(v).map_err(E::custom)
        }
    }
    d.deserialize_str(V(expecting, check))
}

/// `kind: WeftPlugin`, and nothing else.
#[derive(Debug)]
struct KindTag;

impl<'de> Deserialize<'de> for KindTag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "WeftPlugin", |s| {
            if s == "WeftPlugin" {
                Ok(KindTag)
            } else {
                Err(format!("kind must be WeftPlugin, not {s:?}"))
            }
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Metadata {
    name: PluginName,
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "accepted as in a Kubernetes resource; plugin names are global"
    )]
    namespace: String,
    #[serde(default)]
    #[allow(dead_code, reason = "accepted as in a Kubernetes resource")]
    labels: serde_yaml::Mapping,
    #[serde(default)]
    #[allow(dead_code, reason = "accepted as in a Kubernetes resource")]
    annotations: serde_yaml::Mapping,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Spec {
    url: CodeUrl,
    #[serde(default)]
    sha256: Option<Sha256Hex>,
    #[serde(default)]
    plugin_config: Option<serde_json::Value>,
    #[serde(default)]
    plugin_name: String,
    #[serde(default)]
    fail_strategy: Option<FailStrategy>,
    #[serde(default)]
    kind: Option<KindWire>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    directions: Option<Vec<DirectionWire>>,
    #[serde(default)]
    selector: Option<SelectorWire>,
    #[serde(default)]
    recheck: Option<bool>,
    #[serde(default)]
    rollout: Option<RolloutWire>,
    #[serde(default)]
    shadow: Option<ShadowWire>,
}

/// `spec.shadow`: another version's code and configuration, run beside the serving one.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ShadowWire {
    url: CodeUrl,
    #[serde(default)]
    sha256: Option<Sha256Hex>,
    #[serde(default)]
    plugin_config: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SelectorWire {
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    workloads: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RolloutWire {
    #[serde(default)]
    window: Option<DurationText>,
    #[serde(default)]
    max_failure_ratio: Option<Ratio>,
    #[serde(default)]
    min_calls: Option<u32>,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    stages: Option<Vec<StageWire>>,
    #[serde(default)]
    abort_when: Option<AbortWire>,
}

/// `spec.rollout.stages[]`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StageWire {
    #[serde(default)]
    nodes: Option<u32>,
    #[serde(default)]
    percent: Option<u32>,
    bake: BakeText,
    #[serde(default)]
    shadow_first: bool,
}

/// `spec.rollout.abortWhen`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AbortWire {
    #[serde(default)]
    nacks: Option<u32>,
    #[serde(default)]
    rollbacks: Option<u32>,
    #[serde(default)]
    failure_ratio: Option<Ratio>,
    #[serde(default)]
    divergence_ratio: Option<Ratio>,
    #[serde(default)]
    min_calls: Option<u64>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
enum FailStrategy {
    #[serde(rename = "FAIL_CLOSE")]
    Close,
    #[serde(rename = "FAIL_OPEN")]
    Open,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
enum KindWire {
    Policy,
    Telemetry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
enum DirectionWire {
    Inbound,
    Outbound,
}

/// A plugin name: 1-253 characters of `[A-Za-z0-9._-]` (it names the xDS resource and the plugin's metrics).
#[derive(Debug, Clone)]
struct PluginName(String);

impl<'de> Deserialize<'de> for PluginName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a plugin name", |s| {
            let ok = !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if ok {
                Ok(PluginName(s.to_owned()))
            } else {
                Err(format!(
                    "invalid plugin name {s:?}: 1-253 characters of letters, digits, '.', '_' and '-'"
                ))
            }
        })
    }
}

/// Where the code is.
#[derive(Debug, Clone)]
enum CodeUrl {
    /// `file://` path (relative to the directory unless absolute).
    File(String),
    /// `https://...` or `oci://...`, handed to the nodes as it is.
    Remote(String),
}

impl<'de> Deserialize<'de> for CodeUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a code URL", |s| {
            if let Some(path) = s.strip_prefix("file://") {
                if path.is_empty() {
                    return Err("file:// URL without a path".into());
                }
                return Ok(CodeUrl::File(path.to_owned()));
            }
            for scheme in ["https://", "oci://"] {
                if let Some(rest) = s.strip_prefix(scheme) {
                    let host = rest.split('/').next().unwrap_or_default();
                    if host.is_empty() || rest.len() == host.len() {
                        return Err(format!("{s:?}: expected {scheme}host/path"));
                    }
                    if s.bytes()
                        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
                    {
                        return Err(format!("{s:?}: URL contains whitespace"));
                    }
                    return Ok(CodeUrl::Remote(s.to_owned()));
                }
            }
            Err(format!(
                "unsupported URL {s:?}: expected oci://, https:// or file://"
            ))
        })
    }
}

impl fmt::Display for CodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodeUrl::File(p) => write!(f, "file://{p}"),
            CodeUrl::Remote(u) => f.write_str(u),
        }
    }
}

/// 64 hex digits (stored lower-case).
#[derive(Debug, Clone)]
struct Sha256Hex(String);

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a sha256", |s| {
            if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(Sha256Hex(s.to_ascii_lowercase()))
            } else {
                Err(format!("invalid sha256 {s:?}: expected 64 hex digits"))
            }
        })
    }
}

/// A ratio in [0, 1].
#[derive(Debug, Clone, Copy)]
struct Ratio(f64);

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Ratio;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a ratio between 0 and 1")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Ratio, E> {
                if (0.0..=1.0).contains(&v) {
                    Ok(Ratio(v))
                } else {
                    Err(E::custom(format!("{v} is not a ratio between 0 and 1")))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Ratio, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Ratio, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_f64(V)
    }
}

/// A duration written as `30s`, `500ms`, `2m`.
#[derive(Debug, Clone, Copy)]
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a duration", |s| match humantime::parse_duration(s) {
            Ok(v) if !v.is_zero() => Ok(DurationText(v)),
            Ok(_) => Err("the window must not be zero".into()),
            Err(e) => Err(format!("invalid duration {s:?}: {e} (e.g. 30s, 500ms, 2m)")),
        })
    }
}

/// A stage's bake time (`0s` allowed).
#[derive(Debug, Clone, Copy)]
struct BakeText(Duration);

impl<'de> Deserialize<'de> for BakeText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, "a duration", |s| {
            humantime::parse_duration(s)
                .map(BakeText)
                .map_err(|e| format!("invalid duration {s:?}: {e} (e.g. 30s, 2m, 0s)"))
        })
    }
}

/// The staged rollout of `spec.rollout`, checked: `stages` (each exactly one of `nodes` ≥ 1 and `percent` in
/// 1..=100, percents not decreasing) instead of `nodes`.
fn plan_of(r: &RolloutWire) -> Result<Option<crate::rollout::plan::Plan>, String> {
    use crate::rollout::plan::{Plan, Stage, StageSize, Thresholds};
    let Some(stages) = &r.stages else {
        if r.abort_when.is_some() {
            return Err("spec.rollout.abortWhen: only with spec.rollout.stages".into());
        }
        return Ok(None);
    };
    if r.nodes.is_some() {
        return Err(
            "spec.rollout.stages: give either nodes (a manual stage) or stages, not both".into(),
        );
    }
    if stages.is_empty() {
        return Err("spec.rollout.stages: empty (leave it unset to roll out at once)".into());
    }
    let mut out = Vec::new();
    let mut last_percent = 0;
    for (i, st) in stages.iter().enumerate() {
        let at = format!("spec.rollout.stages[{i}]");
        let size = match (st.nodes, st.percent) {
            (Some(0), None) => return Err(format!("{at}.nodes: must be at least 1")),
            (Some(n), None) => StageSize::Nodes(n),
            (None, Some(p)) if p == 0 || p > 100 => {
                return Err(format!("{at}.percent: {p} is not in 1..=100"));
            }
            (None, Some(p)) if p < last_percent => {
                return Err(format!(
                    "{at}.percent: {p} is less than the stage before ({last_percent})"
                ));
            }
            (None, Some(p)) => {
                last_percent = p;
                StageSize::Percent(p)
            }
            _ => return Err(format!("{at}: give exactly one of nodes and percent")),
        };
        out.push(Stage {
            size,
            bake: st.bake.0,
            shadow_first: st.shadow_first,
        });
    }
    let d = Thresholds::default();
    let abort_when = match &r.abort_when {
        None => d,
        Some(a) => Thresholds {
            nacks: a.nacks.unwrap_or(d.nacks),
            rollbacks: a.rollbacks.unwrap_or(d.rollbacks),
            failure_ratio: a.failure_ratio.map(|x| x.0),
            divergence_ratio: a.divergence_ratio.map(|x| x.0),
            min_calls: a.min_calls.unwrap_or(d.min_calls).max(1),
        },
    };
    Ok(Some(Plan {
        stages: out,
        abort_when,
    }))
}

/// The line of the `n`th (0-based) `key:` in `text` outside `shadow:` blocks, for errors found after parsing (a code
/// file that cannot be read or does not match its sha256). `shadow` itself: the first `shadow:` after the `n`th
/// `metadata:` (not every document has one).
fn line_of(text: &str, key: &str, n: usize) -> Option<usize> {
    let is_key = |l: &str, key: &str| {
        l.trim_start()
            .strip_prefix(key)
            .is_some_and(|r| r.starts_with(':'))
    };
    let indent = |l: &str| l.len() - l.trim_start().len();
    if key == "shadow" {
        let from = line_of(text, "metadata", n)?;
        return text
            .lines()
            .enumerate()
            .skip(from)
            .find(|(_, l)| is_key(l, "shadow"))
            .map(|(i, _)| i + 1);
    }
    let mut shadow_indent: Option<usize> = None;
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            if let Some(i) = shadow_indent {
                if l.trim().is_empty() || indent(l) > i {
                    return false;
                }
                shadow_indent = None;
            }
            if is_key(l, "shadow") {
                shadow_indent = Some(indent(l));
            }
            is_key(l, key)
        })
        .nth(n)
        .map(|(i, _)| i + 1)
}

/// One plugin from a file, not yet turned into a resource.
#[derive(Debug)]
pub struct ParsedPlugin {
    /// The plugin (resource) name.
    pub name: String,
    /// The file it came from.
    pub file: PathBuf,
    /// Which document of the file (0-based).
    pub index: usize,
    /// Registry credentials (a docker `config.json`) sent with remote code: a WeftPlugin resource's
    /// `imagePullSecret`, read by the controller. Files have none.
    pub pull_secret: Option<Vec<u8>>,
    spec: Spec,
}

/// Parse the text of one `WeftPlugin` file (one or more YAML documents; empty documents are skipped).
pub fn parse_file(text: &str, file: &Path) -> Result<Vec<ParsedPlugin>, ConfigError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value: Option<Document> =
            Option::deserialize(doc).map_err(|e| ConfigError::from_yaml(file, &e))?;
        if let Some(d) = value {
            out.push(ParsedPlugin {
                name: d.metadata.name.0,
                file: file.to_path_buf(),
                index,
                pull_secret: None,
                spec: d.spec,
            });
        }
    }
    Ok(out)
}

/// Parse one plugin's `spec` given as JSON (a WeftPlugin resource's, already rewritten into this file format by
/// the controller): the same checks as a file's, the error naming the field path (`spec.rollout.window: ...`).
pub fn parse_spec(
    name: &str,
    spec: serde_json::Value,
    source: &str,
) -> Result<ParsedPlugin, String> {
    let name = PluginName::deserialize(serde_json::Value::String(name.to_owned()))
        .map_err(|e| format!("metadata.name: {e}"))?;
    let spec: Spec = serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("spec: {}", e.inner())
        } else {
            format!("spec.{path}: {}", e.inner())
        }
    })?;
    Ok(ParsedPlugin {
        name: name.0,
        file: PathBuf::from(source),
        index: 0,
        pull_secret: None,
        spec,
    })
}

impl ParsedPlugin {
    /// The code file of a `file://` URL (relative paths against `dir`).
    pub fn local_code(&self, dir: &Path) -> Option<PathBuf> {
        match &self.spec.url {
            CodeUrl::File(p) => Some(dir.join(p)),
            CodeUrl::Remote(_) => None,
        }
    }

    /// Build the resource: read and inline `file://` code (relative paths against `dir`), check its sha256.
    pub fn into_entry(self, text: &str, dir: &Path) -> Result<PluginEntry, ConfigError> {
        let s = self.spec;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            file: self.file.clone(),
            line: line_of(text, key, self.index),
            column: None,
            message,
        };
        let url_text = s.url.to_string();
        let secret = self.pull_secret.as_ref();
        let (code, sha256) =
            resolve_code(&s.url, s.sha256.as_ref(), secret, dir, "spec", &invalid)?;
        let shadow = match &s.shadow {
            None => None,
            Some(sh) => {
                let (code, sha256) = resolve_code(
                    &sh.url,
                    sh.sha256.as_ref(),
                    secret,
                    dir,
                    "spec.shadow",
                    &invalid,
                )?;
                Some(ShadowResource {
                    sha256: match &code {
                        Code::Inline(_) => None,
                        Code::Remote(_) => sha256,
                    },
                    code,
                    config: sh
                        .plugin_config
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                })
            }
        };
        let directions = match &s.directions {
            None => PluginDirections::default(),
            Some(d) if d.is_empty() => {
                return Err(invalid(
                    "directions",
                    "spec.directions: empty (leave it unset for inbound only)".into(),
                ));
            }
            Some(d) => PluginDirections {
                inbound: d.contains(&DirectionWire::Inbound),
                outbound: d.contains(&DirectionWire::Outbound),
            },
        };
        // `nodes` alone is the server's business: the staged version and the promoted one are the same resource,
        // so a promotion sends nothing to the nodes that already run it.
        let rollout = match s.rollout.as_ref().filter(|r| {
            r.window.is_some()
                || r.max_failure_ratio.is_some()
                || r.min_calls.is_some()
                || r.disabled
        }) {
            None => None,
            Some(r) => Some(PluginRollout {
                window: match (r.window, r.disabled) {
                    (Some(w), _) => w.0,
                    (None, true) => Duration::ZERO,
                    (None, false) => {
                        return Err(invalid(
                            "rollout",
                            "spec.rollout.window: required unless disabled is set".into(),
                        ));
                    }
                },
                max_failure_ppm: PluginRollout::ppm(r.max_failure_ratio.map_or(0.0, |x| x.0)),
                min_calls: r.min_calls.unwrap_or(0).max(1),
                disabled: r.disabled,
            }),
        };
        let nodes = s
            .rollout
            .as_ref()
            .and_then(|r| r.nodes.clone())
            .map(NodeSelector);
        let plan = match &s.rollout {
            None => None,
            Some(r) => plan_of(r).map_err(|e| invalid("rollout", e))?,
        };
        // The model a node will decode; its wire form is weft-state's encoder (the round trip is tested there).
        let model = PluginResource {
            name: self.name.clone(),
            root_id: s.plugin_name,
            sha256: match &code {
                Code::Inline(_) => None,
                Code::Remote(_) => sha256.clone(),
            },
            code,
            config: s
                .plugin_config
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            failure_policy: match s.fail_strategy {
                Some(FailStrategy::Open) => FailurePolicy::FailOpen,
                None | Some(FailStrategy::Close) => FailurePolicy::FailClosed,
            },
            kind: s.kind.map(|k| match k {
                KindWire::Policy => PluginKind::Policy,
                KindWire::Telemetry => PluginKind::Telemetry,
            }),
            priority: s.priority,
            selector: s
                .selector
                .map(|sel| WorkloadSelector {
                    namespaces: sel.namespaces,
                    workloads: sel.workloads,
                })
                .unwrap_or_default(),
            directions,
            recheck: s.recheck.unwrap_or(true),
            rollout,
            shadow,
        };
        let ecds = extension_config(&model);
        let resource = Resource::new(
            self.name.clone(),
            weft_proto::to_any(type_url::EXTENSION_CONFIG, &ecds),
        );
        Ok(PluginEntry {
            current: std::sync::Arc::new(resource),
            info: PluginInfo {
                file: self.file.display().to_string(),
                url: url_text,
                sha256,
            },
            nodes,
            placement: None,
            base: None,
            base_info: None,
            plan: plan.map(std::sync::Arc::new),
            shadowing: None,
        })
    }
}

/// The code a `url` (at `prefix`.url, with `prefix`.sha256) names: `file://` read and inlined (its sha256 checked
/// against the pin), remote as is (https:// needs a sha256); and the sha256 known for it.
fn resolve_code(
    url: &CodeUrl,
    pin: Option<&Sha256Hex>,
    pull_secret: Option<&Vec<u8>>,
    dir: &Path,
    prefix: &str,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(Code, Option<String>), ConfigError> {
    // The line: the key itself for the serving fields, the `shadow:` block for the shadow's.
    let key = |k: &'static str| if prefix == "spec" { k } else { "shadow" };
    match url {
        CodeUrl::File(p) => {
            let path = dir.join(p);
            let bytes = std::fs::read(&path).map_err(|e| {
                invalid(
                    key("url"),
                    format!("{prefix}.url: cannot read {}: {e}", path.display()),
                )
            })?;
            let actual = hex::encode(Sha256::digest(&bytes));
            if let Some(want) = pin
                && want.0 != actual
            {
                return Err(invalid(
                    key("sha256"),
                    format!(
                        "{prefix}.sha256: {} has sha256 {actual}, not {}",
                        path.display(),
                        want.0
                    ),
                ));
            }
            Ok((Code::Inline(std::sync::Arc::new(bytes)), Some(actual)))
        }
        CodeUrl::Remote(url) => {
            if url.starts_with("https://") && pin.is_none() {
                return Err(invalid(
                    key("url"),
                    format!(
                        "{prefix}.sha256: required for https:// code (nothing else verifies what the \
                         nodes download)"
                    ),
                ));
            }
            let remote = RemoteCode {
                uri: url.clone(),
                timeout: Some(Duration::from_secs(30)),
                retries: None,
                backoff: None,
                pull_secret: pull_secret.cloned(),
            };
            Ok((Code::Remote(remote), pin.map(|h| h.0.clone())))
        }
    }
}

#[cfg(test)]
mod tests;
