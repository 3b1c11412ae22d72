//! The certificate service: authenticate the caller, authorize the identity it asks for (the caller's own; or,
//! for a trusted node agent only, one that a workload the mesh config places on the caller's node has), sign, and
//! write an audit line, with its reason, for every decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tonic::{Request, Response, Status};
use weft_identity::{LocalCa, SpiffeId};
use weft_proto::istio_ca::istio_certificate_service_server::IstioCertificateService;
use weft_proto::istio_ca::{IstioCertificateRequest, IstioCertificateResponse};
use weft_state::StateStore;

use crate::auth::{AuthError, Authenticator, Caller};
use crate::ca::node_accounts::TrustedNodeAccounts;

/// A deliberate misbehaviour, to test that clients refuse bad answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Sign the caller's key for another identity than the one asked for.
    WrongSan,
    /// Sign with a throwaway CA while presenting the real root.
    BadChain,
}

/// Counters (for tests and benches that run the service in process).
#[derive(Debug, Default)]
pub struct CaCounters {
    /// Requests received.
    pub requests: AtomicU64,
    /// Certificates issued.
    pub issued: AtomicU64,
    /// Requests refused (authentication or authorization).
    pub refused: AtomicU64,
}

/// The service's configuration.
#[derive(Debug)]
pub struct CaService {
    /// The signer.
    pub ca: Arc<LocalCa>,
    /// Trust domain of the identities it signs.
    pub trust_domain: String,
    /// How callers are authenticated.
    pub auth: Authenticator,
    /// The node-agent accounts that may ask for identities other than their own (empty: none may).
    pub trusted_node_accounts: TrustedNodeAccounts,
    /// Where workloads are placed (the mesh config, watched).
    pub workloads: Arc<StateStore>,
    /// Lifetime when the request names none.
    pub default_validity: Duration,
    /// Longest lifetime granted.
    pub max_validity: Duration,
    /// Misbehaviour, for tests.
    pub fault: Option<Fault>,
    /// Throwaway signer for `Fault::BadChain`.
    pub rogue: Option<Arc<LocalCa>>,
    /// Counters.
    pub counters: Arc<CaCounters>,
}

/// One audit line: who asked for what, and the verdict.
fn audit(cluster: &str, caller: Option<&Caller>, identity: &str, allowed: bool, reason: &str) {
    let node = caller.and_then(|c| c.node.as_deref()).unwrap_or("-");
    let who = caller
        .map(|c| c.identity.to_string())
        .unwrap_or_else(|| "-".into());
    if allowed {
        tracing::info!(target: "audit", decision = "allow", node, caller = %who, identity, cluster, reason, "certificate request allowed");
    } else {
        tracing::warn!(target: "audit", decision = "deny", node, caller = %who, identity, cluster, reason, "certificate request denied");
    }
}

impl CaService {
    /// Whether `caller` may hold `wanted`; the reason either way. Its own identity, always; another one only when
    /// the caller is a trusted node agent (istiod's rule: impersonation is for node proxies alone) and a workload on
    /// the caller's node has that identity.
    pub fn authorize(&self, caller: &Caller, wanted: &SpiffeId) -> Result<String, String> {
        if wanted == &caller.identity {
            return Ok("the caller's own identity".into());
        }
        if wanted.trust_domain() != self.trust_domain {
            return Err(format!(
                "trust domain {} is not this CA's ({})",
                wanted.trust_domain(),
                self.trust_domain
            ));
        }
        let account = format!(
            "{}/{}",
            caller.identity.namespace(),
            caller.identity.service_account()
        );
        if self.trusted_node_accounts.is_empty() {
            return Err(format!(
                "no node accounts are trusted (--trusted-node-accounts), so {account} may only ask for its own identity"
            ));
        }
        if !self.trusted_node_accounts.trusts(&caller.identity) {
            return Err(format!(
                "{account} is not a trusted node account (--trusted-node-accounts {}), so it may only ask for its \
                 own identity",
                self.trusted_node_accounts
            ));
        }
        let Some(node) = caller.node.as_deref() else {
            return Err(
                "the caller's token is bound to no node, so it may only ask for its own identity"
                    .into(),
            );
        };
        let state = self.workloads.current();
        let want = wanted.to_string();
        if state.local_workloads(node).any(|w| w.spiffe_id() == want) {
            Ok(format!(
                "trusted node agent {account}, and a workload on node {node} has this identity"
            ))
        } else {
            Err(format!("no workload on node {node} has this identity"))
        }
    }

