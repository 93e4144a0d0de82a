//! Paginated lists: `?limit=N&cursor=ID`, newest first, and the page object they answer with.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::error::ApiError;
use crate::domain::FieldError;
use crate::store::Page;

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` value of the previous page.
    pub cursor: Option<Uuid>,
    /// Runs only: also completed and failed runs.
    #[serde(default)]
    pub all: bool,
    /// Stream changes (newline-delimited JSON, or server-sent events with
    /// `Accept: text/event-stream`) instead of answering a page.
    #[serde(default)]
    pub watch: bool,
    /// With `watch`: the changes after this version (a list's `resource_version`); without it,
    /// every current object first, as ADDED. 410 when it is too old: list again.
    pub resource_version: Option<i64>,
}

impl ListParams {
    /// One more than asked, so the answer knows whether another page follows.
    pub fn page(&self) -> Result<Page, ApiError> {
        Ok(Page { limit: fetch_limit(self.limit)?, before: self.cursor })
    }
}

/// `?limit=N&cursor=ID` for a list inside one object, in that list's own order.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// At most this many items (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` value of the previous page.
    pub cursor: Option<Uuid>,
}

impl PageParams {
    /// The first page, as an object embeds it.
    pub const FIRST: PageParams = PageParams { limit: None, cursor: None };

    /// The rows to fetch: one more than asked, as [`ListParams::page`].
    pub fn fetch_limit(&self) -> Result<i64, ApiError> {
        fetch_limit(self.limit)
    }
}

fn fetch_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest {
            message: format!("limit must be between 1 and {MAX_LIMIT}"),
            fields: vec![FieldError {
                path: "limit".into(),
                message: format!("must be between 1 and {MAX_LIMIT}"),
            }],
        });
    }
    Ok(limit + 1)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct List<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
    /// Watch from here (`?watch=true&resource_version=…`) to miss nothing after this list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl<T> List<T> {
    /// Builds a page from rows fetched one past the page (`fetch_limit`, as [`ListParams::page`]
    /// and [`PageParams::fetch_limit`] give it): `id` gives each row's cursor.
    pub fn from_rows<R>(
        mut rows: Vec<R>,
        fetch_limit: i64,
        id: impl Fn(&R) -> Uuid,
        item: impl FnMut(R) -> T,
    ) -> List<T> {
        let more = rows.len() as i64 >= fetch_limit;
        if more {
            rows.truncate(fetch_limit as usize - 1);
        }
        let next = if more { rows.last().map(&id) } else { None };
        List { items: rows.into_iter().map(item).collect(), next, resource_version: None }
    }

    /// A whole list, in one page.
    pub fn all(items: Vec<T>) -> List<T> {
        List { items, next: None, resource_version: None }
    }

    pub fn at(mut self, version: i64) -> List<T> {
        self.resource_version = Some(version.to_string());
        self
    }
}
