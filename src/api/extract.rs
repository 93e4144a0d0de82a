//! Request extractors that answer bad input with [`ApiError`]: a JSON body whose every
//! rejection names its field, query strings and path parameters.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::domain::FieldError;

/// A JSON body, read with the path of the first field that does not fit.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or_default();
            let essence = ct.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
            if essence != "application/json" && !essence.ends_with("+json") {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "content-type {ct:?} is not JSON: send content-type: application/json"
                )));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(format!("the body is larger than {} bytes", super::BODY_LIMIT))
            } else {
                ApiError::BadRequest { message: format!("cannot read the body: {e}"), fields: vec![] }
            }
        })?;
        parse(&bytes).map(Body)
    }
}

/// `serde_json`'s message without its " at line 1 column 9" suffix.
fn bare(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// Deserialises `bytes`, sorting failures into malformed (400) and invalid values (422).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::BadRequest {
            message: "the body is empty: send a JSON object".into(),
            fields: vec![],
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = bare(&inner);
        if !inner.is_data() {
            return ApiError::BadRequest { message: format!("malformed JSON: {message}"), fields: vec![] };
        }
        let field = |path: String, message: String| FieldError { path, message };
        let join = |parent: &str, child: &str| {
            if parent == "." { child.to_owned() } else { format!("{parent}.{child}") }
        };
        if let Some(name) = quoted(&message, "unknown field `") {
            let path = if path.ends_with(&name) { path } else { join(&path, &name) };
            let f = field(path, format!("unknown field {name:?}"));
            return ApiError::BadRequest { message: format!("{}: {}", f.path, f.message), fields: vec![f] };
        }
        if let Some(name) = quoted(&message, "missing field `") {
            return ApiError::Invalid(vec![field(join(&path, &name), "is required".into())]);
        }
        ApiError::Invalid(vec![field(if path == "." { "body".into() } else { path }, message)])
    })?;
    de.end().map_err(|e| ApiError::BadRequest {
        message: format!("malformed JSON: {}", bare(&e)),
        fields: vec![],
    })?;
    Ok(value)
}

/// The name in a message such as "unknown field `foo`, expected …".
fn quoted(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// A query string, with a 400 that names the parameter on failure.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Query::<T>::try_from_uri(&parts.uri).map(|Query(v)| Params(v)).map_err(|e| ApiError::BadRequest {
            message: format!("bad query string: {}", e.body_text()),
            fields: vec![],
        })
    }
}

/// Path parameters, with a 400 in the error body that names the parameter on failure (a
/// percent-encoded value that is not UTF-8, say), where axum would answer in plain text.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                let fields = match e.kind() {
                    ErrorKind::InvalidUtf8InPathParam { key }
                    | ErrorKind::ParseErrorAtKey { key, .. }
                    | ErrorKind::DeserializeError { key, .. } => {
                        vec![FieldError { path: key.clone(), message: e.kind().to_string() }]
                    }
                    _ => vec![],
                };
                Err(ApiError::BadRequest { message: format!("bad path: {}", e.kind()), fields })
            }
            Err(e) => Err(ApiError::Internal(anyhow::anyhow!("path parameters: {}", e.body_text()))),
        }
    }
}

/// A request's `If-None-Match`, copied out of it. The request's own headers point into its
/// connection's read buffer (8 KiB), and hyper reads ahead into a second one while a request
/// is answered: a long-poll that kept them would hold both for as long as it waits.
pub struct IfNoneMatch(Option<Box<[u8]>>);

impl IfNoneMatch {
    /// The tag in `headers`, for a handler that reads the headers itself.
    pub fn of(headers: &HeaderMap) -> IfNoneMatch {
        IfNoneMatch(headers.get(header::IF_NONE_MATCH).map(|v| v.as_bytes().into()))
    }

    /// Whether the client holds the representation tagged `tag`, so that a `304 Not Modified`
    /// answers it.
    pub fn holds(&self, tag: &str) -> bool {
        self.0.as_deref() == Some(tag.as_bytes())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(IfNoneMatch::of(&parts.headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::drive::DriveSpec;

    fn fail(json: &str) -> ApiError {
        parse::<DriveSpec>(json.as_bytes()).err().unwrap()
    }

    #[test]
    fn invalid_values_name_their_field() {
        let e = fail(r#"{"sources":[{"node_scope":"placed","mount_path":"data"}]}"#);
        let ApiError::Invalid(f) = e else { panic!("{e:?}") };
        assert_eq!(f[0].path, "sources[0].mount_path");
        assert!(f[0].message.contains("not an absolute path"), "{}", f[0].message);

        let ApiError::Invalid(f) =
            fail(r#"{"sources":[{"node_scope":"placed","mount_path":"/d","mode":"Sometimes"}]}"#)
        else {
            panic!()
        };
        assert_eq!(f[0].path, "sources[0].mode");
        assert!(f[0].message.contains("unknown variant"), "{}", f[0].message);
    }

    #[test]
    fn missing_fields_are_required() {
        let ApiError::Invalid(f) = fail(r#"{"evictable":true}"#) else { panic!() };
        assert_eq!((f[0].path.as_str(), f[0].message.as_str()), ("sources", "is required"));
    }

    #[test]
    fn unknown_fields_and_bad_json_are_bad_requests() {
        let ApiError::BadRequest { fields, .. } = fail(r#"{"sources":[],"colour":"red"}"#) else { panic!() };
        assert_eq!(fields[0].path, "colour");
        assert!(matches!(fail("{"), ApiError::BadRequest { .. }));
        assert!(matches!(fail(r#"{"sources":[]} x"#), ApiError::BadRequest { .. }));
        assert!(matches!(fail(""), ApiError::BadRequest { .. }));
    }
}
