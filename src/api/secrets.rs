//! `/secrets`: values go in and are never read back; only their keys are shown.

use std::collections::{BTreeMap, HashSet};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::AppState;
use super::caller::Caller;
use super::error::{ApiError, ErrorBody, on_constraint};
use super::extract::{Body, Params, Path};
use super::list::{List, ListParams};
use super::watch::{self, Kind};
use crate::auth::seal;
use crate::domain::meta::MetaInput;
use crate::domain::role::Role;
use crate::domain::task::{TaskTemplate, is_env_name};
use crate::domain::{FieldError, Name, Problems};
use crate::store::{self, secrets::SecretRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list, create)).routes(routes!(get, delete))
}

const MAX_KEYS: usize = 256;
const MAX_VALUE: usize = 64 * 1024;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretInput {
    pub metadata: MetaInput,
    /// Environment variable name → value, given to the workers that reference the secret.
    pub data: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Secret {
    pub metadata: SecretMeta,
    /// The variable names the secret sets; values are never returned.
    pub keys: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SecretMeta {
    pub name: String,
    pub namespace: String,
    pub uid: Uuid,
    pub created_at: DateTime<Utc>,
}

fn to_object(namespace: &str, r: SecretRecord) -> Secret {
    Secret {
        metadata: SecretMeta {
            name: r.name,
            namespace: namespace.to_owned(),
            uid: r.id,
            created_at: r.created_at,
        },
        keys: r.keys,
    }
}

/// 422 for each secret the task at `at` (e.g. `spec.task_template`) names, in `secret_refs` or
/// as its `image_pull_secret`, that does not exist.
pub async fn check_refs(
    app: &AppState,
    caller: &Caller,
    task: &TaskTemplate,
    at: &str,
) -> Result<(), ApiError> {
    let mut named: Vec<(String, String)> = task
        .secret_refs
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("{at}.secret_refs[{i}].name"), s.name.to_string()))
        .collect();
    if let Some(pull) = &task.image_pull_secret {
        named.push((format!("{at}.image_pull_secret"), pull.to_string()));
    }
    let names: Vec<String> = named.iter().map(|(_, n)| n.clone()).collect();
    let found: HashSet<String> =
        store::secrets::existing(&app.db, caller.workspace_id, &names).await?.into_iter().collect();
    let missing: Vec<FieldError> = named
        .into_iter()
        .filter(|(_, n)| !found.contains(n))
        .map(|(path, n)| FieldError { path, message: format!("secret {n} does not exist") })
        .collect();
    if missing.is_empty() { Ok(()) } else { Err(ApiError::Invalid(missing)) }
}

/// Create a secret.
#[utoipa::path(post, path = "/secrets", tag = "secrets", request_body = SecretInput,
    responses(
        (status = 201, description = "Created", body = Secret),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "An invalid value", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    Body(input): Body<SecretInput>,
) -> Result<(StatusCode, Json<Secret>), ApiError> {
    caller.require(Role::Editor, "create secrets")?;
    let mut p = Problems::default();
    input.metadata.check(&mut p);
    if input.data.is_empty() || input.data.len() > MAX_KEYS {
        p.add("data", format!("must hold between 1 and {MAX_KEYS} keys"));
    }
    for (k, v) in &input.data {
        if !is_env_name(k) {
            p.add(
                format!("data.{k}"),
                "is not a variable name: use letters, digits and '_', not starting with a digit",
            );
        } else if v.len() > MAX_VALUE || v.contains('\0') {
            p.add(format!("data.{k}"), format!("value must be at most {MAX_VALUE} bytes, without NUL"));
        }
    }
    p.finish().map_err(ApiError::Invalid)?;
    let keys: Vec<String> = input.data.keys().cloned().collect();
    let plain = serde_json::to_vec(&input.data).map_err(anyhow::Error::from)?;
    let name = input.metadata.name.as_str();
    let sealed = seal::seal(&app.keys, seal::Row { workspace: caller.workspace_id, name }, &plain);
    let record = store::secrets::insert(&app.db, caller.workspace_id, name, &keys, &sealed)
        .await
        .map_err(on_constraint("secrets_workspace_name_key", || format!("secret {name} already exists")))?;
    Ok((StatusCode::CREATED, Json(to_object(&caller.workspace, record))))
}

/// List the workspace's secrets (names and keys only).
#[utoipa::path(get, path = "/secrets", tag = "secrets", params(ListParams),
    responses(
        (status = 200, description = "A page, or with `watch=true` a stream of changes", content(
            (List<Secret> = "application/json"),
            (String = "application/x-ndjson"),
            (String = "text/event-stream"),
        )),
        (status = 410, description = "With `watch=true`: `resource_version` is older than the retained changes", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Params(params): Params<ListParams>,
) -> Result<Response, ApiError> {
    let page = params.page()?;
    if params.watch {
        let initial = match params.resource_version {
            Some(_) => vec![],
            None => store::secrets::list(&app.db, caller.workspace_id, watch::ALL).await?,
        };
        let names = initial.into_iter().rev().map(|r| r.name).collect();
        return watch::stream(app, caller, Kind::Secrets, params.resource_version, names, &headers).await;
    }
    let version = store::changes::latest(&app.db).await?;
    let rows = store::secrets::list(&app.db, caller.workspace_id, page).await?;
    let list = List::from_rows(rows, page.limit, |r| r.id, |r| to_object(&caller.workspace, r));
    Ok(Json(list.at(version)).into_response())
}

/// Read a secret's keys.
#[utoipa::path(get, path = "/secrets/{name}", tag = "secrets", params(("name" = String, Path)),
    responses((status = 200, body = Secret), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Secret>, ApiError> {
    load(&app, &caller, &name).await.map(Json)
}

pub async fn load(app: &AppState, caller: &Caller, name: &str) -> Result<Secret, ApiError> {
    let found = match Name::parse(name) {
        Ok(n) => store::secrets::get(&app.db, caller.workspace_id, n.as_str()).await?,
        Err(_) => None,
    };
    let record = found.ok_or_else(|| ApiError::not_found("secret", name))?;
    Ok(to_object(&caller.workspace, record))
}

/// Delete a secret.
#[utoipa::path(delete, path = "/secrets/{name}", tag = "secrets", params(("name" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "A viewer token", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A drive or run uses the secret", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(Role::Editor, "delete secrets")?;
    let Ok(secret) = Name::parse(&name) else { return Err(ApiError::not_found("secret", &name)) };
    if let Some(user) = store::secrets::user(&app.db, caller.workspace_id, secret.as_str()).await? {
        return Err(ApiError::Conflict(format!("secret {name} is used by {user}: delete it first")));
    }
    if !store::secrets::delete(&app.db, caller.workspace_id, secret.as_str()).await? {
        return Err(ApiError::not_found("secret", &name));
    }
    Ok(StatusCode::NO_CONTENT)
}
