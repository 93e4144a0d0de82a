use std::pin::Pin;

use crate::drives::assert_refused;
use crate::helpers::*;

/// The recipe's inspect.json with one change.
fn recipe_run_with(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut run = recipe_run();
    edit(&mut run);
    run
}

/// The recipe's inspect.json named `name`, mounting `refs`.
fn run_mounting(name: &str, refs: serde_json::Value) -> serde_json::Value {
    recipe_run_with(|r| {
        r["metadata"]["name"] = json!(name);
        r["spec"]["task_template"]["datavolume_refs"] = refs;
    })
}

/// An app holding the recipe's drive food101.
async fn app_with_recipe_drive(db: sqlx::PgPool) -> TestApp {
    let app = spawn_app(db).await;
    let reply = app.create_drive(&recipe_drive()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    app
}

async fn run_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("select count(*) from runs").fetch_one(&app.db).await.unwrap()
}

fn names(list: &serde_json::Value) -> Vec<&str> {
    list.as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_recipe_run_is_accepted_and_waits_for_workers(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let reply = app.create_run(&recipe_run()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let run = reply.json();
    assert_eq!(run["metadata"]["name"], "inspect-food101");
    assert_eq!(run["metadata"]["namespace"], "default");
    assert_eq!(run["status"]["state"], "Pending");
    assert_eq!(run["status"]["reason"], "Waiting for workers to start");
    assert_eq!(run["spec"]["cluster"], "main");
    assert_eq!(run["spec"]["replicas"], 1);
    assert_eq!(
        run["spec"]["task_template"]["datavolume_refs"],
        json!([{"name": "food101", "mount_path": "/data", "mode": "ReadOnly"}])
    );
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_shows_its_workers(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);

    let run = app.get_run("inspect-food101").await;
    assert_eq!(run.status, 200, "{}", run.text);
    let workers = &run.json()["status"]["workers"];
    assert_eq!(names(workers), ["inspect-food101-0"]);
    assert_eq!(workers[0]["status"]["state"], "Pending");
    assert_eq!(workers[0]["metadata"]["run"], "inspect-food101");
    assert_eq!(workers[0]["metadata"]["index"], 0);

    let listed = app.get("/runs/inspect-food101/workers").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(names(&listed.json()["items"]), ["inspect-food101-0"]);

    let worker = app.get("/workers/inspect-food101-0").await;
    assert_eq!(worker.status, 200, "{}", worker.text);
    let worker = worker.json();
    assert_eq!(worker["metadata"]["name"], "inspect-food101-0");
    assert_eq!(worker["status"]["state"], "Pending");
    assert_eq!(worker["status"]["machine"], json!(null));

    let missing = app.get("/workers/inspect-food101-1").await;
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert!(missing.message().contains("worker inspect-food101-1 not found"), "{}", missing.text);
    let missing = app.get("/runs/nope/workers").await;
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert!(missing.message().contains("run nope not found"), "{}", missing.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn mounts_default_to_the_drive_mount_path_and_mode(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = run_mounting(
        "parquet",
        json!([{"name": "food101", "sub_path": "food101/data", "mount_path": "/parquet"}]),
    );
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let refs = json!([{"name": "food101", "sub_path": "food101/data", "mount_path": "/parquet", "mode": "ReadOnly"}]);
    assert_eq!(reply.json()["spec"]["task_template"]["datavolume_refs"], refs);
    assert_eq!(app.get_run("parquet").await.json()["spec"]["task_template"]["datavolume_refs"], refs);

    let reply = app.create_run(&run_mounting("bare", json!([{"name": "food101"}]))).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(
        reply.json()["spec"]["task_template"]["datavolume_refs"],
        json!([{"name": "food101", "mount_path": "/data", "mode": "ReadOnly"}])
    );

    let reply =
        app.create_run(&run_mounting("writer", json!([{"name": "food101", "mode": "ReadWrite"}]))).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["spec"]["task_template"]["datavolume_refs"][0]["mode"], "ReadWrite");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_cannot_mount_a_missing_drive(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let reply =
        app.create_run(&run_mounting("inspect", json!([{"name": "nope", "mount_path": "/data"}]))).await;
    assert_refused(&reply, 422, "spec.task_template.datavolume_refs[0].name", "drive nope does not exist");

    let refs = json!([{"name": "food101"}, {"name": "nope", "mount_path": "/other"}]);
    let reply = app.create_run(&run_mounting("inspect", refs)).await;
    assert_refused(&reply, 422, "spec.task_template.datavolume_refs[1].name", "drive nope does not exist");
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_cannot_mount_a_drive_of_another_workspace(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let research = app.token_for("research", astraeus::domain::role::Role::Editor, false).await;
    let reply = app.request(reqwest::Method::POST, "/runs", Some(&research), Some(&recipe_run())).await;
    assert_refused(&reply, 422, "spec.task_template.datavolume_refs[0].name", "drive food101 does not exist");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn sub_paths_must_stay_inside_the_drive(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let at = "spec.task_template.datavolume_refs[0].sub_path";
    for (sub_path, why) in
        [("../x", "'..'"), ("a/../../x", "'..'"), ("/abs", "must be relative"), ("a//b", "empty")]
    {
        let refs = json!([{"name": "food101", "sub_path": sub_path}]);
        assert_refused(&app.create_run(&run_mounting("inspect", refs)).await, 422, at, why);
    }
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn two_mounts_cannot_share_a_mount_path(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let at = "spec.task_template.datavolume_refs[1].mount_path";
    let refs = json!([
        {"name": "food101", "mount_path": "/data"},
        {"name": "food101", "sub_path": "food101", "mount_path": "/data"}
    ]);
    assert_refused(&app.create_run(&run_mounting("inspect", refs)).await, 422, at, "/data is already used");

    // Both take the drive's /data.
    let refs = json!([{"name": "food101"}, {"name": "food101", "sub_path": "food101"}]);
    assert_refused(&app.create_run(&run_mounting("inspect", refs)).await, 422, at, "/data is already used");

    // One takes it by default, the other by name.
    let refs =
        json!([{"name": "food101"}, {"name": "food101", "sub_path": "food101", "mount_path": "/data"}]);
    assert_refused(&app.create_run(&run_mounting("inspect", refs)).await, 422, at, "/data is already used");
    assert_eq!(run_count(&app).await, 0);

    let refs =
        json!([{"name": "food101"}, {"name": "food101", "sub_path": "food101", "mount_path": "/food"}]);
    let reply = app.create_run(&run_mounting("inspect", refs)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_cannot_reference_a_missing_secret(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = recipe_run_with(|r| r["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}]));
    let reply = app.create_run(&run).await;
    assert_refused(&reply, 422, "spec.task_template.secret_refs[0].name", "secret hf does not exist");

    let run = recipe_run_with(|r| {
        r["spec"]["task_template"]["secret_refs"] = json!([{"name": "hf"}, {"name": "hf"}])
    });
    let reply = app.create_run(&run).await;
    assert_refused(&reply, 422, "spec.task_template.secret_refs[1].name", "hf is listed twice");
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_image_pull_secret_must_exist_and_is_echoed_back(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = recipe_run_with(|r| r["spec"]["task_template"]["image_pull_secret"] = json!("registry"));
    let reply = app.create_run(&run).await;
    assert_refused(&reply, 422, "spec.task_template.image_pull_secret", "secret registry does not exist");
    assert_eq!(run_count(&app).await, 0);

    let secret = json!({
        "metadata": {"name": "registry"},
        "data": {"AUTH_JSON": r#"{"auths": {"registry.example": {"auth": "dXNlcjpwYXNz"}}}"#}
    });
    assert_eq!(app.post("/secrets", &secret).await.status, 201);
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["spec"]["task_template"]["image_pull_secret"], "registry");
    let task = app.get_run("inspect-food101").await.json()["spec"]["task_template"].clone();
    assert_eq!(task["image_pull_secret"], "registry", "{task}");
    // Its keys are no variables of the worker: it is not among the secret_refs.
    assert_eq!(task["secret_refs"], json!([]), "{task}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn node_selection_names_go_with_mode_exact(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let at = "spec.task_template.requested_resources.node_selection.names";
    let run = recipe_run_with(|r| {
        r["spec"]["task_template"]["requested_resources"]["node_selection"] = json!({"mode": "Exact"})
    });
    assert_refused(&app.create_run(&run).await, 422, at, "mode Exact needs at least one machine name");

    let run = recipe_run_with(|r| {
        r["spec"]["task_template"]["requested_resources"]["node_selection"] =
            json!({"mode": "Any", "names": ["gpu-01"]})
    });
    assert_refused(&app.create_run(&run).await, 422, at, "only used with mode Exact");
    assert_eq!(run_count(&app).await, 0);

    let run = recipe_run_with(|r| {
        r["spec"]["task_template"]["requested_resources"]["node_selection"] =
            json!({"mode": "Exact", "names": ["gpu-01"]})
    });
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn replicas_are_between_one_and_a_thousand(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    for replicas in [0, 1001] {
        let run = recipe_run_with(|r| r["spec"]["replicas"] = json!(replicas));
        assert_refused(&app.create_run(&run).await, 422, "spec.replicas", "must be between 1 and 1000");
    }
    let run = recipe_run_with(|r| r["spec"]["replicas"] = json!(-1));
    assert_refused(&app.create_run(&run).await, 422, "spec.replicas", "invalid value");
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_cpu_request_too_small_to_be_a_millicore_is_refused(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    // 5.7e-169 cores once passed as 0 millicores, and reading the run back failed with a 500.
    for cores in [json!(5.720478322052137e-169), json!(1e-10), json!(0.0004)] {
        let run = recipe_run_with(|r| r["spec"]["task_template"]["requested_resources"]["cpu_cores"] = cores);
        let path = "spec.task_template.requested_resources.cpu_cores";
        assert_refused(&app.create_run(&run).await, 422, path, "finer than a thousandth of a core");
    }
    assert_eq!(run_count(&app).await, 0);
    let run =
        recipe_run_with(|r| r["spec"]["task_template"]["requested_resources"]["cpu_cores"] = json!(0.001));
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json()["spec"]["task_template"]["requested_resources"]["cpu_cores"], json!(0.001));
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_makes_one_worker_per_replica(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = recipe_run_with(|r| r["spec"]["replicas"] = json!(3));
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);

    let expected = ["inspect-food101-0", "inspect-food101-1", "inspect-food101-2"];
    let workers = app.get("/runs/inspect-food101/workers").await.json();
    assert_eq!(names(&workers["items"]), expected);
    assert_eq!(names(&app.get_run("inspect-food101").await.json()["status"]["workers"]), expected);
    for (i, name) in expected.iter().enumerate() {
        let worker = app.get(&format!("/workers/{name}")).await;
        assert_eq!(worker.status, 200, "{}", worker.text);
        assert_eq!(worker.json()["metadata"]["index"], i);
        assert_eq!(worker.json()["status"]["state"], "Pending");
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn fill_names_are_kept_for_fill_runs(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = recipe_run_with(|r| r["metadata"]["name"] = json!("fill-food101-gpu-01"));
    assert_refused(&app.create_run(&run).await, 422, "metadata.name", "kept for fill runs");
    let run = recipe_run_with(|r| r["metadata"]["name"] = json!("Inspect"));
    assert_refused(&app.create_run(&run).await, 422, "metadata.name", "not a DNS label");
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn run_bodies_are_read_like_drive_bodies(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let run = recipe_run_with(|r| r["spec"]["task_template"]["colour"] = json!("red"));
    assert_refused(&app.create_run(&run).await, 400, "spec.task_template.colour", "unknown field");
    let run = recipe_run_with(|r| r["spec"]["task_template"]["restart_policy"] = json!("Always"));
    assert_refused(&app.create_run(&run).await, 422, "spec.task_template.restart_policy", "unknown variant");
    let run = recipe_run_with(|r| r["spec"]["cluster"] = json!("mars"));
    assert_refused(&app.create_run(&run).await, 422, "spec.cluster", "cluster mars does not exist");
    let reply = app.post_raw("/runs", "application/json", "{").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert!(reply.message().contains("malformed JSON"), "{}", reply.text);
    assert_eq!(run_count(&app).await, 0);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_name_can_be_used_once(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    let reply = app.create_run(&recipe_run()).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "conflict");
    assert!(reply.message().contains("run inspect-food101 already exists"), "{}", reply.text);
    assert_eq!(run_count(&app).await, 1);
    let workers: i64 = sqlx::query_scalar("select count(*) from workers").fetch_one(&app.db).await.unwrap();
    assert_eq!(workers, 1);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_run_list_hides_ended_runs_unless_asked_for_all(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    for name in ["inspect-food101", "inspect-food101-2", "inspect-food101-3"] {
        let run = recipe_run_with(|r| r["metadata"]["name"] = json!(name));
        assert_eq!(app.create_run(&run).await.status, 201);
    }
    sqlx::query("update runs set state = 'Completed', reason = 'All workers completed' where name = $1")
        .bind("inspect-food101")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("update runs set state = 'Failed' where name = $1")
        .bind("inspect-food101-3")
        .execute(&app.db)
        .await
        .unwrap();

    let live = app.get("/runs").await;
    assert_eq!(live.status, 200, "{}", live.text);
    assert_eq!(names(&live.json()["items"]), ["inspect-food101-2"]);

    let all = app.get("/runs?all=true").await;
    assert_eq!(all.status, 200, "{}", all.text);
    let all = all.json();
    assert_eq!(names(&all["items"]), ["inspect-food101-3", "inspect-food101-2", "inspect-food101"]);
    assert_eq!(all["items"][2]["status"]["state"], "Completed");
    assert_eq!(all["items"][2]["status"]["reason"], "All workers completed");
    assert!(all["items"][0]["status"].get("workers").is_none(), "lists leave workers out");

    let page = app.get("/runs?all=true&limit=1").await.json();
    assert_eq!(names(&page["items"]), ["inspect-food101-3"]);
    assert!(page["next"].is_string(), "{page}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn deleting_a_run_removes_its_workers_and_frees_its_drives(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    assert_eq!(app.delete("/drives/food101").await.status, 409);

    let reply = app.delete("/runs/inspect-food101").await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert_eq!(app.get_run("inspect-food101").await.status, 404);
    let worker = app.get("/workers/inspect-food101-0").await;
    assert_eq!(worker.status, 404, "{}", worker.text);
    assert!(worker.message().contains("worker inspect-food101-0 not found"), "{}", worker.text);
    let workers: i64 = sqlx::query_scalar("select count(*) from workers").fetch_one(&app.db).await.unwrap();
    assert_eq!(workers, 0);
    assert_eq!(app.get_drive("food101").await.json()["used_by"], json!([]));

    let reply = app.delete("/runs/inspect-food101").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert!(reply.message().contains("run inspect-food101 not found"), "{}", reply.text);

    let reply = app.delete("/drives/food101").await;
    assert_eq!(reply.status, 204, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_whose_run_ended_can_be_deleted(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    assert_eq!(app.create_run(&recipe_run()).await.status, 201);
    sqlx::query("update workers set state = 'Completed'").execute(&app.db).await.unwrap();
    let reply = app.delete("/drives/food101").await;
    assert_eq!(reply.status, 204, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_cannot_mount_a_drive_of_another_cluster(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    sqlx::query("insert into clusters (name) values ('edge')").execute(&app.db).await.unwrap();
    let mut drive = recipe_drive();
    drive["spec"]["cluster"] = json!("edge");
    assert_eq!(app.create_drive(&drive).await.status, 201);

    let reply = app.create_run(&recipe_run()).await;
    let at = "spec.task_template.datavolume_refs[0].name";
    assert_refused(&reply, 422, at, "drive food101 is on cluster edge, the run on main");

    let run = recipe_run_with(|r| r["spec"]["cluster"] = json!("edge"));
    let reply = app.create_run(&run).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_drive_is_never_deleted_under_a_run_created_at_the_same_time(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    let runs: Vec<_> =
        (0..10).map(|i| recipe_run_with(|r| r["metadata"]["name"] = json!(format!("r{i}")))).collect();
    // The delete is sent among the creates.
    let mut requests: Vec<Pin<Box<dyn Future<Output = Reply> + '_>>> =
        runs.iter().map(|r| Box::pin(app.create_run(r)) as _).collect();
    requests.insert(5, Box::pin(app.delete("/drives/food101")));
    let mut replies = futures::future::join_all(requests).await;
    let deleted = replies.remove(5);
    let created = replies;

    let mounted = created.iter().filter(|r| r.status == 201).count();
    for r in &created {
        if r.status != 201 {
            assert_refused(
                r,
                422,
                "spec.task_template.datavolume_refs[0].name",
                "drive food101 does not exist",
            );
        }
    }
    let run_rows = run_count(&app).await;
    assert_eq!(run_rows as usize, mounted);
    match deleted.status.as_u16() {
        // Every run that got in first holds the drive; every run after finds it gone.
        204 => assert_eq!(mounted, 0, "runs were created on a deleted drive: {created:?}"),
        409 => {
            assert!(mounted > 0, "{}", deleted.text);
            assert_eq!(app.get_drive("food101").await.status, 200);
        }
        other => panic!("{other}: {}", deleted.text),
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_run_holds_its_first_100_workers_and_pages_through_them_in_index_order(db: sqlx::PgPool) {
    let app = app_with_recipe_drive(db).await;
    for (name, replicas) in [("other", 1), ("inspect-food101", 103)] {
        let run = recipe_run_with(|r| {
            r["metadata"]["name"] = json!(name);
            r["spec"]["replicas"] = json!(replicas);
        });
        assert_eq!(app.create_run(&run).await.status, 201);
    }
    let uid = |worker: &str| {
        let app = &app;
        let path = format!("/workers/{worker}");
        async move { app.get(&path).await.json()["metadata"]["uid"].clone() }
    };

    // Index order, 10 after 9: the first 100, and the cursor for the rest.
    let run = app.get_run("inspect-food101").await.json();
    let first: Vec<String> = (0..100).map(|i| format!("inspect-food101-{i}")).collect();
    assert_eq!(names(&run["status"]["workers"]), first);
    assert_eq!(run["status"]["workers_next"], uid("inspect-food101-99").await);
    assert_eq!(app.get_run("other").await.json()["status"].get("workers_next"), None);

    let next = |cursor: &serde_json::Value| {
        format!("/runs/inspect-food101/workers?limit=2&cursor={}", cursor.as_str().unwrap())
    };
    let page = app.get(&next(&run["status"]["workers_next"])).await.json();
    assert_eq!(names(&page["items"]), ["inspect-food101-100", "inspect-food101-101"]);
    assert_eq!(page["next"], uid("inspect-food101-101").await);
    let last = app.get(&next(&page["next"])).await.json();
    assert_eq!(names(&last["items"]), ["inspect-food101-102"]);
    assert_eq!(last.get("next"), None, "{last}");
    let whole = app.get("/runs/inspect-food101/workers?limit=1000").await.json();
    assert_eq!(whole["items"].as_array().unwrap().len(), 103);

    // A cursor from another run, or naming no worker, and a limit out of range: 400, by name.
    let theirs = uid("other-0").await;
    let reply = app.get(&next(&theirs)).await;
    assert_refused(&reply, 400, "cursor", "names no worker of run inspect-food101");
    let nil = "00000000-0000-0000-0000-000000000000";
    let reply = app.get(&format!("/runs/inspect-food101/workers?cursor={nil}")).await;
    assert_refused(&reply, 400, "cursor", "names no worker of run inspect-food101");
    let reply = app.get("/runs/inspect-food101/workers?limit=1001").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert!(reply.message().contains("limit must be between 1 and 1000"), "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_waiting_run_says_why_its_first_worker_waits_with_a_count_when_its_workers_differ(
    db: sqlx::PgPool,
) {
    let app = app_with_recipe_drive(db).await;
    app.join_machine("gpu-01", 8).await;
    let four = recipe_run_with(|r| r["spec"]["replicas"] = json!(4));
    assert_eq!(app.create_run(&four).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 0);
    let run = app.get_run("inspect-food101").await.json();
    assert_eq!(run["status"]["state"], "Pending");
    // The recipe's troubleshooting row, word for word.
    assert_eq!(run["status"]["reason"], "Choose where to keep data on gpu-01", "{run}");

    // Once the data location is confirmed, two are placed (and wait for the fill, saying so
    // themselves) and the two left wait for cpu.
    let admin = app.token_for("default", astraeus::domain::role::Role::Admin, true).await;
    let confirm = json!({"path": "/var/lib/astraeus"});
    let reply = app
        .request(reqwest::Method::POST, "/machines/gpu-01/data-location", Some(&admin), Some(&confirm))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    // Room for two workers more only: the others wait for cpu.
    let room = "UPDATE machines SET cpu_millis = 2000, data_total_bytes = 1e12, data_free_bytes = 1e12";
    sqlx::query(room).execute(&app.db).await.unwrap();
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 2);
    let run = app.get_run("inspect-food101").await.json();
    assert_eq!(run["status"]["reason"], "Insufficient cpu (0 of 1 cores free) (2 of 4 workers)", "{run}");
}
