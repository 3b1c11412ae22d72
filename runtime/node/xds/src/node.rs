//! Who the client says it is: the `Node` ztunnel sends, so istiod serves weft as it serves ztunnel.
//!
//! - id `ztunnel~<instance ip>~<pod name>.<pod namespace>~<pod namespace>.svc.cluster.local` (the IP defaults to
//!   `1.1.1.1` and the names to empty, as in ztunnel);
//! - metadata `NAME` (pod name), `NAMESPACE`, `INSTANCE_IPS`, `NODE_NAME`, then every `ISTIO_META_<KEY>`
//!   environment variable as `<KEY>` (a string; it overrides the four above), then every `ISTIO_METAJSON_<KEY>` as
//!   `<KEY>` parsed from JSON (skipped, with an error logged, when it does not parse);
//! - no `cluster`, locality or user agent.

use std::collections::BTreeMap;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use weft_proto::envoy::config::core::v3::Node;

/// The instance IP ztunnel reports when `INSTANCE_IP` is not set.
pub const DEFAULT_INSTANCE_IP: &str = "1.1.1.1";

const META_PREFIX: &str = "ISTIO_META_";
const META_JSON_PREFIX: &str = "ISTIO_METAJSON_";

/// The inputs of the node id and metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    /// The proxy pod's IP (`INSTANCE_IP`).
    pub instance_ip: Option<String>,
    /// The proxy pod's name (`POD_NAME`).
    pub pod_name: String,
    /// The proxy pod's namespace (`POD_NAMESPACE`).
    pub pod_namespace: String,
    /// The Kubernetes node name (`NODE_NAME`).
    pub node_name: String,
    /// Extra metadata (from `ISTIO_META_*` / `ISTIO_METAJSON_*`, see [`NodeInfo::with_env`]); overrides the keys
    /// above.
    pub metadata: BTreeMap<String, Value>,
}

impl NodeInfo {
    /// Add the `ISTIO_META_*` (strings) and then the `ISTIO_METAJSON_*` (JSON) variables of `vars`, prefixes
    /// stripped, as ztunnel reads them from its environment.
    pub fn with_env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut json = Vec::new();
        for (k, v) in vars {
            if let Some(key) = k.strip_prefix(META_JSON_PREFIX) {
                json.push((key.to_owned(), v));
            } else if let Some(key) = k.strip_prefix(META_PREFIX) {
                self.metadata.insert(key.to_owned(), string(v));
            }
        }
        for (key, v) in json {
            match serde_json::from_str::<serde_json::Value>(&v) {
                Ok(parsed) => {
                    self.metadata.insert(key, json_value(parsed));
                }
                Err(e) => {
                    tracing::error!(variable = %format!("{META_JSON_PREFIX}{key}"), error = %e,
                    "node metadata variable is not JSON; left out")
                }
            }
        }
        self
    }

    /// Set a metadata key (a string) unless the environment already did.
    pub fn default_metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .entry(key.to_owned())
            .or_insert_with(|| string(value.to_owned()));
        self
    }

    /// The instance IP as reported.
    pub fn ip(&self) -> &str {
        self.instance_ip
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_INSTANCE_IP)
    }

    /// `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub fn id(&self) -> String {
        let ns = &self.pod_namespace;
        format!(
            "ztunnel~{}~{}.{ns}~{ns}.svc.cluster.local",
            self.ip(),
            self.pod_name
        )
    }

    /// The metadata struct as sent.
    pub fn metadata_struct(&self) -> Struct {
        let mut fields: BTreeMap<String, Value> = [
            ("NAME", self.pod_name.clone()),
            ("NAMESPACE", self.pod_namespace.clone()),
            ("INSTANCE_IPS", self.ip().to_owned()),
            ("NODE_NAME", self.node_name.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), string(v)))
        .collect();
        fields.extend(self.metadata.clone());
        Struct { fields }
    }

    /// The `Node` message.
    pub fn to_proto(&self) -> Node {
        Node {
            id: self.id(),
            metadata: Some(self.metadata_struct()),
            ..Default::default()
        }
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn json_value(v: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(json_value).collect(),
        }),
        J::Object(map) => Kind::StructValue(Struct {
            fields: map.into_iter().map(|(k, v)| (k, json_value(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(v: &Value) -> &str {
        match v.kind.as_ref().unwrap() {
            Kind::StringValue(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }

    #[test]
    fn id_and_metadata_as_ztunnel_sends_them() {
        let n = NodeInfo {
            instance_ip: Some("10.0.0.7".into()),
            pod_name: "ztunnel-abcde".into(),
            pod_namespace: "istio-system".into(),
            node_name: "worker-1".into(),
            ..Default::default()
        }
        .with_env([
            ("ISTIO_META_CLUSTER_ID".to_owned(), "east".to_owned()),
            ("ISTIO_META_NAME".to_owned(), "override".to_owned()),
            (
                "ISTIO_METAJSON_LABELS".to_owned(),
                r#"{"a":"b","n":[1,true]}"#.to_owned(),
            ),
            ("ISTIO_METAJSON_BAD".to_owned(), "{".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ]);
        assert_eq!(
            n.id(),
            "ztunnel~10.0.0.7~ztunnel-abcde.istio-system~istio-system.svc.cluster.local"
        );
        let p = n.to_proto();
        assert!(p.cluster.is_empty());
        let f = &p.metadata.unwrap().fields;
        assert_eq!(s(&f["NAME"]), "override");
        assert_eq!(s(&f["NAMESPACE"]), "istio-system");
        assert_eq!(s(&f["INSTANCE_IPS"]), "10.0.0.7");
        assert_eq!(s(&f["NODE_NAME"]), "worker-1");
        assert_eq!(s(&f["CLUSTER_ID"]), "east");
        assert!(!f.contains_key("BAD") && !f.contains_key("PATH"));
        let Some(Kind::StructValue(labels)) = &f["LABELS"].kind else {
            panic!("LABELS is not a struct")
        };
        assert_eq!(s(&labels.fields["a"]), "b");
    }

    #[test]
    fn defaults_match_ztunnel() {
        let n = NodeInfo::default();
        assert_eq!(n.id(), "ztunnel~1.1.1.1~.~.svc.cluster.local");
        let n = n.default_metadata("CLUSTER_ID", "Kubernetes");
        assert_eq!(s(&n.metadata_struct().fields["CLUSTER_ID"]), "Kubernetes");
    }
}
