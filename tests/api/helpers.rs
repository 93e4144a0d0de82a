//! `spawn_app`: the real router on a real socket over the test's own database, and one
//! helper per endpoint.

#![allow(dead_code)]

use std::sync::Arc;

use astraeus::api::{self, AppState};
use astraeus::auth::{Keys, issue};
use astraeus::domain::grant::Grant;
use astraeus::domain::path::AbsPath;
use astraeus::domain::role::Role;
use astraeus::domain::task::Mode;
use astraeus::store;
use chrono::Duration;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::PgPool;

pub use serde_json::json;

pub struct TestApp {
    pub address: String,
    pub api: String,
    pub db: PgPool,
    pub keys: Arc<Keys>,
    /// The PEM that `keys` were made from, for tests that forge tokens with the server's key.
    pub signing_pem: String,
    pub client: reqwest::Client,
    /// An editor token of workspace `default`.
    pub token: String,
    /// The server's state, for tests that start its loops or read its counters.
    pub state: AppState,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// `error.message` of an error body.
    pub fn message(&self) -> String {
        self.json()["error"]["message"].as_str().unwrap_or_default().to_owned()
    }

    /// `(path, message)` of each entry of `error.fields`.
    pub fn fields(&self) -> Vec<(String, String)> {
        self.json()["error"]["fields"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .map(|f| {
                        (f["path"].as_str().unwrap().to_owned(), f["message"].as_str().unwrap().to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub async fn spawn_app(db: PgPool) -> TestApp {
    spawn_app_with_keys(db, &Keys::generate_pem().unwrap(), |state| state).await
}

/// As [`spawn_app`], with the server's state set up by `configure` (its caps, say).
pub async fn spawn_app_with(db: PgPool, configure: impl FnOnce(AppState) -> AppState) -> TestApp {
    spawn_app_with_keys(db, &Keys::generate_pem().unwrap(), configure).await
}

/// A server whose key file is `signing_pem` (one or more keys, oldest first).
pub async fn spawn_app_with_keys(
    db: PgPool,
    signing_pem: &str,
    configure: impl FnOnce(AppState) -> AppState,
) -> TestApp {
    let signing_pem = signing_pem.to_owned();
    let keys = Arc::new(Keys::from_pem(&signing_pem).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let state = configure(AppState::new(db.clone(), keys.clone()));
    let router = api::router(state.clone());
    let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    let mut app = TestApp {
        api: format!("{address}/api/v1"),
        address,
        db,
        keys,
        signing_pem,
        client: reqwest::Client::new(),
        token: String::new(),
        state,
    };
    app.token = app.token_for("default", Role::Editor, false).await;
    app
}

impl TestApp {
    /// A new token of `workspace` (created when missing).
    pub async fn token_for(&self, workspace: &str, role: Role, org_admin: bool) -> String {
        self.token_with_ttl(workspace, role, org_admin, Duration::hours(1)).await
    }

    pub async fn token_with_ttl(
        &self,
        workspace: &str,
        role: Role,
        org_admin: bool,
        ttl: Duration,
    ) -> String {
        let ws = store::workspaces::ensure(&self.db, workspace).await.unwrap();
        let request = issue::Request { workspace: &ws, name: "test", role, org_admin, ttl };
        issue::issue(&self.db, &self.keys, &request).await.unwrap().1
    }

    /// Any request; `body` is sent as JSON when given. `token: None` sends no Authorization.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.api));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("the server answers");
        let status = resp.status();
        Reply { status, text: resp.text().await.unwrap() }
    }

    /// A raw body with a content type, for malformed input.
    pub async fn post_raw(&self, path: &str, content_type: &str, body: impl Into<reqwest::Body>) -> Reply {
        let resp = self
            .client
            .post(format!("{}{path}", self.api))
            .bearer_auth(&self.token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        Reply { status, text: resp.text().await.unwrap() }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, Some(&self.token), None).await
    }

    /// Joins `name` with its data location confirmed and 1 TB free there; its credential.
    pub async fn join_with_room(&self, name: &str, cpu_cores: u32) -> String {
        let credential = self.join_machine(name, cpu_cores).await;
        let admin = self.token_for("default", Role::Admin, true).await;
        let confirm = json!({"path": "/var/lib/astraeus"});
        let path = format!("/machines/{name}/data-location");
        let reply = self.request(Method::POST, &path, Some(&admin), Some(&confirm)).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        sqlx::query("UPDATE machines SET data_total_bytes = 1e12, data_free_bytes = 1e12 WHERE name = $1")
            .bind(name)
            .execute(&self.db)
            .await
            .unwrap();
        credential
    }

    /// Creates the recipe's drive and the copy a worker placed on `machine` would make, being
    /// filled there; the drive's id and the machine's.
    pub async fn recipe_drive_with_copy_on(&self, machine: &str) -> (uuid::Uuid, uuid::Uuid) {
        self.drive_with_copy_on(&recipe_drive(), machine).await
    }

    /// Creates drive `body` and a copy of it being filled on `machine`; the drive's id and the
    /// machine's.
    pub async fn drive_with_copy_on(&self, body: &Value, machine: &str) -> (uuid::Uuid, uuid::Uuid) {
        let created = self.create_drive(body).await;
        assert_eq!(created.status, 201, "{}", created.text);
        let drive = created.json()["metadata"]["uid"].as_str().unwrap().parse().unwrap();
        let id = sqlx::query_scalar("SELECT id FROM machines WHERE name = $1")
            .bind(machine)
            .fetch_one(&self.db)
            .await
            .unwrap();
        store::copies::ensure_for(&self.db, drive, id).await.unwrap();
        (drive, id)
    }

    /// A call to the agent API (`/agent/v1{path}`) with a machine's credential, as its agent
    /// makes it.
    pub async fn agent(&self, credential: &str, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let url = format!("{}/agent/v1{path}", self.address);
        let mut req = self.client.request(method, url).bearer_auth(credential);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("the server answers");
        let status = resp.status();
        Reply { status, text: resp.text().await.unwrap() }
    }

    /// A heartbeat of the machine with `credential`: a data location of `total` bytes, `used` of
    /// them by `copies`, and the fields of `extra`.
    pub async fn heartbeat(
        &self,
        credential: &str,
        total: u64,
        used: u64,
        copies: Vec<Value>,
        extra: Value,
    ) -> Reply {
        let mut body = serde_json::json!({
            "data_location": {"total_bytes": total, "used_bytes": used, "free_bytes": total - used},
            "copies": copies,
        });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        self.agent(credential, Method::POST, "/heartbeat", Some(&body)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.request(Method::POST, path, Some(&self.token), Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.request(Method::DELETE, path, Some(&self.token), None).await
    }

    /// The machine worker `name` was placed on, and the newest event on it (the placement's,
    /// right after a pass).
    pub async fn placed(&self, name: &str) -> (Value, String) {
        let worker = self.get(&format!("/workers/{name}")).await.json();
        let events = self.get(&format!("/events?object=worker/{name}")).await.json();
        (worker["status"]["machine"].clone(), events["items"][0]["message"].as_str().unwrap().to_owned())
    }

    pub async fn create_drive(&self, body: &Value) -> Reply {
        self.post("/drives", body).await
    }

    pub async fn get_drive(&self, name: &str) -> Reply {
        self.get(&format!("/drives/{name}")).await
    }

    pub async fn create_run(&self, body: &Value) -> Reply {
        self.post("/runs", body).await
    }

    pub async fn get_run(&self, name: &str) -> Reply {
        self.get(&format!("/runs/{name}")).await
    }

    /// Grants `path` to `workspace` on cluster `main`, as an organisation admin would.
    /// Grants `workspace` the folder `path` on `main`, read-write.
    pub async fn grant(&self, workspace: &str, path: &str) {
        self.grant_as(workspace, path, Mode::ReadWrite).await;
    }

    /// Replaces `workspace`'s grants on `main` with `path` in `mode`.
    pub async fn grant_as(&self, workspace: &str, path: &str, mode: Mode) {
        let ws = store::workspaces::ensure(&self.db, workspace).await.unwrap();
        let grant = Grant { path: AbsPath::parse(path).unwrap(), mode };
        let mut tx = self.db.begin().await.unwrap();
        store::grants::replace(&mut tx, ws.id, "main", &[grant]).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// The claims of a JWT, read without checking it.
pub fn claims_of(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The recipe's drive.json, as written.
pub fn recipe_drive() -> Value {
    serde_json::from_str(include_str!("../../examples/drive.json")).unwrap()
}

/// The recipe's inspect.json, as written.
pub fn recipe_run() -> Value {
    serde_json::from_str(include_str!("../../examples/inspect.json")).unwrap()
}

impl TestApp {
    /// Joins machine `name` to cluster `main` with room for `cpu_cores` one-core workers, as
    /// its agent would; its credential.
    pub async fn join_machine(&self, name: &str, cpu_cores: u32) -> String {
        let admin = self.token_for("default", Role::Admin, true).await;
        let minted =
            self.request(Method::POST, "/clusters/main/join-tokens", Some(&admin), Some(&json!({}))).await;
        assert_eq!(minted.status, 201, "{}", minted.text);
        let body = json!({
            "join_token": minted.json()["token"],
            "name": name,
            "capacity": {"cpu_cores": cpu_cores, "memory_bytes": 1u64 << 40, "gpus": 0},
        });
        let joined =
            self.client.post(format!("{}/agent/v1/join", self.address)).json(&body).send().await.unwrap();
        assert_eq!(joined.status(), 200);
        joined.json::<Value>().await.unwrap()["credential"].as_str().unwrap().to_owned()
    }
}
