//! Tests of the server's Delta state: subscriptions, diffs, ACK/NACK matching and the pending bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use weft_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;

use super::*;

const T: &str = "type.example/T";

fn any(v: &str) -> prost_types::Any {
    prost_types::Any {
        type_url: T.into(),
        value: v.as_bytes().to_vec(),
    }
}

/// Offered resources: `(name, Some(version))` served, `(name, None)` kept.
fn offer(items: &[(&str, Option<&str>)]) -> BTreeMap<String, Offered<Versioned>> {
    items
        .iter()
        .map(|(n, v)| {
            let o = match v {
                Some(v) => Offered::Serve(Versioned::new(*v, any(v))),
                None => Offered::Keep,
            };
            (n.to_string(), o)
        })
        .collect()
}

fn request(subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: T.into(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn ack(nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: T.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn nack(nonce: &str, message: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        error_detail: Some(weft_proto::google::rpc::Status {
            code: 3,
            message: message.into(),
            details: vec![],
        }),
        ..ack(nonce)
    }
}

/// Receive `req` and answer it from `offered`.
fn exchange(
    s: &mut DeltaStream,
    req: &DeltaDiscoveryRequest,
    offered: &BTreeMap<String, Offered<Versioned>>,
) -> (Received, Option<Push>) {
    let received = s.receive(req);
    let push = received
        .change
        .as_ref()
        .and_then(|c| s.respond(T, offered, Some(c), "v"));
    (received, push)
}

/// `(name, version)` of a response's resources, and its removals.
fn contents(p: &Push) -> (Vec<(String, String)>, Vec<String>) {
    let r = &p.response;
    (
        r.resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect(),
        r.removed_resources.clone(),
    )
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn names(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_wildcard_subscription_gets_everything_served_and_nothing_kept() {
    let mut s = DeltaStream::new();
    let offered = offer(&[("a", Some("1")), ("b", Some("2")), ("k", None)]);
    let (received, push) = exchange(&mut s, &request(&[], &[]), &offered);
    assert!(received.answer.is_none());
    assert_eq!(
        received.change,
        Some(SubscriptionChange {
            initial: true,
            newly_named: vec![]
        })
    );
    let push = push.expect("a first response");
    assert_eq!(contents(&push), (pairs(&[("a", "1"), ("b", "2")]), vec![]));
    assert_eq!(push.response.type_url, T);
    assert_eq!(push.response.system_version_info, "v");
    assert_eq!(push.response.nonce, "1");
    assert_eq!(push.response.resources[0].resource, Some(any("1")));
    assert_eq!(push.sent.resources, pairs(&[("a", "1"), ("b", "2")]));
    let sub = s.subscription(T).unwrap();
    assert!(sub.wildcard());
    assert_eq!(sub.has("a"), Some("1"));
    assert_eq!(sub.has("k"), None);
    assert_eq!(sub.pending(), 1);
    // "*" is the wildcard too.
    let mut s = DeltaStream::new();
    let (_, push) = exchange(&mut s, &request(&["*"], &[]), &offered);
    assert_eq!(contents(&push.unwrap()).0.len(), 2);
    assert!(s.subscription(T).unwrap().wildcard());
}

#[test]
fn a_named_subscription_gets_only_its_names_and_missing_names_as_removed() {
    let mut s = DeltaStream::new();
    let offered = offer(&[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))]);
    let (_, push) = exchange(&mut s, &request(&["b", "gone"], &[]), &offered);
    assert_eq!(
        contents(&push.unwrap()),
        (pairs(&[("b", "2")]), names(&["gone"]))
    );
    let sub = s.subscription(T).unwrap();
    assert!(!sub.wildcard());
    assert_eq!(sub.names().collect::<Vec<_>>(), ["b", "gone"]);
    // A change to a name not subscribed sends nothing; one to a subscribed name sends it alone.
    let next = offer(&[("a", Some("9")), ("b", Some("2")), ("c", Some("3"))]);
    assert!(s.respond(T, &next, None, "v").is_none());
    let next = offer(&[("a", Some("9")), ("b", Some("5")), ("c", Some("3"))]);
    let push = s.respond(T, &next, None, "v").unwrap();
    assert_eq!(contents(&push), (pairs(&[("b", "5")]), vec![]));
    // Subscribing another name later sends it.
    let (received, push) = exchange(&mut s, &request(&["c", "b"], &[]), &next);
    assert_eq!(received.change.unwrap().newly_named, names(&["c"]));
    assert_eq!(contents(&push.unwrap()), (pairs(&[("c", "3")]), vec![]));
}

#[test]
fn unsubscribing_stops_updates_and_removal_of_an_unsubscribed_name_is_not_sent() {
    let mut s = DeltaStream::new();
    let offered = offer(&[("a", Some("1")), ("b", Some("1"))]);
    exchange(&mut s, &request(&["a", "b"], &[]), &offered);
    let (received, push) = exchange(&mut s, &request(&[], &["a"]), &offered);
    assert_eq!(
        received.change,
        Some(SubscriptionChange {
            initial: false,
            newly_named: vec![]
        })
    );
    assert!(push.is_none(), "an unsubscribe alone sends nothing");
    let sub = s.subscription(T).unwrap();
    assert_eq!(sub.names().collect::<Vec<_>>(), ["b"]);
    assert_eq!(sub.has("a"), None);
    // a changes, then disappears: nothing goes out about it.
    assert!(
        s.respond(T, &offer(&[("a", Some("2")), ("b", Some("1"))]), None, "v")
            .is_none()
    );
    assert!(
        s.respond(T, &offer(&[("b", Some("1"))]), None, "v")
            .is_none()
    );
    // b is still followed.
    let push = s.respond(T, &offer(&[]), None, "v").unwrap();
    assert_eq!(contents(&push), (vec![], names(&["b"])));
    // Unsubscribing the wildcard stops it too.
    let mut s = DeltaStream::new();
    exchange(&mut s, &request(&[], &[]), &offered);
    exchange(&mut s, &request(&[], &["*"]), &offered);
    assert!(!s.subscription(T).unwrap().wildcard());
    assert!(
        s.respond(T, &offer(&[("a", Some("2"))]), None, "v")
            .is_none()
    );
}

#[test]
fn initial_resource_versions_suppress_what_the_node_has_and_remove_what_is_gone() {
    let mut s = DeltaStream::new();
    let mut req = request(&[], &[]);
    req.initial_resource_versions = [("a", "1"), ("b", "1"), ("gone", "7"), ("k", "3")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let offered = offer(&[
        ("a", Some("1")),
        ("b", Some("2")),
        ("c", Some("1")),
        ("k", None),
    ]);
    let (_, push) = exchange(&mut s, &req, &offered);
    assert_eq!(
        contents(&push.unwrap()),
        (pairs(&[("b", "2"), ("c", "1")]), names(&["gone"]))
    );
    // Nothing differing: a first request is still answered (empty), a later change is not.
    let mut s = DeltaStream::new();
    req.initial_resource_versions = [("a", "1")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let offered = offer(&[("a", Some("1"))]);
    let (_, push) = exchange(&mut s, &req, &offered);
    let push = push.expect("the first request of a type is answered");
    assert_eq!(contents(&push), (vec![], vec![]));
    assert!(s.respond(T, &offered, None, "v").is_none());
}

#[test]
fn an_ack_clears_its_pending_response() {
    let mut s = DeltaStream::new();
    let offered = offer(&[("a", Some("1"))]);
    let (_, push) = exchange(&mut s, &request(&[], &[]), &offered);
    let nonce = push.unwrap().response.nonce;
    let push2 = s
        .respond(T, &offer(&[("a", Some("2"))]), None, "v")
        .unwrap();
    assert_ne!(
        push2.response.nonce, nonce,
        "every response has its own nonce"
    );
    assert_eq!(s.subscription(T).unwrap().pending(), 2);
    let (received, push) = exchange(&mut s, &ack(&nonce), &offered);
    assert!(received.change.is_none() && push.is_none());
    match received.answer {
        Some(Answer::Ack { nonce: n, sent }) => {
            assert_eq!(n, nonce);
            assert_eq!(sent.resources, pairs(&[("a", "1")]));
        }
        other => panic!("expected an ACK, got {other:?}"),
    }
    assert_eq!(s.subscription(T).unwrap().pending(), 1);
    // The same nonce again is stale.
    assert!(matches!(
        s.receive(&ack(&nonce)).answer,
        Some(Answer::Stale { .. })
    ));
}

#[test]
fn a_nack_carries_its_error_and_what_it_refused() {
    let mut s = DeltaStream::new();
    let (_, push) = exchange(&mut s, &request(&[], &[]), &offer(&[("a", Some("1"))]));
    let nonce = push.unwrap().response.nonce;
    match s.receive(&nack(&nonce, "a: bad")).answer {
        Some(Answer::Nack {
            nonce: n,
            sent,
            error,
        }) => {
            assert_eq!(n, nonce);
            assert_eq!(sent.unwrap().resources, pairs(&[("a", "1")]));
            assert_eq!((error.code, error.message.as_str()), (3, "a: bad"));
        }
        other => panic!("expected a NACK, got {other:?}"),
    }
    assert_eq!(s.subscription(T).unwrap().pending(), 0);
    // The node keeps what it has: the refused version is not sent again until it changes.
    assert!(
        s.respond(T, &offer(&[("a", Some("1"))]), None, "v")
            .is_none()
    );
    // An unsolicited NACK (unknown or empty nonce) carries no response.
    for n in ["", "99", "x"] {
        match s.receive(&nack(n, "rolled back")).answer {
            Some(Answer::Nack {
                sent: None, error, ..
            }) => {
                assert_eq!(error.message, "rolled back")
            }
            other => panic!("expected an unsolicited NACK, got {other:?}"),
        }
    }
}

#[test]
fn a_report_is_neither_an_ack_nor_a_nack_and_leaves_pending_responses() {
    let mut s = DeltaStream::new();
    let (_, push) = exchange(&mut s, &request(&[], &[]), &offer(&[("a", Some("1"))]));
    let nonce = push.unwrap().response.nonce;
    let report = DeltaDiscoveryRequest {
        type_url: T.into(),
        error_detail: Some(weft_proto::google::rpc::Status {
            code: 0,
            message: "shadow report".into(),
            details: vec![any("figures")],
        }),
        ..Default::default()
    };
    match s.receive(&report).answer {
        Some(Answer::Report { report }) => {
            assert_eq!(report.message, "shadow report");
            assert_eq!(report.details, vec![any("figures")]);
        }
        other => panic!("expected a report, got {other:?}"),
    }
    assert_eq!(
        s.subscription(T).unwrap().pending(),
        1,
        "the response is still pending"
    );
    assert!(matches!(
        s.receive(&ack(&nonce)).answer,
        Some(Answer::Ack { .. })
    ));
    // Code 0 on a nonce is no report: it answers that response (as a NACK, the error_detail being set).
    let (_, push) = exchange(&mut s, &request(&[], &[]), &offer(&[("a", Some("2"))]));
    let _ = push;
    let with_nonce = DeltaDiscoveryRequest {
        response_nonce: "1".into(),
        ..report
    };
    assert!(!matches!(
        s.receive(&with_nonce).answer,
        Some(Answer::Report { .. })
    ));
}

#[test]
fn an_unknown_or_stale_nonce_is_ignored() {
    let mut s = DeltaStream::new();
    let (_, push) = exchange(&mut s, &request(&[], &[]), &offer(&[("a", Some("1"))]));
    assert!(push.is_some());
    for n in ["99", "not-a-number", "0"] {
        let received = s.receive(&ack(n));
        assert!(
            matches!(&received.answer, Some(Answer::Stale { nonce }) if nonce == n),
            "{n}: {:?}",
            received.answer
        );
        assert!(received.change.is_none());
    }
    assert_eq!(s.subscription(T).unwrap().pending(), 1);
    // A request without nonce or error answers nothing.
    assert!(s.receive(&request(&[], &[])).answer.is_none());
}

#[test]
fn pending_responses_are_bounded_and_the_oldest_forgotten() {
    let mut s = DeltaStream::new();
    let (_, first) = exchange(&mut s, &request(&[], &[]), &offer(&[("a", Some("0"))]));
    let first = first.unwrap().response.nonce;
    let mut last = String::new();
    for i in 1..=MAX_PENDING + 5 {
        let v = i.to_string();
        last = s
            .respond(T, &offer(&[("a", Some(&v))]), None, "v")
            .unwrap()
            .response
            .nonce;
    }
    assert_eq!(s.subscription(T).unwrap().pending(), MAX_PENDING);
    assert!(matches!(
        s.receive(&ack(&first)).answer,
        Some(Answer::Stale { .. })
    ));
    assert!(matches!(
        s.receive(&ack(&last)).answer,
        Some(Answer::Ack { .. })
    ));
    assert_eq!(s.subscription(T).unwrap().pending(), MAX_PENDING - 1);
}

#[test]
fn nothing_is_sent_when_nothing_changed() {
    let mut s = DeltaStream::new();
    let offered = offer(&[("a", Some("1")), ("k", None)]);
    exchange(&mut s, &request(&[], &[]), &offered);
    assert!(s.respond(T, &offered, None, "v2").is_none());
    // A kept name is neither sent nor removed, whatever the node has.
    assert!(
        s.respond(T, &offer(&[("a", Some("1"))]), None, "v")
            .is_none()
    );
    // A request that changes nothing is not answered.
    let (received, push) = exchange(&mut s, &request(&[], &[]), &offered);
    assert!(received.change.is_none() && push.is_none());
    // A type never requested gets nothing.
    assert!(s.respond("other", &offered, None, "v").is_none());
    assert_eq!(s.type_urls().collect::<Vec<_>>(), [T]);
    // A removal goes out once.
    let push = s.respond(T, &offer(&[("k", None)]), None, "v").unwrap();
    assert_eq!(contents(&push), (vec![], names(&["a"])));
    assert!(s.respond(T, &offer(&[("k", None)]), None, "v").is_none());
}
