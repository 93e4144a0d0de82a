use std::collections::HashSet;

use reqwest::Method;
use serde_json::Value;

use crate::helpers::*;

/// Asserts that `reply` refuses exactly one field, `path`, with `status` and a message containing
/// `why`, and that the error's own message says the same.
pub fn assert_refused(reply: &Reply, status: u16, path: &str, why: &str) {
    assert_eq!(reply.status, status, "{path}: {}", reply.text);
    let fields = reply.fields();
    assert_eq!(fields.len(), 1, "{path}: {}", reply.text);
    assert_eq!(fields[0].0, path, "{}", reply.text);
    assert!(fields[0].1.contains(why), "{path}: {:?} lacks {why:?}", fields[0].1);
    assert!(reply.message().contains(why), "{path}: {:?} lacks {why:?}", reply.message());
}

/// The recipe's drive.json with one change.
fn recipe_drive_with(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut drive = recipe_drive();
    edit(&mut drive);
    drive
}

/// The recipe's drive-on-one-machine.json, at `path` on gpu-01.
fn drive_on_gpu01(name: &str, path: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "sources": [{"node": "gpu-01", "path": path, "mount_path": "/data", "mode": "ReadWrite"}],
            "transport": "Auto"
        }
    })
}

/// A drive on a shared filesystem at `path`.
fn shared_drive(name: &str, path: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {"sources": [{"node_scope": "shared", "path": path, "mount_path": "/data"}]}
    })
}

type Edit = fn(&mut serde_json::Value);

/// Sends the recipe drive with each edit and checks the one field it names.
async fn assert_each_refused(app: &TestApp, cases: &[(Edit, u16, &str, &str)]) {
    for &(edit, status, path, why) in cases {
        let reply = app.create_drive(&recipe_drive_with(edit)).await;
        assert_refused(&reply, status, path, why);
    }
    assert_eq!(drive_count(app).await, 0, "a refused drive was written");
}

