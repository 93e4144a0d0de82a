//! One error type for every route, answered as `{"error": {"code", "message", "fields"}}`.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::FieldError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest { message: String, fields: Vec<FieldError> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("invalid request")]
    Invalid(Vec<FieldError>),
    #[error("too many requests from this token: retry in {} ms", .0.as_millis())]
    TooManyRequests(std::time::Duration),
    /// Too many streams held open (by this token, or on this replica).
    #[error("{0}")]
    TooManyStreams(String),
    /// Too many unauthenticated requests from one client address.
    #[error("too many requests from this address: retry in {} ms", .0.as_millis())]
    TooManyFromAddress(std::time::Duration),
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("the server is at its limit of {0} requests in progress: retry in 1 s")]
    Overloaded(usize),
    #[error("internal error")]
    Internal(anyhow::Error),
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `bad_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `conflict`, `gone`, `too_many_requests`, `payload_too_large`, `unsupported_media_type`,
    /// `invalid`, `unavailable`, `overloaded`, `internal`.
    pub code: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldError>,
}

impl ApiError {
    pub fn not_found(kind: &str, name: &str) -> ApiError {
        ApiError::NotFound(format!("{kind} {name} not found"))
    }

    /// A query parameter that cannot be taken: 400, naming it.
    pub fn bad_param(path: &str, message: String) -> ApiError {
        ApiError::BadRequest {
            message: format!("{path}: {message}"),
            fields: vec![FieldError { path: path.into(), message }],
        }
    }

    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::Invalid(vec![FieldError { path: path.into(), message: message.into() }])
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Gone(_) => (StatusCode::GONE, "gone"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
            ApiError::TooManyRequests(_) | ApiError::TooManyStreams(_) | ApiError::TooManyFromAddress(_) => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_requests")
            }
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        if is_transient(&e) { ApiError::Unavailable(e) } else { ApiError::Internal(e.into()) }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        match e.downcast::<sqlx::Error>() {
            Ok(db) => db.into(),
            Err(e) => ApiError::Internal(e),
        }
    }
}

/// Errors that a retry may not meet: the database unreachable, restarting, or this session
/// ended by it (SQLSTATE classes 08 and 57P, too many connections, a serialization failure or
/// a deadlock victim).
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || code.starts_with("57P") || matches!(&*code, "53300" | "40001" | "40P01")
        }),
        _ => false,
    }
}

/// Turns a violation of the named constraint into a 409 with `message`; any other error as usual.
pub fn on_constraint(
    constraint: &'static str,
    message: impl FnOnce() -> String,
) -> impl FnOnce(sqlx::Error) -> ApiError {
    move |e| match &e {
        sqlx::Error::Database(db) if db.constraint() == Some(constraint) => ApiError::Conflict(message()),
        _ => e.into(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        let retry_after = match &self {
            ApiError::TooManyRequests(wait) | ApiError::TooManyFromAddress(wait) => {
                Some(wait.as_secs().max(1).to_string())
            }
            // A stream's place frees when another stream ends, which nothing here can foretell.
            ApiError::TooManyStreams(_) => Some("5".to_owned()),
            ApiError::Overloaded(_) => Some("1".to_owned()),
            _ => None,
        };
        let (message, fields) = match self {
            ApiError::BadRequest { message, fields } => (message, fields),
            ApiError::Invalid(fields) => {
                let first = fields.first().map(|f| format!("{}: {}", f.path, f.message)).unwrap_or_default();
                (first, fields)
            }
            ApiError::Unavailable(e) => {
                tracing::warn!(error = %e, "database unavailable");
                ("the service is unavailable, try again shortly".into(), vec![])
            }
            ApiError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                ("internal error".into(), vec![])
            }
            other => (other.to_string(), vec![]),
        };
        let body = Json(ErrorBody { error: ErrorDetail { code, message, fields } });
        if let Some(seconds) = retry_after {
            return (status, [(header::RETRY_AFTER, seconds)], body).into_response();
        }
        if status == StatusCode::UNAUTHORIZED {
            // RFC 6750: say which scheme the API expects.
            return (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response();
        }
        (status, body).into_response()
    }
}
