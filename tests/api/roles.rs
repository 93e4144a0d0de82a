//! Who may do what: the role matrix over every mutating route, reads for viewers, and
//! workspaces that cannot see into each other.

use std::fmt::Write;

use astraeus::domain::role::Role;
use reqwest::Method;
use serde_json::Value;

use crate::helpers::*;

/// The callers of the matrix, from least to most allowed, all of workspace `default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Viewer,
    Editor,
    Admin,
    OrgAdmin,
}

const EVERYONE: [Who; 4] = [Who::Viewer, Who::Editor, Who::Admin, Who::OrgAdmin];

impl Who {
    fn slug(self) -> &'static str {
        match self {
            Who::Viewer => "viewer",
            Who::Editor => "editor",
            Who::Admin => "admin",
            Who::OrgAdmin => "org",
        }
    }

    async fn token(self, app: &TestApp) -> String {
        match self {
            Who::Viewer => app.token_for("default", Role::Viewer, false).await,
            Who::Editor => app.token_for("default", Role::Editor, false).await,
            Who::Admin => app.token_for("default", Role::Admin, false).await,
            Who::OrgAdmin => app.token_for("default", Role::Admin, true).await,
        }
    }
}

/// One request of the matrix: the least caller allowed to make it, and its answer then.
struct Case {
    method: Method,
    path: String,
    body: Option<Value>,
    least: Who,
    ok: u16,
    /// A GET (as the harness's editor) that tells whether the request took effect, with its
    /// status after an allowed and after a refused request.
    probe: Option<(String, u16, u16)>,
}

fn drive_named(name: &str) -> Value {
    let mut d = recipe_drive();
    d["metadata"]["name"] = json!(name);
    d
}

fn run_named(name: &str) -> Value {
    let mut r = recipe_run();
    r["metadata"]["name"] = json!(name);
    r
}

fn secret_named(name: &str) -> Value {
    json!({"metadata": {"name": name}, "data": {"HF_TOKEN": "hf_x"}})
}

#[track_caller]
fn created(reply: Reply) -> Value {
    assert_eq!(reply.status, 201, "setup: {}", reply.text);
    reply.json()
}

