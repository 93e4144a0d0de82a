//! The REST client: one request helper per verb, the API's error body turned into [`CliError`].

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::Value;

use super::config::Target;
use super::error::{CliError, Result};

/// A plain request may take this long; streamed logs have no limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Answers of 429 waited out before giving up.
const MAX_RETRIES: u32 = 3;

pub struct Client {
    http: reqwest::Client,
    /// `http://host:port/api/v1`, without `/` at the end.
    pub api: String,
    token: Option<String>,
}

impl Client {
    pub fn new(target: &Target) -> Result<Client> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("astra/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CliError::failed(format!("cannot start the HTTP client: {e}")))?;
        Ok(Client { http, api: target.api.clone(), token: target.token.clone() })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api)
    }

    /// Sends the request and returns the answer when it is a success; the API's error otherwise.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        stream: bool,
    ) -> Result<Response> {
        let token = self.token.as_deref().ok_or_else(|| {
            CliError::failed(
                "no token: set ASTRAEUS_TOKEN, pass --token, or run `astra auth login --with-token`",
            )
        })?;
        let url = self.url(path);
        let mut retries = 0;
        loop {
            let mut req = self.http.request(method.clone(), &url).bearer_auth(token).query(query);
            if !stream {
                req = req.timeout(REQUEST_TIMEOUT);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let resp = req.send().await.map_err(|e| CliError::http(&self.api, &e))?;
            if resp.status().is_success() {
                return Ok(resp);
            }
            // Over the token's rate limit: wait as long as the API asks, a few times.
            let wait = retry_after(&resp).filter(|_| retries < MAX_RETRIES);
            match wait {
                Some(wait) if resp.status() == StatusCode::TOO_MANY_REQUESTS => {
                    retries += 1;
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(api_error(resp).await),
            }
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.json(self.send(Method::GET, path, &[], None, false).await?).await
    }

    /// `None` when the API answers 404.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.json(self.send(Method::POST, path, &[], Some(body), false).await?).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Value> {
        self.json(self.send(Method::PUT, path, &[], Some(body), false).await?).await
    }

    pub async fn delete(&self, path: &str) -> Result<()> {
        self.send(Method::DELETE, path, &[], None, false).await.map(drop)
    }

    /// Every item of a list, following `next` from page to page. The page size is the API's:
    /// not every list takes `limit`.
    pub async fn list(&self, path: &str, query: &[(&str, String)]) -> Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = query.to_vec();
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let page = self.json(self.send(Method::GET, path, &q, None, false).await?).await?;
            if let Some(list) = page.get("items").and_then(Value::as_array) {
                items.extend(list.iter().cloned());
            }
            match page.get("next").and_then(Value::as_str) {
                Some(next) if cursor.as_deref() != Some(next) => cursor = Some(next.to_owned()),
                _ => return Ok(items),
            }
        }
    }

    /// A streamed answer (logs), read by the caller chunk by chunk.
    pub async fn stream(&self, path: &str, query: &[(&str, String)]) -> Result<Response> {
        self.send(Method::GET, path, query, None, true).await
    }

    async fn json(&self, resp: Response) -> Result<Value> {
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        let bytes = resp.bytes().await.map_err(|e| CliError::http(&self.api, &e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CliError::failed(format!("the API at {} did not answer with JSON: {e}", self.api)))
    }
}

/// The `Retry-After` of an answer, in seconds, when it is at most 10 s.
fn retry_after(resp: &Response) -> Option<Duration> {
    let seconds: u64 =
        resp.headers().get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    (seconds <= 10).then(|| Duration::from_secs(seconds.max(1)))
}

/// `{"error": {"code", "message", "fields"}}`, or the status and the start of the body when the
/// answer has another shape (a proxy, another server).
async fn api_error(resp: Response) -> CliError {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let body: Option<Value> = serde_json::from_str(&text).ok();
    let error = body.as_ref().and_then(|b| b.get("error"));
    match error.and_then(|e| e.get("message")).and_then(Value::as_str) {
        Some(message) => {
            let code = error.and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or_default();
            let fields = error
                .and_then(|e| e.get("fields"))
                .and_then(Value::as_array)
                .map(|fs| {
                    fs.iter()
                        .map(|f| (super::output::text(&f["path"]), super::output::text(&f["message"])))
                        .collect()
                })
                .unwrap_or_default();
            CliError::Api {
                status: status.as_u16(),
                code: code.to_owned(),
                message: message.to_owned(),
                fields,
            }
        }
        None => {
            let start: String = text.trim().chars().take(200).collect();
            let message = if start.is_empty() { status.to_string() } else { format!("{status}: {start}") };
            CliError::Api { status: status.as_u16(), code: String::new(), message, fields: vec![] }
        }
    }
}
