//! The stand-in's HTTP/1.1 side: routes Kubernetes API paths to the store, one verb per request, and streams
//! watches as chunked newline-delimited JSON.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::resource::Resource;
use crate::selector::Selector;
use crate::status::{ApiError, details};
use crate::store::{Part, Store};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

pub(crate) fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    store
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a path names.
enum Target {
    /// A collection: all namespaces (`None`) or one.
    Collection(Resource, Option<String>),
    /// One object, or its `status` subresource.
    Object(Resource, String, String, Part),
}

fn route(path: &str) -> Option<Target> {
    // `/api/{version}/...` is the core group; `/apis/{group}/{version}/...` every other.
    let (group, version, rest) = if let Some(rest) = path.strip_prefix("/api/") {
        let (version, rest) = rest.split_once('/')?;
        ("", version, rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let (group, rest) = rest.split_once('/')?;
        let (version, rest) = rest.split_once('/')?;
        (group, version, rest)
    };
    let segs: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let res = |plural: &str| Resource::from_path(group, version, plural);
    match segs.as_slice() {
        [plural] => Some(Target::Collection(res(plural)?, None)),
        ["namespaces", ns, plural] => {
            Some(Target::Collection(res(plural)?, Some((*ns).to_owned())))
        }
        ["namespaces", ns, plural, name] => Some(Target::Object(
            res(plural)?,
            (*ns).to_owned(),
            (*name).to_owned(),
            Part::Main,
        )),
        ["namespaces", ns, plural, name, "status"] => {
            let r = res(plural)?;
            r.has_status()
                .then(|| Target::Object(r, (*ns).to_owned(), (*name).to_owned(), Part::Status))
        }
        _ => None,
    }
}

/// Percent-decodes a query component as `application/x-www-form-urlencoded` (`+` is a space), as clients such as
/// kube-rs encode selectors (`labelSelector=app%3Dweb`).
fn decode(component: &str) -> Result<String, ApiError> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("invalid percent-encoding in {component:?}"))
                    })?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("the query {component:?} is not UTF-8")))
}

/// A request's query parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Result<Query, ApiError> {
        query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                Ok((decode(k)?, decode(v)?))
            })
            .collect::<Result<_, _>>()
            .map(Query)
    }

    /// A parameter's value (the first, if repeated).
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The label selector; a field selector is refused (the stand-in does not serve them).
    fn selector(&self) -> Result<Selector, ApiError> {
        if self.get("fieldSelector").is_some_and(|f| !f.is_empty()) {
            return Err(ApiError::bad_request(
                "fieldSelector is not served by the API server stand-in".into(),
            ));
        }
        Selector::parse(self.get("labelSelector").unwrap_or(""))
    }
}

fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("1" | "true"))
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, &err.status())
}

async fn read_json(req: Request<Incoming>) -> Result<Value, ApiError> {
    let bytes = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

fn parse_rv(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}"))),
    }
}

/// The verb the API server's authorizer would name a request with.
fn verb(method: &Method, target: &Target, watch: bool) -> &'static str {
    match (method, target) {
        (&Method::GET, Target::Collection(..)) if watch => "watch",
        (&Method::GET, Target::Collection(..)) => "list",
        (&Method::GET, Target::Object(..)) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    }
}

pub(crate) async fn handle(store: Arc<Mutex<Store>>, req: Request<Incoming>) -> Response<Body> {
    match serve(store, req).await {
        Ok(resp) => resp,
        Err(err) => error_response(&err),
    }
}

async fn serve(
    store: Arc<Mutex<Store>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let query = Query::parse(req.uri().query().unwrap_or(""))?;
    let Some(target) = route(req.uri().path()) else {
        return Err(ApiError::no_route());
    };
    let watch = truthy(query.get("watch"));
    let method = req.method().clone();
    lock(&store).count(verb(&method, &target, watch));
    match (method, target) {
        (Method::GET, Target::Collection(res, ns)) if watch => {
            let from = parse_rv(query.get("resourceVersion"))?;
            let bookmarks = truthy(query.get("allowWatchBookmarks"));
            let selector = query.selector()?;
            let timeout = query
                .get("timeoutSeconds")
                .map(|t| {
                    t.parse::<u64>().map_err(|_| {
                        ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}"))
                    })
                })
                .transpose()?;
            let rx = lock(&store).watch(res, ns.as_deref(), selector, from, bookmarks);
            Ok(watch_response(rx, timeout.map(Duration::from_secs)))
        }
        (Method::GET, Target::Collection(res, ns)) => {
            let limit = query
                .get("limit")
                .map(|l| {
                    l.parse::<usize>()
                        .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))
                })
                .transpose()?;
            let selector = query.selector()?;
            let list =
                lock(&store).list(res, ns.as_deref(), &selector, limit, query.get("continue"))?;
            Ok(json_response(200, &list))
        }
        (Method::POST, Target::Collection(res, Some(ns))) => {
            let body = read_json(req).await?;
            let obj = lock(&store).create(res, &ns, body)?;
            Ok(json_response(201, &obj))
        }
        (Method::GET, Target::Object(res, ns, name, _)) => {
            Ok(json_response(200, &lock(&store).get(res, &ns, &name)?))
        }
        (Method::PUT, Target::Object(res, ns, name, part)) => {
            let body = read_json(req).await?;
            let obj = lock(&store).update(res, &ns, &name, part, body)?;
            Ok(json_response(200, &obj))
        }
        (Method::PATCH, Target::Object(res, ns, name, part)) => {
            let content_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            if content_type.split(';').next().map(str::trim) != Some("application/merge-patch+json")
            {
                return Err(ApiError::unsupported_media_type(&content_type));
            }
            let patch = read_json(req).await?;
            let obj = lock(&store).patch(res, &ns, &name, part, &patch)?;
            Ok(json_response(200, &obj))
        }
        (Method::DELETE, Target::Object(res, ns, name, Part::Main)) => {
            let obj = lock(&store).delete(res, &ns, &name)?;
            if res.delete_returns_object() {
                // Custom resources and Pods answer a delete with the deleted object.
                return Ok(json_response(200, &obj));
            }
            // Other built-in resources (Leases, Secrets, ConfigMaps) answer with a Success Status naming it.
            let mut details = details(res, &name);
            details["uid"] = obj["metadata"]["uid"].clone();
            let status = serde_json::json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            });
            Ok(json_response(200, &status))
        }
        (method, _) => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

/// A watch's response: 200, `Transfer-Encoding: chunked`, one JSON event per line, ending when the store drops the
/// watch (an ERROR sent, the server stopping) or after `timeout`.
fn watch_response(rx: mpsc::UnboundedReceiver<Value>, timeout: Option<Duration>) -> Response<Body> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let events = stream::unfold(rx, move |mut rx| async move {
        let next = match deadline {
            Some(deadline) => tokio::select! {
                ev = rx.recv() => ev,
                () = tokio::time::sleep_until(deadline) => None,
            },
            None => rx.recv().await,
        }?;
        let mut line = next.to_string().into_bytes();
        line.push(b'\n');
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), rx))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(events)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}
