//! Protocol definitions weft speaks on the wire, generated at build time from the `.proto` files in `proto/` (by
//! protox, so no protoc is needed): the Istio certificate service; Istio's workload (`istio.workload.Address`) and
//! L4 authorization (`istio.security.Authorization`) xDS resources; Envoy's delta aggregated discovery service, node
//! and data sources; Envoy's Wasm plugin config and ECDS `TypedExtensionConfig`; and weft's own plugin resource.
//! Module paths mirror the protobuf packages (so `istio.workload.Workload` is [`istio::workload::Workload`]).

#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// Istio's certificate service (`istio.v1.auth`): `IstioCertificateService/CreateCertificate`.
pub mod istio_ca {
    tonic::include_proto!("istio.v1.auth");
}

/// ZDS (`istio.workload.zds`): the CNI node agent hands meshed pods and their network namespaces to the node proxy.
pub mod zds {
    tonic::include_proto!("istio.workload.zds");
}

/// Istio's ambient resources.
pub mod istio {
    /// `istio.workload`: Address (a workload or a service) and what they contain.
    pub mod workload {
        tonic::include_proto!("istio.workload");
    }
    /// `istio.security`: L4 Authorization.
    pub mod security {
        tonic::include_proto!("istio.security");
    }
}

/// `google.rpc`: Status, the error detail of a NACK.
pub mod google {
    /// `google.rpc`.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Envoy's API, the parts weft speaks.
pub mod envoy {
    /// `envoy.config.*`.
    pub mod config {
        /// `envoy.config.core`.
        pub mod core {
            /// `envoy.config.core.v3`: Node, data sources, TypedExtensionConfig.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.service.*`.
    pub mod service {
        /// `envoy.service.discovery`.
        pub mod discovery {
            /// `envoy.service.discovery.v3`: delta ADS.
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
    /// `envoy.extensions.*`.
    pub mod extensions {
        /// `envoy.extensions.wasm`.
        pub mod wasm {
            /// `envoy.extensions.wasm.v3`: PluginConfig, VmConfig.
            pub mod v3 {
                tonic::include_proto!("envoy.extensions.wasm.v3");
            }
        }
        /// `envoy.extensions.filters.*`.
        pub mod filters {
            /// `envoy.extensions.filters.network`.
            pub mod network {
                /// `envoy.extensions.filters.network.wasm`.
                pub mod wasm {
                    /// `envoy.extensions.filters.network.wasm.v3`: the Wasm network filter config.
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.network.wasm.v3");
                    }
                }
            }
        }
    }
}

/// weft's own messages.
pub mod weft {
    /// `weft.plugin`.
    pub mod plugin {
        /// `weft.plugin.v1`: WeftPlugin, RollbackReport.
        pub mod v1 {
            tonic::include_proto!("weft.plugin.v1");
        }
    }
}

/// The encoded `FileDescriptorSet` of every .proto file above (for wire-contract tests and reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/weft_descriptors.bin"));

/// xDS type URLs.
pub mod type_url {
    /// Workloads and services (`istio.workload.Address`).
    pub const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
    /// L4 authorization policies.
    pub const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";
    /// Extension configs (ECDS): weft's plugins.
    pub const EXTENSION_CONFIG: &str =
        "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
    /// The typed config of a weft plugin resource.
    pub const WEFT_PLUGIN: &str = "type.googleapis.com/weft.plugin.v1.WeftPlugin";
    /// Envoy's Wasm network filter config (what istiod sends for a NETWORK WasmPlugin).
    pub const WASM_NETWORK_FILTER: &str =
        "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm";
    /// Envoy's bare Wasm plugin config.
    pub const WASM_PLUGIN_CONFIG: &str =
        "type.googleapis.com/envoy.extensions.wasm.v3.PluginConfig";
    /// The rollback figures in a NACK's details.
    pub const ROLLBACK_REPORT: &str = "type.googleapis.com/weft.plugin.v1.RollbackReport";
    /// `weft.plugin.v1.ShadowReport` (in a report's `error_detail.details`).
    pub const SHADOW_REPORT: &str = "type.googleapis.com/weft.plugin.v1.ShadowReport";
    /// `weft.plugin.v1.PluginCounts` (in a report's `error_detail.details`).
    pub const PLUGIN_COUNTS: &str = "type.googleapis.com/weft.plugin.v1.PluginCounts";
    /// `google.protobuf.StringValue` (istiod's encoding of a Wasm plugin's JSON configuration).
    pub const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";
    /// `google.protobuf.BytesValue`.
    pub const BYTES_VALUE: &str = "type.googleapis.com/google.protobuf.BytesValue";
    /// `google.protobuf.Struct`.
    pub const STRUCT: &str = "type.googleapis.com/google.protobuf.Struct";
}

/// Pack a message into a `google.protobuf.Any` with its type URL.
pub fn to_any<M: prost::Message>(type_url: &str, message: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url.to_owned(),
        value: message.encode_to_vec(),
    }
}

/// Why an `Any` could not be unpacked.
#[derive(Debug)]
pub enum AnyError {
    /// The `Any` holds another type.
    WrongType {
        /// What was expected.
        expected: String,
        /// What it holds.
        found: String,
    },
    /// The bytes are not that message.
    Decode(prost::DecodeError),
}

impl std::fmt::Display for AnyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyError::WrongType { expected, found } => {
                write!(f, "expected a {expected}, found a {found:?}")
            }
            AnyError::Decode(e) => write!(f, "cannot decode: {e}"),
        }
    }
}

impl std::error::Error for AnyError {}

/// Unpack a `google.protobuf.Any` that must hold `type_url`.
pub fn from_any<M: prost::Message + Default>(
    type_url: &str,
    any: &prost_types::Any,
) -> Result<M, AnyError> {
    if any.type_url != type_url {
        return Err(AnyError::WrongType {
            expected: type_url.to_owned(),
            found: any.type_url.clone(),
        });
    }
    M::decode(any.value.as_slice()).map_err(AnyError::Decode)
}

/// The request-metadata key a node proxy uses to ask for a workload's identity rather than its own.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// A `google.protobuf.Struct` with one string field.
pub fn string_struct(key: &str, value: &str) -> prost_types::Struct {
    prost_types::Struct {
        fields: [(
            key.to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(value.to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    }
}

/// The string field `key` of a `google.protobuf.Struct`, if it is there and a string.
pub fn struct_string<'a>(s: Option<&'a prost_types::Struct>, key: &str) -> Option<&'a str> {
    match s?.fields.get(key)?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(v) => Some(v.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_the_wire_contract() {
        let req = istio_ca::IstioCertificateRequest {
            csr: "c".into(),
            validity_duration: 7,
            metadata: Some(string_struct(
                IMPERSONATED_IDENTITY,
                "spiffe://td/ns/a/sa/b",
            )),
        };
        let bytes = req.encode_to_vec();
        // csr: field 1, wire type 2 → tag 0x0a; validity: field 3, varint → 0x18; metadata: field 4 → 0x22.
        assert_eq!(&bytes[..3], &[0x0a, 0x01, b'c']);
        assert_eq!(&bytes[3..5], &[0x18, 7]);
        assert_eq!(bytes[5], 0x22);
        let back = istio_ca::IstioCertificateRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            struct_string(back.metadata.as_ref(), IMPERSONATED_IDENTITY),
            Some("spiffe://td/ns/a/sa/b")
        );
        let resp = istio_ca::IstioCertificateResponse {
            cert_chain: vec!["x".into()],
        };
        assert_eq!(resp.encode_to_vec(), vec![0x0a, 0x01, b'x']);
    }
}
