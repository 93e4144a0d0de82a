//! Field-level rejections: where a value sits in the request, and why it was refused.

use serde::Serialize;
use utoipa::ToSchema;

/// One rejected field, e.g. `spec.sources[0].mode`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

/// Collects every problem of a request before any of it is written.
#[derive(Debug, Default)]
pub struct Problems(Vec<FieldError>);

impl Problems {
    pub fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError { path: path.into(), message: message.into() });
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(())` when nothing was found, the list of problems otherwise.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0) }
    }
}
