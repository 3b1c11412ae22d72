//! Protocol definitions weft speaks on the wire, generated at build time from the `.proto` files in `proto/`
//! (by protox, so no protoc is needed): today the Istio certificate service; the xDS protos go here too.

#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// Istio's certificate service (`istio.v1.auth`): `IstioCertificateService/CreateCertificate`.
pub mod istio_ca {
    tonic::include_proto!("istio.v1.auth");
}

/// ZDS (`istio.workload.zds`): the CNI node agent hands meshed pods and their network namespaces to the node proxy.
pub mod zds {
    tonic::include_proto!("istio.workload.zds");
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
