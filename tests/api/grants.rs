//! Host-path grants: their modes, and how a narrowed grant holds for the next worker.

use astraeus::domain::role::Role;
use astraeus::domain::task::Mode;
use reqwest::Method;
use serde_json::{Value, json};

use crate::drives::assert_refused;
use crate::helpers::*;

const GRANTS: &str = "/workspaces/default/clusters/main/host-paths";

/// A drive over `path` on a shared filesystem, mounted at /data with `mode`.
fn shared(name: &str, path: &str, mode: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"sources": [{"node_scope": "shared", "path": path, "mount_path": "/data", "mode": mode}]}
    })
}

/// A run of one worker that mounts `refs`.
fn mounting(name: &str, refs: Value) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["task_template"]["datavolume_refs"] = refs;
    run
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn grants_are_paths_alone_read_only_or_paths_with_a_mode(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let put = |body: Value| {
        let (app, admin) = (&app, admin.clone());
        async move { app.request(Method::PUT, GRANTS, Some(&admin), Some(&body)).await }
    };
    // The shape grants had before they had a mode still works, and grants ReadOnly.
    let reply = put(json!({"paths": ["/scratch/ml", {"path": "/lustre", "mode": "ReadWrite"}]})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let granted =
        json!([{"path": "/lustre", "mode": "ReadWrite"}, {"path": "/scratch/ml", "mode": "ReadOnly"}]);
    assert_eq!(reply.json()["paths"], granted);
    assert_eq!(app.request(Method::GET, GRANTS, Some(&admin), None).await.json()["paths"], granted);

    let reply = put(json!({"paths": [{"path": "/data", "mode": "rw"}]})).await;
    assert_refused(&reply, 422, "paths[0]", "an absolute path, or");
    let reply = put(json!({"paths": ["/data", {"path": "/data", "mode": "ReadWrite"}]})).await;
    assert_refused(&reply, 422, "paths[1]", "/data is given twice");
    // Nothing half-written: the grants are those of the last accepted request.
    assert_eq!(app.request(Method::GET, GRANTS, Some(&admin), None).await.json()["paths"], granted);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_read_write_mount_under_a_read_only_grant_is_refused_naming_the_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.grant_as("default", "/scratch", Mode::ReadOnly).await;
    let reply = app.create_drive(&shared("scratch-rw", "/scratch/ml", "ReadWrite")).await;
    assert_refused(&reply, 422, "spec.sources[0].mode", "under /scratch, granted ReadOnly");
    assert_eq!(app.get_drive("scratch-rw").await.status, 404);

    let reply = app.create_drive(&shared("scratch", "/scratch/ml", "ReadOnly")).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let reply = app.create_run(&mounting("writer", json!([{"name": "scratch", "mode": "ReadWrite"}]))).await;
    assert_refused(&reply, 422, "spec.task_template.datavolume_refs[0].mode", "granted ReadOnly");
    assert_eq!(app.get_run("writer").await.status, 404);
    let reply = app.create_run(&mounting("reader", json!([{"name": "scratch"}]))).await;
    assert_eq!(reply.status, 201, "{}", reply.text);

    // A drive made read-write under a grant later made read-only: its default mode is refused.
    app.grant_as("default", "/lustre", Mode::ReadWrite).await;
    assert_eq!(app.create_drive(&shared("lustre", "/lustre/x", "ReadWrite")).await.status, 201);
    app.grant_as("default", "/lustre", Mode::ReadOnly).await;
    let reply = app.create_run(&mounting("later", json!([{"name": "lustre"}]))).await;
    assert_refused(
        &reply,
        422,
        "spec.task_template.datavolume_refs[0].mode",
        "under /lustre, granted ReadOnly",
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_worker_whose_host_path_is_no_longer_granted_fails_with_the_reason_and_is_never_placed(
    db: sqlx::PgPool,
) {
    let app = spawn_app(db).await;
    app.join_machine("gpu-01", 8).await;
    app.grant_as("default", "/scratch", Mode::ReadOnly).await;
    assert_eq!(app.create_drive(&shared("ml", "/scratch/ml", "ReadOnly")).await.status, 201);
    let refs = json!([{"name": "ml"}]);
    assert_eq!(app.create_run(&mounting("before", refs.clone())).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    assert_eq!(app.get("/workers/before-0").await.json()["status"]["machine"], "gpu-01");

    // Narrowed to a sibling folder, or removed, after the run was made: its worker fails, unplaced.
    for (run, grant) in [("narrowed", Some("/scratch/other")), ("removed", None)] {
        app.grant_as("default", "/scratch", Mode::ReadOnly).await;
        assert_eq!(app.create_run(&mounting(run, refs.clone())).await.status, 201);
        match grant {
            Some(path) => app.grant_as("default", path, Mode::ReadWrite).await,
            None => {
                let admin = app.token_for("default", Role::Admin, true).await;
                let reply = app.request(Method::PUT, GRANTS, Some(&admin), Some(&json!({"paths": []}))).await;
                assert_eq!(reply.status, 200, "{}", reply.text);
            }
        }
        assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 0);
        let worker = app.get(&format!("/workers/{run}-0")).await.json();
        assert_eq!(worker["status"]["state"], "Failed", "{worker}");
        assert_eq!(
            worker["status"]["reason"],
            "drive default.ml mounts /scratch/ml, which is no longer under a host path granted to \
             workspace default on cluster main",
        );
        assert!(worker["status"]["machine"].is_null(), "placed though ungranted: {worker}");
        assert_eq!(app.get_run(run).await.json()["status"]["state"], "Failed");
    }
}