/// Makes what the cases of `who` act on, as the harness's editor, and returns the cases.
async fn cases_for(app: &TestApp, who: Who) -> Vec<Case> {
    let s = who.slug();
    created(app.create_drive(&drive_named(&format!("del-{s}"))).await);
    created(app.create_drive(&drive_named(&format!("keep-{s}"))).await);
    created(app.create_run(&run_named(&format!("del-{s}"))).await);
    created(app.post("/secrets", &secret_named(&format!("del-{s}"))).await);
    let victim =
        claims_of(&app.token_for("default", Role::Viewer, false).await)["jti"].as_str().unwrap().to_owned();
    let org = Who::OrgAdmin.token(app).await;
    let join = app.request(Method::POST, "/clusters/main/join-tokens", Some(&org), Some(&json!({}))).await;
    let join = created(join)["id"].as_str().unwrap().to_owned();

    let case = |method: Method, path: String, body: Option<Value>, least: Who, ok: u16| Case {
        method,
        path,
        body,
        least,
        ok,
        probe: None,
    };
    let probe = |mut c: Case, path: String, allowed: u16, refused: u16| {
        c.probe = Some((path, allowed, refused));
        c
    };
    use Method as M;
    vec![
        probe(
            case(M::POST, "/drives".into(), Some(drive_named(&format!("new-{s}"))), Who::Editor, 201),
            format!("/drives/new-{s}"),
            200,
            404,
        ),
        probe(
            case(M::DELETE, format!("/drives/del-{s}"), None, Who::Editor, 204),
            format!("/drives/del-{s}"),
            404,
            200,
        ),
        // Drives are immutable: an editor is told so (405), a viewer is refused first.
        probe(
            case(
                M::PUT,
                format!("/drives/keep-{s}"),
                Some(drive_named(&format!("keep-{s}"))),
                Who::Editor,
                405,
            ),
            format!("/drives/keep-{s}"),
            200,
            200,
        ),
        case(M::PATCH, format!("/drives/keep-{s}"), Some(json!({"metadata": {}})), Who::Editor, 405),
        probe(
            case(M::POST, "/runs".into(), Some(run_named(&format!("new-{s}"))), Who::Editor, 201),
            format!("/runs/new-{s}"),
            200,
            404,
        ),
        probe(
            case(M::DELETE, format!("/runs/del-{s}"), None, Who::Editor, 204),
            format!("/runs/del-{s}"),
            404,
            200,
        ),
        probe(
            case(M::POST, "/secrets".into(), Some(secret_named(&format!("new-{s}"))), Who::Editor, 201),
            format!("/secrets/new-{s}"),
            200,
            404,
        ),
        probe(
            case(M::DELETE, format!("/secrets/del-{s}"), None, Who::Editor, 204),
            format!("/secrets/del-{s}"),
            404,
            200,
        ),
        case(M::POST, "/tokens".into(), Some(json!({"name": "ci", "role": "viewer"})), Who::Admin, 201),
        case(M::DELETE, format!("/tokens/{victim}"), None, Who::Admin, 200),
        case(M::POST, "/workspaces".into(), Some(json!({"name": format!("ws-{s}")})), Who::OrgAdmin, 201),
        case(M::POST, "/clusters/main/join-tokens".into(), Some(json!({})), Who::OrgAdmin, 201),
        case(M::DELETE, format!("/clusters/main/join-tokens/{join}"), None, Who::OrgAdmin, 200),
        // No machine has joined: an organisation admin learns that, anyone less is refused first
        // (a machine is every workspace's, so no workspace admin may point its copies anywhere).
        case(
            M::POST,
            "/machines/gpu-01/data-location".into(),
            Some(json!({"path": "/data"})),
            Who::OrgAdmin,
            404,
        ),
        case(M::POST, "/machines/gpu-01/cordon".into(), Some(json!({})), Who::OrgAdmin, 404),
        case(M::POST, "/machines/gpu-01/uncordon".into(), Some(json!({})), Who::OrgAdmin, 404),
        case(M::POST, "/machines/gpu-01/drain".into(), Some(json!({})), Who::OrgAdmin, 404),
        case(
            M::PUT,
            "/machines/gpu-01/transfer-limits".into(),
            Some(json!({"upload_bytes_per_second": 100_000_000})),
            Who::OrgAdmin,
            404,
        ),
        case(M::DELETE, "/machines/gpu-01".into(), None, Who::OrgAdmin, 404),
        case(M::POST, "/clusters".into(), Some(json!({"name": format!("cluster-{s}")})), Who::OrgAdmin, 201),
        case(
            M::PUT,
            "/clusters/main/origin-fills".into(),
            Some(json!({"max_concurrent": 4})),
            Who::OrgAdmin,
            200,
        ),
        case(
            M::PUT,
            "/workspaces/default/clusters/main/host-paths".into(),
            Some(json!({"paths": [format!("/data/{s}")]})),
            Who::OrgAdmin,
            200,
        ),
    ]
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn each_role_may_change_exactly_what_it_is_allowed_to(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    created(app.create_drive(&recipe_drive()).await); // the runs mount food101
    let mut wrong = String::new();
    let mut seen = 0;
    for who in EVERYONE {
        let token = who.token(&app).await;
        for c in cases_for(&app, who).await {
            let allowed = who >= c.least;
            let reply = app.request(c.method.clone(), &c.path, Some(&token), c.body.as_ref()).await;
            let case = format!("{who:?} {} {}", c.method, c.path);
            seen += 1;
            let right = if allowed {
                reply.status == c.ok
            } else {
                reply.status == 403 && reply.json()["error"]["code"] == "forbidden"
            };
            if !right {
                let want = if allowed { c.ok.to_string() } else { "403 forbidden".to_owned() };
                writeln!(wrong, "{case}: want {want}, got {} {}", reply.status, reply.text).unwrap();
            }
            if let Some((probe, after_allowed, after_refused)) = &c.probe {
                let want = if allowed { after_allowed } else { after_refused };
                let got = app.get(probe).await.status;
                if got != *want {
                    writeln!(wrong, "{case}: afterwards GET {probe} should answer {want}, got {got}")
                        .unwrap();
                }
            }
        }
    }
    assert_eq!(seen, 4 * 22);
    assert!(wrong.is_empty(), "the role matrix is wrong:\n{wrong}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_refused_token_change_leaves_the_token_working(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let victim = app.token_for("default", Role::Viewer, false).await;
    let id = claims_of(&victim)["jti"].as_str().unwrap().to_owned();
    let reply = app.request(Method::DELETE, &format!("/tokens/{id}"), Some(&app.token), None).await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    assert_eq!(app.request(Method::GET, "/drives", Some(&victim), None).await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_viewer_reads_everything_in_its_workspace(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    created(app.create_drive(&recipe_drive()).await);
    created(app.create_run(&recipe_run()).await);
    created(app.post("/secrets", &secret_named("hf")).await);
    let viewer = app.token_for("default", Role::Viewer, false).await;
    let reads = [
        "/drives",
        "/drives?limit=1",
        "/drives/food101",
        "/runs",
        "/runs?all=true",
        "/runs/inspect-food101",
        "/runs/inspect-food101/workers",
        "/workers/inspect-food101-0",
        "/secrets",
        "/secrets/hf",
        "/clusters",
    ];
    for path in reads {
        let reply = app.request(Method::GET, path, Some(&viewer), None).await;
        assert_eq!(reply.status, 200, "viewer GET {path}: {}", reply.text);
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn reads_of_tokens_and_the_organisation_need_their_roles(db: sqlx::PgPool) {
    // Tokens are an admin's business, workspaces and grants an organisation admin's.
    let app = spawn_app(db).await;
    let reads = [
        ("/tokens", Who::Admin),
        ("/workspaces", Who::OrgAdmin),
        ("/workspaces/default/clusters/main/host-paths", Who::OrgAdmin),
    ];
    for who in EVERYONE {
        let token = who.token(&app).await;
        for (path, least) in reads {
            let reply = app.request(Method::GET, path, Some(&token), None).await;
            let want = if who >= least { 200 } else { 403 };
            assert_eq!(reply.status, want, "{who:?} GET {path}: {}", reply.text);
        }
    }
}

/// Every answer workspace B gets about A's objects, in order: the first five are reads.
async fn b_asks_about_a(
    app: &TestApp,
    b_editor: &str,
    b_admin: &str,
    a_token_id: &str,
) -> Vec<(String, Reply)> {
    // Runs of B that mount A's drive, or are given A's secret, as if they were B's.
    let mounts_a_drive = run_named("b-reads-food101");
    let mut uses_a_secret = run_named("b-uses-hf");
    uses_a_secret["spec"]["task_template"]["datavolume_refs"] = json!([]);
    uses_a_secret["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]);
    let asks = [
        (Method::GET, "/drives/food101".to_owned(), b_editor, None),
        (Method::GET, "/runs/inspect-food101".to_owned(), b_editor, None),
        (Method::GET, "/runs/inspect-food101/workers".to_owned(), b_editor, None),
        (Method::GET, "/workers/inspect-food101-0".to_owned(), b_editor, None),
        (Method::GET, "/secrets/hf".to_owned(), b_editor, None),
        (Method::PUT, "/drives/food101".to_owned(), b_editor, None),
        (Method::PATCH, "/drives/food101".to_owned(), b_editor, None),
        (Method::DELETE, "/runs/inspect-food101".to_owned(), b_editor, None),
        (Method::DELETE, "/drives/food101".to_owned(), b_editor, None),
        (Method::DELETE, "/secrets/hf".to_owned(), b_editor, None),
        (Method::DELETE, format!("/tokens/{a_token_id}"), b_admin, None),
        (Method::POST, "/runs".to_owned(), b_editor, Some(mounts_a_drive)),
        (Method::POST, "/runs".to_owned(), b_editor, Some(uses_a_secret)),
    ];
    let mut answers = vec![];
    for (method, path, token, body) in asks {
        let reply = app.request(method.clone(), &path, Some(token), body.as_ref()).await;
        answers.push((format!("{method} {path}"), reply));
    }
    answers
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn another_workspace_cannot_tell_an_object_exists(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    created(app.create_drive(&recipe_drive()).await);
    created(app.create_run(&recipe_run()).await);
    created(app.post("/secrets", &secret_named("hf")).await);
    let a_victim = app.token_for("default", Role::Viewer, false).await;
    let a_token_id = claims_of(&a_victim)["jti"].as_str().unwrap().to_owned();
    let b_editor = app.token_for("b", Role::Editor, false).await;
    let b_admin = app.token_for("b", Role::Admin, false).await;

    let while_there = b_asks_about_a(&app, &b_editor, &b_admin, &a_token_id).await;
    for (ask, reply) in &while_there {
        let (status, code) = if ask.starts_with("POST") { (422, "invalid") } else { (404, "not_found") };
        assert_eq!(reply.status, status, "B {ask}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], code, "B {ask}: {}", reply.text);
    }
    // B's attempts changed nothing in A.
    for path in ["/drives/food101", "/runs/inspect-food101", "/workers/inspect-food101-0", "/secrets/hf"] {
        assert_eq!(app.get(path).await.status, 200, "A GET {path} after B's deletes");
    }
    assert_eq!(app.request(Method::GET, "/drives", Some(&a_victim), None).await.status, 200);

    // A deletes everything; B's answers are then, byte for byte, what they were.
    assert_eq!(app.delete("/runs/inspect-food101").await.status, 204);
    assert_eq!(app.delete("/drives/food101").await.status, 204);
    assert_eq!(app.delete("/secrets/hf").await.status, 204);
    let id = uuid::Uuid::parse_str(&a_token_id).unwrap();
    sqlx::query("DELETE FROM tokens WHERE id = $1").bind(id).execute(&app.db).await.unwrap();

    let gone = b_asks_about_a(&app, &b_editor, &b_admin, &a_token_id).await;
    for ((ask, before), (_, after)) in while_there.iter().zip(&gone) {
        assert_eq!(before.status, after.status, "B {ask}");
        assert_eq!(before.text, after.text, "B {ask}: the answer must not depend on A's object");
    }
    // And A's own answers for the names it no longer has are the same bytes too.
    let a_asks = [
        "/drives/food101",
        "/runs/inspect-food101",
        "/runs/inspect-food101/workers",
        "/workers/inspect-food101-0",
        "/secrets/hf",
    ];
    for (path, (ask, b)) in a_asks.iter().zip(&while_there) {
        let a = app.get(path).await;
        assert_eq!((a.status, &a.text), (b.status, &b.text), "A GET {path} vs B {ask}");
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn another_workspaces_lists_do_not_show_its_objects(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    created(app.create_drive(&recipe_drive()).await);
    created(app.create_run(&recipe_run()).await);
    created(app.post("/secrets", &secret_named("hf")).await);
    let b_editor = app.token_for("b", Role::Editor, false).await;
    let b_admin = app.token_for("b", Role::Admin, false).await;
    let lists = [("/drives", &b_editor), ("/runs?all=true", &b_editor), ("/secrets", &b_editor)];
    for (path, token) in lists {
        let reply = app.request(Method::GET, path, Some(token), None).await;
        assert_eq!(reply.status, 200, "B GET {path}: {}", reply.text);
        assert_eq!(reply.json()["items"], json!([]), "B GET {path}");
    }
    let tokens = app.request(Method::GET, "/tokens", Some(&b_admin), None).await;
    assert_eq!(tokens.status, 200, "{}", tokens.text);
    let a_token = claims_of(&app.token)["jti"].clone();
    let items = tokens.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2, "only B's two tokens: {}", tokens.text);
    assert!(items.iter().all(|t| t["id"] != a_token), "{}", tokens.text);

    // B may use the same names for its own objects, which stay apart from A's.
    let b_drive = app.request(Method::POST, "/drives", Some(&b_editor), Some(&recipe_drive())).await;
    assert_eq!(b_drive.status, 201, "{}", b_drive.text);
    assert_eq!(b_drive.json()["metadata"]["namespace"], "b");
    assert_ne!(b_drive.json()["metadata"]["uid"], app.get_drive("food101").await.json()["metadata"]["uid"]);
    let a_drives = app.get("/drives").await.json()["items"].as_array().unwrap().len();
    assert_eq!(a_drives, 1);
}

/// The statuses the OpenAPI document gives for `method` on `path` (under /api/v1), whose
/// `{param}` segments match any segment.
fn documented(spec: &Value, method: &Method, path: &str) -> Vec<String> {
    let path = format!("/api/v1{}", path.split('?').next().unwrap());
    let segments: Vec<_> = path.split('/').collect();
    let (_, item) = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(template, _)| {
            let t: Vec<_> = template.split('/').collect();
            t.len() == segments.len() && t.iter().zip(&segments).all(|(t, s)| t.starts_with('{') || t == s)
        })
        .unwrap_or_else(|| panic!("{path} is not in the document"));
    let op = &item[method.as_str().to_lowercase()];
    op["responses"].as_object().map(|r| r.keys().cloned().collect()).unwrap_or_default()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn every_answer_of_the_role_matrix_is_documented(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let spec = astraeus::api::openapi();
    let spec: Value = serde_json::from_str(&spec.to_json().unwrap()).unwrap();
    created(app.create_drive(&recipe_drive()).await);
    let mut undocumented = String::new();
    for who in EVERYONE {
        let token = who.token(&app).await;
        for c in cases_for(&app, who).await {
            let reply = app.request(c.method.clone(), &c.path, Some(&token), c.body.as_ref()).await;
            let status = reply.status.as_u16().to_string();
            if !documented(&spec, &c.method, &c.path).contains(&status) {
                writeln!(undocumented, "{who:?} {} {}: {status} {}", c.method, c.path, reply.text).unwrap();
            }
        }
    }
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not give:\n{undocumented}");
}

/// The operations of the OpenAPI document under /api/v1, as (method, path template).
fn operations(spec: &Value) -> Vec<(Method, String)> {
    let mut ops = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let path = path.strip_prefix("/api/v1").unwrap_or(path).to_owned();
            ops.push((method.to_uppercase().parse().unwrap(), path));
        }
    }
    ops
}

/// Whether the concrete `path` (query aside) is an instance of `template`.
fn instance_of(path: &str, template: &str) -> bool {
    let p: Vec<_> = path.split('?').next().unwrap().split('/').collect();
    let t: Vec<_> = template.split('/').collect();
    p.len() == t.len() && t.iter().zip(&p).all(|(t, p)| t.starts_with('{') || t == p)
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_role_matrix_covers_every_operation_that_changes_something(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let spec: Value = serde_json::from_str(&astraeus::api::openapi().to_json().unwrap()).unwrap();
    created(app.create_drive(&recipe_drive()).await); // the runs mount food101
    let cases = cases_for(&app, Who::Viewer).await;
    let missing: Vec<String> = operations(&spec)
        .into_iter()
        .filter(|(m, _)| *m != Method::GET)
        .filter(|(m, t)| !cases.iter().any(|c| c.method == *m && instance_of(&c.path, t)))
        .map(|(m, t)| format!("{m} {t}"))
        .collect();
    assert!(missing.is_empty(), "operations the role matrix does not try: {missing:?}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn every_operation_refuses_a_request_without_a_token_or_with_a_forged_one(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let spec: Value = serde_json::from_str(&astraeus::api::openapi().to_json().unwrap()).unwrap();
    // Signed by a key this server does not hold, for a workspace it knows.
    let forged = {
        let other = astraeus::auth::Keys::from_pem(&astraeus::auth::Keys::generate_pem().unwrap()).unwrap();
        let ws = astraeus::store::workspaces::ensure(&app.db, "default").await.unwrap();
        let request = astraeus::auth::issue::Request {
            workspace: &ws,
            name: "forged",
            role: Role::Admin,
            org_admin: true,
            ttl: chrono::Duration::hours(1),
        };
        astraeus::auth::issue::issue(&app.db, &other, &request).await.unwrap().1
    };
    let mut wrong = String::new();
    let ops = operations(&spec);
    for (method, template) in &ops {
        let path: String = template
            .split('/')
            .map(|s| if s.starts_with('{') { "main" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let body = (method != Method::GET && method != Method::DELETE).then(|| json!({}));
        for token in [None, Some(forged.as_str())] {
            let reply = app.request(method.clone(), &path, token, body.as_ref()).await;
            if reply.status != 401 || reply.json()["error"]["code"] != "unauthorized" {
                let who = if token.is_some() { "forged token" } else { "no token" };
                writeln!(wrong, "{method} {path} with {who}: {} {}", reply.status, reply.text).unwrap();
            }
        }
    }
    assert!(ops.len() >= 30, "the document lists {} operations", ops.len());
    assert!(wrong.is_empty(), "answers other than 401:\n{wrong}");
}