async fn drive_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("select count(*) from drives").fetch_one(&app.db).await.unwrap()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_recipe_drive_is_created_as_written(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.create_drive(&recipe_drive()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let drive = reply.json();
    assert_eq!(drive["metadata"]["name"], "food101");
    assert_eq!(drive["metadata"]["namespace"], "default");
    assert_eq!(drive["status"]["full_name"], "default.food101");
    assert_eq!(drive["copies"], json!([]));
    assert_eq!(drive["used_by"], json!([]));
    assert_eq!(drive["status"].get("copies"), None, "a drive read alone lists its copies instead");
    assert_eq!(app.get_drive("food101").await.json()["spec"], drive["spec"]);
    let listed = &app.get("/drives").await.json()["items"][0];
    assert_eq!(listed["status"]["copies"], json!({"complete": 0, "filling": 0, "failed": 0}), "{listed}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn drive_names_must_be_dns_labels(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (|d| d["metadata"]["name"] = json!("Food_101"), 422, "metadata.name", "not a DNS label"),
            (|d| d["metadata"]["name"] = json!("x".repeat(64)), 422, "metadata.name", "longer than 63"),
            (|d| d["metadata"]["name"] = json!("-food"), 422, "metadata.name", "start and end"),
            (|d| d["metadata"]["name"] = json!(""), 422, "metadata.name", "must not be empty"),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn unknown_fields_are_bad_requests_that_name_the_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (|d| d["colour"] = json!("red"), 400, "colour", "unknown field"),
            (|d| d["metadata"]["colour"] = json!("red"), 400, "metadata.colour", "unknown field"),
            (|d| d["spec"]["colour"] = json!("red"), 400, "spec.colour", "unknown field"),
            (
                |d| d["spec"]["sources"][0]["colour"] = json!("red"),
                400,
                "spec.sources[0].colour",
                "unknown field",
            ),
            (
                |d| d["spec"]["fill"]["template"]["requested_resources"]["colour"] = json!("red"),
                400,
                "spec.fill.template.requested_resources.colour",
                "unknown field",
            ),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn malformed_json_is_a_bad_request(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let trailing = format!("{} x", recipe_drive());
    for body in [r#"{"metadata": {"name": "food101"}"#, "{'metadata': 1}", &trailing, ""] {
        let reply = app.post_raw("/drives", "application/json", body.to_owned()).await;
        assert_eq!(reply.status, 400, "{body:?}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "bad_request");
        let message = reply.message();
        assert!(message.contains("malformed JSON") || message.contains("empty"), "{body:?}: {message}");
    }
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn values_of_the_wrong_type_or_missing_name_their_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (|d| d["spec"]["size_hint_bytes"] = json!("big"), 422, "spec.size_hint_bytes", "invalid type"),
            (|d| d["spec"]["evictable"] = json!("yes"), 422, "spec.evictable", "invalid type"),
            (
                |d| d["spec"]["sources"][0]["mode"] = json!("Sometimes"),
                422,
                "spec.sources[0].mode",
                "unknown variant",
            ),
            (
                |d| {
                    d["spec"]["sources"][0].as_object_mut().unwrap().remove("mount_path");
                },
                422,
                "spec.sources[0].mount_path",
                "is required",
            ),
            (
                |d| {
                    d["spec"].as_object_mut().unwrap().remove("sources");
                },
                422,
                "spec.sources",
                "is required",
            ),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn mount_paths_must_be_absolute_and_off_system_folders(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let at = "spec.sources[0].mount_path";
    assert_each_refused(
        &app,
        &[
            (|d| d["spec"]["sources"][0]["mount_path"] = json!("data"), 422, at, "not an absolute path"),
            (|d| d["spec"]["sources"][0]["mount_path"] = json!("/"), 422, at, "must not be '/'"),
            (|d| d["spec"]["sources"][0]["mount_path"] = json!("/proc/x"), 422, at, "inside /proc"),
            (|d| d["spec"]["sources"][0]["mount_path"] = json!("/data/../etc"), 422, at, "'..'"),
            (|d| d["spec"]["sources"][0]["mount_path"] = json!("/data:rw"), 422, at, "must not contain ':'"),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_has_exactly_one_source_with_one_location(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (|d| d["spec"]["sources"] = json!([]), 422, "spec.sources", "exactly one source, found 0"),
            (
                |d| {
                    let source = d["spec"]["sources"][0].clone();
                    d["spec"]["sources"] = json!([source.clone(), source]);
                },
                422,
                "spec.sources",
                "exactly one source, found 2",
            ),
            (|d| d["spec"]["sources"][0]["node"] = json!("gpu-01"), 422, "spec.sources[0].node", "not both"),
            (
                |d| d["spec"]["sources"][0] = json!({"path": "", "mount_path": "/data"}),
                422,
                "spec.sources[0].node_scope",
                "give node_scope",
            ),
            (|d| d["spec"]["sources"][0]["path"] = json!("../x"), 422, "spec.sources[0].path", "'..'"),
            (
                |d| d["spec"]["sources"][0]["path"] = json!("/abs"),
                422,
                "spec.sources[0].path",
                "must be relative",
            ),
            (
                |d| {
                    d["spec"]["sources"][0] =
                        json!({"node_scope": "shared", "path": "lustre/food101", "mount_path": "/data"});
                    d["spec"].as_object_mut().unwrap().remove("fill");
                },
                422,
                "spec.sources[0].path",
                "not an absolute path",
            ),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn size_hint_and_transport_are_checked(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (
                |d| d["spec"]["size_hint_bytes"] = json!(0),
                422,
                "spec.size_hint_bytes",
                "between 1 byte and 1 EiB",
            ),
            (|d| d["spec"]["size_hint_bytes"] = json!(-1), 422, "spec.size_hint_bytes", "invalid value"),
            (|d| d["spec"]["transport"] = json!("Local"), 422, "spec.transport", "Local applies only"),
            (|d| d["spec"]["transport"] = json!("Carrier"), 422, "spec.transport", "unknown variant"),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn only_a_placed_drive_is_filled_and_it_must_be(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.grant("default", "/lustre").await;
    assert_each_refused(
        &app,
        &[
            (
                |d| {
                    d["spec"].as_object_mut().unwrap().remove("fill");
                },
                422,
                "spec.fill",
                "needs fill.template",
            ),
            (
                |d| {
                    d["spec"]["sources"][0] =
                        json!({"node_scope": "shared", "path": "/lustre/food101", "mount_path": "/data"})
                },
                422,
                "spec.fill",
                "only a drive with node_scope placed is filled",
            ),
            (
                |d| {
                    d["spec"]["sources"][0] =
                        json!({"node": "gpu-01", "path": "/lustre/food101", "mount_path": "/data"})
                },
                422,
                "spec.fill",
                "only a drive with node_scope placed is filled",
            ),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn each_fill_template_rule_names_its_field(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let resources = "spec.fill.template.requested_resources";
    assert_each_refused(
        &app,
        &[
            (
                |d| d["spec"]["fill"]["template"]["datavolume_refs"] = json!([{"name": "other"}]),
                422,
                "spec.fill.template.datavolume_refs",
                "may not mount drives",
            ),
            (
                |d| d["spec"]["fill"]["template"]["env"] = json!({"1BAD": "x"}),
                422,
                "spec.fill.template.env.1BAD",
                "is not a variable name",
            ),
            (
                |d| d["spec"]["fill"]["template"]["time_limit_seconds"] = json!(0),
                422,
                "spec.fill.template.time_limit_seconds",
                "between 1 and 2592000",
            ),
            (
                |d| d["spec"]["fill"]["template"]["image"] = json!(""),
                422,
                "spec.fill.template.image",
                "must not be empty",
            ),
            (
                |d| {
                    d["spec"]["fill"]["template"]["requested_resources"]["node_selection"] =
                        json!({"mode": "Exact", "names": ["gpu-01"]})
                },
                422,
                "spec.fill.template.requested_resources.node_selection",
                "leave node_selection out",
            ),
        ],
    )
    .await;
    let cases: [(serde_json::Value, &str, &str); 4] = [
        (json!({"cpu_cores": 0, "memory_bytes": 1}), "cpu_cores", "must be more than 0"),
        (json!({"cpu_cores": -1, "memory_bytes": 1}), "cpu_cores", "must be more than 0"),
        (json!({"cpu_cores": 0.0001, "memory_bytes": 1}), "cpu_cores", "finer than a thousandth"),
        (json!({"cpu_cores": 1, "memory_bytes": 0}), "memory_bytes", "must be between 1 byte"),
    ];
    for (value, field, why) in cases {
        let drive = recipe_drive_with(|d| d["spec"]["fill"]["template"]["requested_resources"] = value);
        assert_refused(&app.create_drive(&drive).await, 422, &format!("{resources}.{field}"), why);
    }
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn label_keys_are_checked(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_each_refused(
        &app,
        &[
            (
                |d| d["metadata"]["labels"] = json!({"bad key": "x"}),
                422,
                "metadata.labels.bad key",
                "is not a label key",
            ),
            (
                |d| d["metadata"]["labels"] = json!({"dataset": "v".repeat(64)}),
                422,
                "metadata.labels.dataset",
                "at most 63 bytes",
            ),
        ],
    )
    .await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_on_one_machine_needs_a_granted_host_path(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let drive = drive_on_gpu01("food101-gpu01", "/datasets/food101");
    let reply = app.create_drive(&drive).await;
    assert_refused(&reply, 422, "spec.sources[0].path", "not under a host path granted");
    assert!(reply.message().contains("/datasets/food101"), "{}", reply.text);
    assert_eq!(app.get_drive("food101-gpu01").await.status, 404);

    app.grant("default", "/datasets").await;
    let reply = app.create_drive(&drive).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let source = &reply.json()["spec"]["sources"][0];
    assert_eq!(
        (source["node"].as_str(), source["path"].as_str()),
        (Some("gpu-01"), Some("/datasets/food101"))
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn grants_compare_whole_path_components(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.grant("default", "/data").await;
    let reply = app.create_drive(&drive_on_gpu01("database", "/database/x")).await;
    assert_refused(&reply, 422, "spec.sources[0].path", "not under a host path granted");
    let reply = app.create_drive(&drive_on_gpu01("data-x", "/data/x")).await;
    assert_eq!(reply.status, 201, "{}", reply.text);

    app.grant("default", "/data/fo").await;
    let reply = app.create_drive(&drive_on_gpu01("data-foo", "/data/foo")).await;
    assert_refused(&reply, 422, "spec.sources[0].path", "not under a host path granted");
    let reply = app.create_drive(&drive_on_gpu01("data-fo", "/data/fo/x")).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn host_paths_must_be_absolute_and_normal(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.grant("default", "/").await;
    for (path, why) in [
        ("/datasets/../etc", "'..'"),
        ("/datasets/\0x", "must not contain a NUL byte"),
        ("datasets/food101", "not an absolute path"),
        ("", "not an absolute path"),
        ("/datasets//food101", "empty component"),
    ] {
        let reply = app.create_drive(&drive_on_gpu01("food101-gpu01", path)).await;
        assert_refused(&reply, 422, "spec.sources[0].path", why);
        let reply = app.create_drive(&shared_drive("food101-shared", path)).await;
        assert_refused(&reply, 422, "spec.sources[0].path", why);
    }
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_shared_drive_needs_a_granted_host_path(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let drive = shared_drive("food101-lustre", "/lustre/datasets/food101");
    let reply = app.create_drive(&drive).await;
    assert_refused(&reply, 422, "spec.sources[0].path", "not under a host path granted");

    app.grant("default", "/lustre").await;
    let reply = app.create_drive(&drive).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["spec"]["sources"][0]["node_scope"], "shared");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_grant_of_another_workspace_does_not_count(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.grant("research", "/datasets").await;
    let reply = app.create_drive(&drive_on_gpu01("food101-gpu01", "/datasets/food101")).await;
    assert_refused(&reply, 422, "spec.sources[0].path", "granted to workspace default");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_unknown_cluster_is_refused(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.create_drive(&recipe_drive_with(|d| d["spec"]["cluster"] = json!("mars"))).await;
    assert_refused(&reply, 422, "spec.cluster", "cluster mars does not exist");
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_name_can_be_used_once(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let reply = app.create_drive(&recipe_drive()).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "conflict");
    assert!(reply.message().contains("drive food101 already exists"), "{}", reply.text);
    assert_eq!(drive_count(&app).await, 1);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_same_name_in_another_workspace_is_another_drive(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let research = app.token_for("research", astraeus::domain::role::Role::Editor, false).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let reply = app.request(Method::POST, "/drives", Some(&research), Some(&recipe_drive())).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["status"]["full_name"], "research.food101");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn only_one_of_twenty_concurrent_creates_wins(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let drive = recipe_drive();
    let replies = futures::future::join_all((0..20).map(|_| app.create_drive(&drive))).await;
    let created = replies.iter().filter(|r| r.status == 201).count();
    let conflicts: Vec<_> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(created, 1, "{replies:?}");
    assert_eq!(conflicts.len(), 19, "{replies:?}");
    for r in conflicts {
        assert!(r.message().contains("drive food101 already exists"), "{}", r.text);
    }
    assert_eq!(drive_count(&app).await, 1);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_cannot_be_replaced_or_patched(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let changed = recipe_drive_with(|d| d["spec"]["evictable"] = json!(false));
    for method in [Method::PUT, Method::PATCH] {
        let reply = app.request(method.clone(), "/drives/food101", Some(&app.token), Some(&changed)).await;
        assert_eq!(reply.status, 405, "{method}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "method_not_allowed");
        assert!(reply.message().contains("delete it and create it again"), "{method}: {}", reply.text);
    }
    assert_eq!(app.get_drive("food101").await.json()["spec"]["evictable"], true);

    let reply = app.request(Method::PUT, "/drives/nope", Some(&app.token), Some(&changed)).await;
    assert_eq!(reply.status, 404, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn reading_a_missing_drive_is_not_found(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = app.get_drive("nope").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "not_found");
    assert!(reply.message().contains("drive nope not found"), "{}", reply.text);
    let reply = app.get_drive("Not_A_Name").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_deleted_drive_is_gone(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let reply = app.delete("/drives/food101").await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert!(reply.text.is_empty());
    let reply = app.get_drive("food101").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert!(reply.message().contains("drive food101 not found"));
    let reply = app.delete("/drives/food101").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_in_use_cannot_be_deleted(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);

    let used_by = &app.get_drive("food101").await.json()["used_by"];
    assert_eq!(used_by[0]["name"], "inspect-food101-0", "{used_by}");
    assert_eq!(used_by[0]["state"], "Pending");

    let reply = app.delete("/drives/food101").await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "conflict");
    let message = reply.message();
    assert!(message.contains("worker inspect-food101-0"), "{message}");
    assert!(message.contains("delete run inspect-food101 first"), "{message}");
    assert_eq!(app.get_drive("food101").await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_holds_its_first_100_users_and_pages_through_them_newest_run_first(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    for (name, replicas) in [("older", 2), ("queue", 101)] {
        let mut run = recipe_run();
        run["metadata"]["name"] = json!(name);
        run["spec"]["replicas"] = json!(replicas);
        assert_eq!(app.create_run(&run).await.status, 201);
    }
    let uid = |worker: &str| {
        let app = &app;
        let path = format!("/workers/{worker}");
        async move { app.get(&path).await.json()["metadata"]["uid"].clone() }
    };
    let names = |list: &Value| -> Vec<String> {
        list.as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap().to_owned()).collect()
    };

    let drive = app.get_drive("food101").await.json();
    let first: Vec<String> = (0..100).map(|i| format!("queue-{i}")).collect();
    assert_eq!(names(&drive["used_by"]), first);
    assert_eq!(drive["used_by_next"], uid("queue-99").await);
    assert_eq!(drive.get("copies_next"), None, "{drive}");

    let next = |cursor: &Value| format!("/drives/food101/users?limit=2&cursor={}", cursor.as_str().unwrap());
    let page = app.get(&next(&drive["used_by_next"])).await.json();
    assert_eq!(names(&page["items"]), ["queue-100", "older-0"]);
    assert_eq!(page["items"][1]["run"], "older");
    assert_eq!(page["items"][1]["state"], "Pending");
    assert_eq!(page["next"], uid("older-0").await);
    let last = app.get(&next(&page["next"])).await.json();
    assert_eq!(names(&last["items"]), ["older-1"]);
    assert_eq!(last.get("next"), None, "{last}");

    // A trigger marks the mounts of a run that completes, and the drive reads those no more.
    let set_state = |state: &'static str| {
        let db = app.db.clone();
        async move {
            sqlx::query("UPDATE runs SET state = $1 WHERE name = 'older'")
                .bind(state)
                .execute(&db)
                .await
                .unwrap();
        }
    };
    let users = || async {
        app.get("/drives/food101/users?limit=1000").await.json()["items"].as_array().unwrap().len()
    };
    set_state("Completed").await;
    assert_eq!(users().await, 101);
    set_state("Running").await;
    assert_eq!(users().await, 103);

    // A cursor whose worker went with its run, a limit out of range, a drive that is not there.
    assert_eq!(app.delete("/runs/older").await.status, 204);
    let reply = app.get(&next(&page["next"])).await;
    assert_eq!(reply.status, 410, "{}", reply.text);
    assert!(reply.message().contains("list again without a cursor"), "{}", reply.text);
    let reply = app.get("/drives/food101/users?limit=0").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert!(reply.message().contains("limit must be between 1 and 1000"), "{}", reply.text);
    let reply = app.get("/drives/nope/copies").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert!(reply.message().contains("drive nope not found"), "{}", reply.text);
    assert_eq!(app.get("/drives/food101/copies").await.json()["items"], json!([]));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_refused_drive_writes_nothing(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    // Refused by the last check before the insert: the grant.
    let reply = app.create_drive(&drive_on_gpu01("food101-gpu01", "/datasets/food101")).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    // Refused by a rule on the fill template.
    let reply = app
        .create_drive(&recipe_drive_with(|d| d["spec"]["fill"]["template"]["time_limit_seconds"] = json!(0)))
        .await;
    assert_eq!(reply.status, 422, "{}", reply.text);

    assert_eq!(app.get_drive("food101-gpu01").await.status, 404);
    assert_eq!(app.get_drive("food101").await.status, 404);
    assert_eq!(drive_count(&app).await, 0);
    assert_eq!(app.get("/drives").await.json()["items"], json!([]));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_body_over_one_mebibyte_is_refused(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let drive = recipe_drive_with(|d| d["spec"]["fill"]["template"]["args"][1] = json!("x".repeat(2 << 20)));
    let reply = app.post_raw("/drives", "application/json", serde_json::to_vec(&drive).unwrap()).await;
    assert_eq!(reply.status, 413, "{}", &reply.text[..reply.text.len().min(300)]);
    assert_eq!(reply.json()["error"]["code"], "payload_too_large");
    assert!(reply.message().contains("larger than 1048576 bytes"), "{}", reply.text);
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_body_that_is_not_json_is_refused(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let body = serde_json::to_vec(&recipe_drive()).unwrap();
    let reply = app.post_raw("/drives", "text/plain", body).await;
    assert_eq!(reply.status, 415, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "unsupported_media_type");
    assert!(reply.message().contains("is not JSON"), "{}", reply.text);
    assert_eq!(drive_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn drives_are_listed_in_pages(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let names: HashSet<String> = (1..=5).map(|i| format!("food{i}")).collect();
    for name in &names {
        let reply = app.create_drive(&recipe_drive_with(|d| d["metadata"]["name"] = json!(name))).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }

    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut path = "/drives?limit=2".to_owned();
    loop {
        let reply = app.get(&path).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let page = reply.json();
        let items = page["items"].as_array().unwrap();
        sizes.push(items.len());
        seen.extend(items.iter().map(|d| d["metadata"]["name"].as_str().unwrap().to_owned()));
        match page["next"].as_str() {
            Some(next) => path = format!("/drives?limit=2&cursor={next}"),
            None => break,
        }
        assert!(sizes.len() < 10, "the pages never end: {seen:?}");
    }
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), names);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_list_limit_outside_one_to_a_thousand_is_refused(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for path in ["/drives?limit=0", "/drives?limit=5000", "/drives?limit=-1"] {
        let reply = app.get(path).await;
        assert_eq!(reply.status, 400, "{path}: {}", reply.text);
        assert!(reply.message().contains("limit must be between 1 and 1000"), "{path}: {}", reply.text);
    }
    for path in ["/drives?limit=many", "/drives?cursor=nope", "/drives?colour=red"] {
        let reply = app.get(path).await;
        assert_eq!(reply.status, 400, "{path}: {}", reply.text);
        assert!(reply.message().contains("bad query string"), "{path}: {}", reply.text);
    }
    assert_eq!(app.get("/drives?limit=1000").await.status, 200);
}
