//! The web console: the single-page app in `web/dist`, served at `/` by the same process as the
//! API. Release builds embed the files; debug builds read them from `web/dist` on each request.
//! The app's pages (`/drives/food101`, …) and any other unknown path a browser asks for answer
//! with `index.html`, which routes them; `/api` and `/agent` paths, and unknown paths asked for
//! by API clients (no `Accept: text/html`), keep the JSON 404. Without a built console, `/` says
//! how to build it.

use std::borrow::Cow;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "web/dist"]
#[allow_missing = true]
struct Dist;

/// Hashed file names under this folder never change content: cache them for good.
const IMMUTABLE_PREFIX: &str = "assets/";
const INDEX: &str = "index.html";

/// What the console's pages may load: only this origin; no inline script.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; \
                   frame-ancestors 'none'; form-action 'self'";

const NOT_BUILT: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Astraeus: the console is not built</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 3rem auto; padding: 0 1rem; line-height: 1.5">
<h1>Astraeus</h1>
<p>The console is not built: run <code>npm --prefix web ci &amp;&amp; npm --prefix web run build</code>, then rebuild
the server (<code>scripts/dev</code> does both when npm is installed).</p>
<p>The API is served all the same: <a href="/api/v1/drives">/api/v1</a>, its description at
<a href="/openapi.json">/openapi.json</a> and <a href="/docs/">/docs</a>.</p>
</body>
</html>
"#;

/// Whether any console file is present (false when `web/dist` was missing at build time).
pub fn is_built() -> bool {
    Dist::get(INDEX).is_some()
}

/// The first segments of the console's own pages.
const PAGES: [&str; 5] = ["drives", "runs", "machines", "settings", "sign-in"];

/// The router's fallback: console files and pages, and the JSON 404 for everything else.
pub async fn fallback(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let wanted = method == Method::GET || method == Method::HEAD;
    if !wanted || is_api_path(path) || !(is_console_path(path) || wants_html(&headers)) {
        return super::not_found(uri).await.into_response();
    }
    serve(path, &headers)
}

/// `/`, a page of the app, or one of its files.
fn is_console_path(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    first.is_empty() || PAGES.contains(&first) || first == "assets" || Dist::get(first).is_some()
}

/// A browser navigating (`Accept: text/html`), as opposed to an API client.
fn wants_html(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"))
}

/// Paths the API and the agents own: these never answer with the console.
fn is_api_path(path: &str) -> bool {
    ["/api", "/agent"].iter().any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let file = path.trim_start_matches('/');
    if !file.is_empty() && file != INDEX {
        if let Some(found) = Dist::get(file) {
            return asset(file, found, headers);
        }
        // A missing script or image is a 404, not the app: only page routes fall back to it.
        if looks_like_a_file(file) {
            return (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "not found\n",
            )
                .into_response();
        }
    }
    match Dist::get(INDEX) {
        Some(index) => asset(INDEX, index, headers),
        None => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")],
            NOT_BUILT,
        )
            .into_response(),
    }
}

/// `/assets/app.js`, `/favicon.svg`: a last segment with an extension is a file, not a page.
fn looks_like_a_file(file: &str) -> bool {
    file.starts_with(IMMUTABLE_PREFIX) || file.rsplit('/').next().is_some_and(|last| last.contains('.'))
}

fn asset(name: &str, file: rust_embed::EmbeddedFile, headers: &HeaderMap) -> Response {
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()[..16]));
    let cache =
        if name.starts_with(IMMUTABLE_PREFIX) { "public, max-age=31536000, immutable" } else { "no-cache" };
    let mime = file.metadata.mimetype();
    let content_type = if mime.starts_with("text/") || mime.ends_with("javascript") || mime.ends_with("json")
    {
        Cow::Owned(format!("{mime}; charset=utf-8"))
    } else {
        Cow::Borrowed(mime)
    };
    let mut response = if super::extract::IfNoneMatch::of(headers).holds(&etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        Response::new(Body::from(file.data))
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if name == INDEX {
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
        h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    }
    response
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_and_agent_paths_are_not_the_consoles() {
        for p in ["/api", "/api/", "/api/v1/nothing", "/agent/v1/x"] {
            assert!(is_api_path(p), "{p}");
        }
        for p in ["/", "/drives", "/drives/food101", "/apis", "/agents/x"] {
            assert!(!is_api_path(p), "{p}");
        }
    }

    #[test]
    fn the_apps_pages_are_the_consoles_and_other_paths_only_for_browsers() {
        for p in
            ["/", "/drives", "/drives/food101", "/runs/new", "/machines/gpu-01", "/settings", "/assets/x.js"]
        {
            assert!(is_console_path(p), "{p}");
        }
        for p in ["/nothing-here", "/api/v1/drives", "/docs"] {
            assert!(!is_console_path(p), "{p}");
        }
        let mut browser = HeaderMap::new();
        browser.insert(header::ACCEPT, HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"));
        assert!(wants_html(&browser));
        assert!(!wants_html(&HeaderMap::new()));
    }

    #[test]
    fn page_routes_fall_back_to_the_app_and_files_do_not() {
        assert!(looks_like_a_file("assets/index-abc123.js"));
        assert!(looks_like_a_file("favicon.svg"));
        assert!(looks_like_a_file("assets/missing"));
        assert!(!looks_like_a_file("drives/food101"));
        assert!(!looks_like_a_file("runs"));
    }

    #[test]
    fn the_root_answers_with_a_page_built_or_not() {
        let response = serve("/", &HeaderMap::new());
        assert_eq!(response.status(), StatusCode::OK);
        let ct = response.headers().get(header::CONTENT_TYPE).unwrap().to_str().unwrap();
        assert!(ct.starts_with("text/html"), "{ct}");
    }

    #[test]
    fn a_browser_holding_the_page_hears_not_modified() {
        let first = serve("/", &HeaderMap::new());
        let Some(etag) = first.headers().get(header::ETAG).cloned() else {
            // Not built: the placeholder page is never cached.
            assert!(!is_built());
            return;
        };
        let mut held = HeaderMap::new();
        held.insert(header::IF_NONE_MATCH, etag.clone());
        let again = serve("/", &held);
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::ETAG], etag);
        held.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(serve("/", &held).status(), StatusCode::OK);
    }
}
