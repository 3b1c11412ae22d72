//! The wire contract with Istio and Envoy: every field and enum value of weft's .proto files has the number, label,
//! type and oneof of the upstream definition (`upstream_fields.tsv`, extracted from Istio's and Envoy's published
//! .proto files at the commits it names), Istio's messages are complete, and a few encodings are checked byte by byte.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    number: String,
    label: String,
    ty: String,
    oneof: String,
}

fn upstream() -> BTreeMap<String, Row> {
    include_str!("upstream_fields.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(f.len() >= 4, "bad row {l:?}");
            (
                f[0].to_owned(),
                Row {
                    number: f[1].to_owned(),
                    label: f[2].to_owned(),
                    ty: f[3].to_owned(),
                    oneof: f.get(4).copied().unwrap_or("").to_owned(),
                },
            )
        })
        .collect()
}

fn scalar(t: Type) -> &'static str {
    match t {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
        Type::Group | Type::Message | Type::Enum => "",
    }
}

fn last_segment(type_name: &str) -> &str {
    type_name.rsplit('.').next().unwrap_or(type_name)
}

/// Every field and enum value weft defines, as rows keyed like the upstream table.
fn ours() -> BTreeMap<String, Row> {
    let fds = FileDescriptorSet::decode(weft_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut out = BTreeMap::new();
    for file in &fds.file {
        let pkg = file.package();
        // Our own messages and the certificate service are checked elsewhere.
        if pkg.starts_with("weft.") || pkg == "istio.v1.auth" || pkg.starts_with("google.protobuf")
        {
            continue;
        }
        for m in &file.message_type {
            walk_message(&format!("{pkg}.{}", m.name()), m, &mut out);
        }
        for e in &file.enum_type {
            walk_enum(&format!("{pkg}.{}", e.name()), e, &mut out);
        }
    }
    out
}

fn walk_enum(prefix: &str, e: &EnumDescriptorProto, out: &mut BTreeMap<String, Row>) {
    for v in &e.value {
        out.insert(
            format!("{prefix}.{}", v.name()),
            Row {
                number: v.number().to_string(),
                label: "enum".into(),
                ty: String::new(),
                oneof: String::new(),
            },
        );
    }
}

fn walk_message(prefix: &str, m: &DescriptorProto, out: &mut BTreeMap<String, Row>) {
    let entries: BTreeMap<&str, &DescriptorProto> = m
        .nested_type
        .iter()
        .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|n| (n.name(), n))
        .collect();
    for f in &m.field {
        let entry = (f.r#type() == Type::Message)
            .then(|| entries.get(last_segment(f.type_name())))
            .flatten();
        let (label, ty) = if let Some(entry) = entry {
            let kv: Vec<String> = entry
                .field
                .iter()
                .map(|x| match scalar(x.r#type()) {
                    "" => last_segment(x.type_name()).to_owned(),
                    s => s.to_owned(),
                })
                .collect();
            ("map".to_owned(), format!("map<{}>", kv.join(",")))
        } else {
            let label = if f.proto3_optional() {
                "optional"
            } else if f.label() == Label::Repeated {
                "repeated"
            } else {
                "single"
            };
            let ty = match scalar(f.r#type()) {
                "" => last_segment(f.type_name()).to_owned(),
                s => s.to_owned(),
            };
            (label.to_owned(), ty)
        };
        let oneof = match f.oneof_index {
            Some(i) if !f.proto3_optional() => m.oneof_decl[i as usize].name().to_owned(),
            _ => String::new(),
        };
        out.insert(
            format!("{prefix}.{}", f.name()),
            Row {
                number: f.number().to_string(),
                label,
                ty,
                oneof,
            },
        );
    }
    for n in &m.nested_type {
        if !entries.contains_key(n.name()) {
            walk_message(&format!("{prefix}.{}", n.name()), n, out);
        }
    }
    for e in &m.enum_type {
        walk_enum(&format!("{prefix}.{}", e.name()), e, out);
    }
}

#[test]
fn every_field_matches_the_upstream_definition() {
    let up = upstream();
    let mine = ours();
    assert!(mine.len() > 150, "walked only {} fields", mine.len());
    let mut wrong = Vec::new();
    for (name, row) in &mine {
        match up.get(name) {
            None => wrong.push(format!("{name}: not in the upstream definition")),
            Some(u) if u != row => wrong.push(format!("{name}: ours {row:?}, upstream {u:?}")),
            Some(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "wire contract broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn istio_messages_are_complete() {
    let mine = ours();
    let up = upstream();
    let missing: Vec<&String> = up
        .keys()
        .filter(|k| k.starts_with("istio."))
        .filter(|k| !mine.contains_key(*k))
        .collect();
    assert!(missing.is_empty(), "Istio fields weft lacks: {missing:?}");
}

#[test]
fn every_upstream_message_weft_defines_keeps_its_name() {
    // A renamed message would pass the field check under its new name only if the table had it; make sure each
    // message we define is one upstream has.
    let up: BTreeSet<String> = upstream()
        .keys()
        .map(|k| k.rsplit_once('.').map_or(k.clone(), |(m, _)| m.to_owned()))
        .collect();
    let mine: BTreeSet<String> = ours()
        .keys()
        .map(|k| k.rsplit_once('.').map_or(k.clone(), |(m, _)| m.to_owned()))
        .collect();
    let unknown: Vec<&String> = mine.difference(&up).collect();
    assert!(
        unknown.is_empty(),
        "messages upstream does not have: {unknown:?}"
    );
}

#[test]
fn workload_and_authorization_encode_as_istiod_sends_them() {
    use weft_proto::istio::security as sec;
    use weft_proto::istio::workload as wl;
    let w = wl::Workload {
        uid: "u".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        ..Default::default()
    };
    // addresses: field 3, bytes → 0x1a; tunnel_protocol: field 5, varint → 0x28; uid: field 20 → 0xa2 0x01.
    assert_eq!(
        w.encode_to_vec(),
        vec![0x1a, 4, 10, 0, 0, 1, 0x28, 1, 0xa2, 0x01, 1, b'u']
    );
    let a = wl::Address {
        r#type: Some(wl::address::Type::Workload(w.clone())),
    };
    let back = wl::Address::decode(a.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, a);

    let p = sec::Authorization {
        name: "n".into(),
        action: sec::Action::Deny as i32,
        groups: vec![sec::Group {
            rules: vec![sec::Rules {
                matches: vec![sec::Match {
                    not_destination_ports: vec![9999],
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    };
    // name 1 → 0x0a; action 4 → 0x20; groups 5 → 0x2a; Group.rules 1 → 0x0a; Rules.matches 2 → 0x12;
    // Match.not_destination_ports 10, packed → 0x52, 9999 as a varint → 0x8f 0x4e.
    assert_eq!(
        p.encode_to_vec(),
        vec![
            0x0a, 1, b'n', 0x20, 1, 0x2a, 8, 0x0a, 6, 0x12, 4, 0x52, 2, 0x8f, 0x4e
        ]
    );
    let back = sec::Authorization::decode(p.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn a_delta_request_uses_the_documented_field_numbers() {
    use weft_proto::envoy::service::discovery::v3 as d;
    use weft_proto::google::rpc::Status;
    let r = d::DeltaDiscoveryRequest {
        type_url: "t".into(),
        response_nonce: "n".into(),
        error_detail: Some(Status {
            code: 3,
            message: "m".into(),
            details: vec![],
        }),
        ..Default::default()
    };
    // type_url 2 → 0x12; response_nonce 6 → 0x32; error_detail 7 → 0x3a {code 1 → 0x08, message 2 → 0x12}.
    assert_eq!(
        r.encode_to_vec(),
        vec![
            0x12, 1, b't', 0x32, 1, b'n', 0x3a, 5, 0x08, 3, 0x12, 1, b'm'
        ]
    );
}
