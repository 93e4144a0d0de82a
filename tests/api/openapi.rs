//! The OpenAPI document (committed, served and current), the docs page, health checks, and
//! the answers for routes and methods that do not exist.

use std::path::PathBuf;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

const REGENERATE: &str = "cargo run -- openapi --out openapi/openapi.json";

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json")
}

/// The document as `astraeus openapi` writes it.
fn generated() -> String {
    astraeus::api::openapi().to_pretty_json().unwrap() + "\n"
}

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let path = committed_path();
    let want = generated();
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have == want {
        return;
    }
    let first = have
        .lines()
        .zip(want.lines())
        .position(|(h, w)| h != w)
        .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
    let line = |text: &str| text.lines().nth(first).unwrap_or("<end of file>").to_owned();
    panic!(
        "{} is stale (or missing): the API changed and the document did not.\n\
         Regenerate it with `{REGENERATE}` (or run this test with UPDATE_OPENAPI=1) and commit it.\n\
         First difference, line {}:\n  committed: {}\n  generated: {}",
        path.display(),
        first + 1,
        line(&have),
        line(&want),
    );
}

#[test]
fn the_openapi_document_is_the_same_every_time() {
    assert_eq!(generated(), generated());
}

async fn get_root(app: &TestApp, path: &str) -> (StatusCode, String, String) {
    let resp = app.client.get(format!("{}{path}", app.address)).send().await.unwrap();
    let status = resp.status();
    let content_type =
        resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, content_type, resp.text().await.unwrap())
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_served_openapi_document_is_the_generated_one(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let (status, content_type, text) = get_root(&app, "/openapi.json").await;
    assert_eq!(status, 200, "{text}");
    assert!(content_type.starts_with("application/json"), "{content_type}");
    let served: Value = serde_json::from_str(&text).unwrap();
    let generated: Value = serde_json::from_str(&generated()).unwrap();
    assert_eq!(served, generated);
    // Spot checks that the document describes this API.
    assert!(served["paths"]["/api/v1/drives"]["post"].is_object(), "{text}");
    assert!(served["paths"]["/api/v1/tokens/{id}"]["delete"].is_object(), "{text}");
    assert_eq!(served["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_docs_page_is_served_without_the_internet(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let (status, content_type, html) = get_root(&app, "/docs/").await;
    assert_eq!(status, 200, "{html}");
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(html.to_lowercase().contains("swagger"), "{html}");
    // The page's scripts and styles come from the server itself, not a CDN.
    for line in html.lines().filter(|l| l.contains("<script") || l.contains("<link")) {
        assert!(!line.contains("http://") && !line.contains("https://"), "loads from elsewhere: {line}");
    }
    for asset in ["/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/docs/swagger-initializer.js"] {
        let (status, _, body) = get_root(&app, asset).await;
        assert_eq!(status, 200, "{asset}");
        assert!(!body.is_empty(), "{asset} is empty");
    }
    let (_, _, init) = get_root(&app, "/docs/swagger-initializer.js").await;
    assert!(init.contains("/openapi.json"), "the page reads this server's document: {init}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn health_and_readiness_answer_ok(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for path in ["/healthz", "/readyz"] {
        let (status, _, body) = get_root(&app, path).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["status"], "ok", "{path}");
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_unknown_route_answers_404_with_the_error_body(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for path in ["/api/v1/nothing-here", "/api/v2/drives", "/nothing-here", "/api/v1/drives/food101/extra"] {
        let resp =
            app.client.get(format!("{}{path}", app.address)).bearer_auth(&app.token).send().await.unwrap();
        let reply = Reply { status: resp.status(), text: resp.text().await.unwrap() };
        assert_eq!(reply.status, 404, "{path}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "not_found", "{path}: {}", reply.text);
        assert!(reply.message().contains(path), "{path}: {}", reply.message());
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_wrong_method_on_a_known_route_answers_405_with_the_error_body(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let cases = [
        ("PATCH", "/api/v1/runs", "GET,POST"),
        ("PUT", "/api/v1/secrets/hf", "DELETE,GET"),
        ("POST", "/api/v1/workers/w-0", "GET"),
        ("DELETE", "/api/v1/clusters", "GET,POST"),
    ];
    for (method, path, allow) in cases {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = app
            .client
            .request(method.clone(), format!("{}{path}", app.address))
            .bearer_auth(&app.token)
            .send()
            .await
            .unwrap();
        let allowed = resp.headers().get("allow").map(|v| v.to_str().unwrap().to_owned());
        let reply = Reply { status: resp.status(), text: resp.text().await.unwrap() };
        assert_eq!(reply.status, 405, "{method} {path}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "method_not_allowed", "{method} {path}: {}", reply.text);
        assert!(reply.message().contains(method.as_str()), "{method} {path}: {}", reply.message());
        let mut allowed: Vec<String> = allowed
            .unwrap_or_default()
            .split(',')
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .collect();
        allowed.sort();
        allowed.retain(|m| m != "HEAD");
        assert_eq!(allowed.join(","), allow, "{method} {path}: the Allow header names the methods");
    }
}

/// `(METHOD path, operation)` of every operation in the document.
fn operations(spec: &Value) -> Vec<(String, &Value)> {
    let mut ops = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops.push((format!("{} {path}", method.to_uppercase()), op));
        }
    }
    ops
}

#[test]
fn every_operation_documents_the_answers_of_the_shared_extractors() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let mut missing = Vec::new();
    for (name, op) in operations(&spec) {
        let mut want = Vec::new();
        if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
            want.extend(["401", "429"]);
        }
        let query = op["parameters"].as_array().into_iter().flatten().any(|p| p["in"] == "query");
        let body = op.get("requestBody").is_some();
        if query || body {
            want.push("400");
        }
        if body {
            want.extend(["413", "415"]);
        }
        missing.extend(
            want.into_iter().filter(|s| op["responses"].get(*s).is_none()).map(|s| format!("{name}: {s}")),
        );
    }
    assert!(missing.is_empty(), "undocumented answers: {missing:#?}");
    // The shared answers say how to come back: a 401 names the scheme, a 429 when to retry.
    let responses = &spec["components"]["responses"];
    assert!(responses["Unauthorized"]["headers"]["WWW-Authenticate"].is_object(), "{responses}");
    assert!(responses["TooManyRequests"]["headers"]["Retry-After"].is_object(), "{responses}");
}

#[test]
fn every_change_documents_its_refusal() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let undocumented: Vec<_> = operations(&spec)
        .into_iter()
        .filter(|(name, op)| !name.starts_with("GET ") && op["responses"].get("403").is_none())
        .map(|(name, _)| name)
        .collect();
    assert!(undocumented.is_empty(), "changes a viewer may not make, without a 403: {undocumented:#?}");
}

#[test]
fn a_machines_resources_have_a_schema_apart_from_a_tasks_requested_resources() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let schemas = &spec["components"]["schemas"];
    // Nothing allocated on a machine is 0 bytes, which a task's request may not be.
    let machine = &schemas["MachineResources"];
    assert_eq!(
        schemas["MachineSpec"]["properties"]["capacity"]["$ref"],
        "#/components/schemas/MachineResources"
    );
    assert_eq!(
        schemas["MachineStatus"]["properties"]["allocated"]["$ref"],
        "#/components/schemas/MachineResources"
    );
    assert!(machine["properties"]["memory_bytes"].get("minimum").is_none(), "{machine}");
    assert_eq!(schemas["Resources"]["properties"]["memory_bytes"]["minimum"], 1);
    assert!(schemas["Resources"]["properties"]["node_selection"].is_object());
}