    async fn handle(
        &self,
        req: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.counters.requests.fetch_add(1, Relaxed);
        let cluster = req
            .metadata()
            .get("clusterid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let token = crate::auth::request_bearer(&req);
        let body = req.into_inner();
        let asked =
            weft_proto::struct_string(body.metadata.as_ref(), weft_proto::IMPERSONATED_IDENTITY)
                .map(str::to_owned);
        let asked_text = asked.clone().unwrap_or_else(|| "-".into());
        let refuse = |caller: Option<&Caller>, identity: &str, status: Status| {
            self.counters.refused.fetch_add(1, Relaxed);
            audit(&cluster, caller, identity, false, status.message());
            Err(status)
        };
        let Some(token) = token else {
            return refuse(
                None,
                &asked_text,
                Status::unauthenticated("no bearer token"),
            );
        };
        let caller = match self.auth.authenticate(&token).await {
            Ok(c) => c,
            Err(e @ AuthError::Unavailable(_)) => {
                return refuse(None, &asked_text, Status::unavailable(e.to_string()));
            }
            Err(e) => return refuse(None, &asked_text, Status::unauthenticated(e.to_string())),
        };
        let wanted = match asked.as_deref() {
            None => caller.identity.clone(),
            Some(s) => match s.parse::<SpiffeId>() {
                Ok(id) => id,
                Err(e) => {
                    return refuse(Some(&caller), s, Status::invalid_argument(e.to_string()));
                }
            },
        };
        let wanted_text = wanted.to_string();
        let reason = match self.authorize(&caller, &wanted) {
            Ok(r) => r,
            Err(why) => {
                let node = caller.node.as_deref().unwrap_or("-");
                let msg =
                    format!("node {node} may not have a certificate for {wanted_text}: {why}");
                return refuse(Some(&caller), &wanted_text, Status::permission_denied(msg));
            }
        };
        let validity = match u64::try_from(body.validity_duration) {
            Ok(0) | Err(_) => self.default_validity,
            Ok(s) => Duration::from_secs(s).min(self.max_validity),
        };
        let signed = match self.fault {
            None => self.ca.sign_csr(&wanted, &body.csr, validity),
            Some(Fault::WrongSan) => {
                let other = SpiffeId::new(wanted.trust_domain(), wanted.namespace(), "impostor")
                    .map_err(|e| Status::internal(e.to_string()))?;
                self.ca.sign_csr_with_san(&other, &body.csr, validity)
            }
            Some(Fault::BadChain) => {
                let rogue = self
                    .rogue
                    .as_ref()
                    .ok_or_else(|| Status::internal("no rogue CA"))?;
                rogue
                    .sign_csr(&wanted, &body.csr, validity)
                    .map(|mut chain| {
                        chain.truncate(1);
                        chain.extend(weft_identity::CaClient::trust_roots(self.ca.as_ref()));
                        chain
                    })
            }
        };
        match signed {
            Ok(chain) => {
                self.counters.issued.fetch_add(1, Relaxed);
                audit(&cluster, Some(&caller), &wanted_text, true, &reason);
                Ok(Response::new(IstioCertificateResponse {
                    cert_chain: chain,
                }))
            }
            Err(e) => refuse(
                Some(&caller),
                &wanted_text,
                Status::invalid_argument(e.to_string()),
            ),
        }
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.handle(request).await
    }
}
