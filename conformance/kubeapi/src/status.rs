//! API errors as the API server reports them: a `metav1.Status` (`kind: Status`, `apiVersion: v1`, `status: Failure`,
//! `message`, `reason`, `details`, `code`) with the HTTP status of its `code`.

use serde_json::{Value, json};

use crate::resource::Resource;

/// A failed API request: what the stand-in answers with a `metav1.Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The `metav1.StatusReason` (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, ...).
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
    /// `details` (`name`, `group`, `kind`), when the error is about one object.
    pub details: Option<Value>,
}

/// `details` naming one object; the core group's empty `group` is omitted, as the API server does.
pub(crate) fn details(res: Resource, name: &str) -> Value {
    let mut details = json!({"name": name, "kind": res.plural()});
    if !res.group().is_empty() {
        details["group"] = res.group().into();
    }
    details
}

impl ApiError {
    /// 404 NotFound for an object.
    pub fn not_found(res: Resource, name: &str) -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", res.qualified()),
            details: Some(details(res, name)),
        }
    }

    /// 404 NotFound for a path the stand-in does not serve.
    pub fn no_route() -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: "the server could not find the requested resource".into(),
            details: Some(json!({})),
        }
    }

    /// 409 AlreadyExists on a create.
    pub fn already_exists(res: Resource, name: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", res.qualified()),
            details: Some(details(res, name)),
        }
    }

    /// 409 Conflict: a write's `metadata.resourceVersion` is not the stored one.
    pub fn conflict(res: Resource, name: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your \
                 changes to the latest version and try again",
                res.qualified()
            ),
            details: Some(details(res, name)),
        }
    }

    /// 410 Gone, reason Expired: a resourceVersion or continue token older than the history.
    pub fn expired(message: String) -> ApiError {
        ApiError {
            code: 410,
            reason: "Expired",
            message,
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: String) -> ApiError {
        ApiError {
            code: 400,
            reason: "BadRequest",
            message,
            details: None,
        }
    }

    /// 422 Invalid: the object fails validation.
    pub fn invalid(res: Resource, name: &str, message: &str) -> ApiError {
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("{} \"{name}\" is invalid: {message}", res.qualified()),
            details: Some(details(res, name)),
        }
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str) -> ApiError {
        ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!(
                "the server does not allow this method on the requested resource: {method}"
            ),
            details: Some(json!({})),
        }
    }

    /// 415 UnsupportedMediaType: a PATCH other than a JSON merge patch.
    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json (got {content_type:?})"
            ),
            details: None,
        }
    }

    /// The `metav1.Status` the API server answers with.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        status
    }
}
