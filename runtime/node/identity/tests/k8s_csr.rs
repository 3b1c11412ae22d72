//! The Kubernetes CSR API client against a local HTTP server that speaks `certificates.k8s.io/v1`: create,
//! approval and signing (`status.certificate`), denial, deletion, and a signer that answers for the wrong identity.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use weft_identity::{
    CaClient, CertRequest, Error, K8sCsrClient, K8sCsrConfig, KubeClient, LocalCa, ManagerConfig,
    SecretManager, SpiffeId,
};

const PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Default)]
struct Api {
    objects: HashMap<String, Value>,
    created: Vec<Value>,
    deleted: Vec<String>,
    gets: usize,
    n: u32,
}

struct Fake {
    url: String,
    api: Arc<Mutex<Api>>,
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    token: std::path::PathBuf,
}

fn reply(status: u16, body: Value) -> Result<http::Response<Full<Bytes>>, Infallible> {
    Ok(http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap())
}

/// The approver and signer: on the first GET after creation, approve (or deny, for the `deny` signer) and sign.
fn progress(ca: &LocalCa, obj: &mut Value) {
    if obj["status"].get("conditions").is_some() {
        return;
    }
    let signer = obj["spec"]["signerName"].as_str().unwrap().to_owned();
    if signer.ends_with("/deny") {
        obj["status"] = json!({"conditions": [{"type": "Denied", "status": "True", "reason": "NotOnThisNode", "message": "workload is not on the requesting node"}]});
        return;
    }
    let csr = String::from_utf8(
        B64.decode(obj["spec"]["request"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let want: SpiffeId = obj["metadata"]["annotations"]["weft.dev/identity"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let chain = if signer.ends_with("/wrong-san") {
        let other = SpiffeId::new(want.trust_domain(), want.namespace(), "impostor").unwrap();
        ca.sign_csr_with_san(&other, &csr, Duration::from_secs(600))
            .unwrap()
    } else {
        ca.sign_csr(&want, &csr, Duration::from_secs(600)).unwrap()
    };
    // A signer returns the leaf (and intermediates), not the root.
    obj["status"] = json!({
        "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved", "message": "test approver"}],
        "certificate": B64.encode(chain[0].as_bytes()),
    });
}

async fn handle(
    api: Arc<Mutex<Api>>,
    ca: Arc<LocalCa>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    if req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        != Some("Bearer node-token")
    {
        return reply(
            401,
            json!({"kind": "Status", "status": "Failure", "message": "Unauthorized", "code": 401}),
        );
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut api = api.lock().unwrap();
    match (method.as_str(), path.strip_prefix(PATH)) {
        ("POST", Some("")) => {
            let mut obj: Value = serde_json::from_slice(&body).unwrap();
            api.created.push(obj.clone());
            api.n += 1;
            let name = format!(
                "{}{:05}",
                obj["metadata"]["generateName"].as_str().unwrap(),
                api.n
            );
            obj["metadata"]["name"] = json!(name);
            obj["metadata"]["uid"] = json!(format!("uid-{}", api.n));
            obj["status"] = json!({});
            api.objects.insert(name, obj.clone());
            reply(201, obj)
        }
        ("GET", Some(name)) => {
            api.gets += 1;
            let Some(obj) = api.objects.get_mut(name.trim_start_matches('/')) else {
                return reply(
                    404,
                    json!({"kind": "Status", "message": "not found", "code": 404}),
                );
            };
            // First poll: still pending; afterwards approved and signed.
            if obj["metadata"].get("seen").is_some() {
                progress(&ca, obj);
            }
            obj["metadata"]["seen"] = json!(true);
            reply(200, obj.clone())
        }
        ("DELETE", Some(name)) => {
            let name = name.trim_start_matches('/').to_owned();
            api.objects.remove(&name);
            api.deleted.push(name);
            reply(200, json!({"kind": "Status", "status": "Success"}))
        }
        _ => reply(
            404,
            json!({"kind": "Status", "message": "not found", "code": 404}),
        ),
    }
}

async fn fake() -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    weft_identity::ca::write_root(&ca_dir, "cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = Arc::new(LocalCa::from_dir(&ca_dir).unwrap());
    let token = dir.path().join("token");
    std::fs::write(&token, "node-token\n").unwrap();
    let api = Arc::new(Mutex::new(Api::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let a = api.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (a, ca) = (a.clone(), ca.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| handle(a.clone(), ca.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Fake {
        url,
        api,
        root: ca_dir.join("root-cert.pem"),
        token,
        _dir: dir,
    }
}

fn client(f: &Fake, signer: &str) -> K8sCsrClient {
    K8sCsrClient::new(K8sCsrConfig {
        api: KubeClient::new(&f.url, None, Some(f.token.clone())).unwrap(),
        signer_name: signer.into(),
        root_cert: f.root.clone(),
        poll_interval: Duration::from_millis(20),
        wait: Duration::from_secs(5),
    })
}

fn id() -> SpiffeId {
    "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_a_csr_waits_for_the_certificate_and_deletes_it() {
    let f = fake().await;
    let m = SecretManager::new(
        Arc::new(client(&f, "example.com/weft")),
        ManagerConfig::default(),
    );
    let cert = m.fetch(&id()).await.unwrap();
    assert_eq!(cert.identity(), &id());
    let api = f.api.lock().unwrap();
    assert_eq!(api.created.len(), 1);
    let spec = &api.created[0]["spec"];
    assert_eq!(api.created[0]["apiVersion"], "certificates.k8s.io/v1");
    assert_eq!(api.created[0]["kind"], "CertificateSigningRequest");
    assert_eq!(spec["signerName"], "example.com/weft");
    assert_eq!(
        spec["usages"],
        json!([
            "digital signature",
            "key encipherment",
            "client auth",
            "server auth"
        ])
    );
    assert!(spec["expirationSeconds"].as_u64().unwrap() >= 600);
    let csr = String::from_utf8(B64.decode(spec["request"].as_str().unwrap()).unwrap()).unwrap();
    assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
    assert!(api.gets >= 2, "polled until signed");
    assert_eq!(api.deleted.len(), 1);
    assert!(api.objects.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_csr_or_a_wrong_san_is_refused() {
    let f = fake().await;
    let req = CertRequest {
        identity: id(),
        csr_pem: weft_identity::cert::new_csr(&id()).unwrap().csr_pem,
        validity: Duration::from_secs(60),
    };
    let err = client(&f, "example.com/deny").sign(&req).await.unwrap_err();
    assert!(matches!(err, Error::CaRefused { .. }), "{err}");
    assert!(
        err.to_string().contains("Denied")
            && err.to_string().contains("not on the requesting node"),
        "{err}"
    );
    let err = client(&f, "example.com/wrong-san")
        .sign(&req)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongIdentity { .. }), "{err}");
    // Both objects were cleaned up.
    assert!(f.api.lock().unwrap().objects.is_empty());
    // A bad token: the API's 401 is a refusal, not a hang.
    std::fs::write(&f.token, "wrong").unwrap();
    let err = client(&f, "example.com/weft").sign(&req).await.unwrap_err();
    assert!(err.to_string().contains("HTTP 401"), "{err}");
}
