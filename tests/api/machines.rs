use astraeus::domain::role::Role;
use reqwest::Method;
use serde_json::Value;

use crate::helpers::*;

async fn join(app: &TestApp, name: &str, cpu_cores: u32) {
    app.join_machine(name, cpu_cores).await;
}

/// A run of `replicas` workers of one core that mounts nothing.
fn run(name: &str, replicas: u32) -> Value {
    let mut run = recipe_run();
    run["metadata"]["name"] = json!(name);
    run["spec"]["replicas"] = json!(replicas);
    run["spec"]["task_template"]["datavolume_refs"] = json!([]);
    run
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect()
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_holds_its_first_100_workers_and_pages_through_them_newest_run_first(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    join(&app, "gpu-01", 200).await;
    for (name, replicas) in [("older", 2), ("queue", 101)] {
        let reply = app.create_run(&run(name, replicas)).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }
    // Another workspace's worker on the same machine is not listed.
    let theirs = app.token_for("other", Role::Editor, false).await;
    let reply = app.request(Method::POST, "/runs", Some(&theirs), Some(&run("theirs", 1))).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 104);
    let uid = |worker: &str| {
        let app = &app;
        let path = format!("/workers/{worker}");
        async move { app.get(&path).await.json()["metadata"]["uid"].clone() }
    };

    let machine = app.get("/machines/gpu-01").await.json();
    let first: Vec<String> = (0..100).map(|i| format!("queue-{i}")).collect();
    assert_eq!(names(&machine["workers"]), first);
    assert_eq!(machine["workers"][0]["status"]["machine"], "gpu-01");
    assert_eq!(machine["workers_next"], uid("queue-99").await);

    let next =
        |cursor: &Value| format!("/machines/gpu-01/workers?limit=2&cursor={}", cursor.as_str().unwrap());
    let page = app.get(&next(&machine["workers_next"])).await.json();
    assert_eq!(names(&page["items"]), ["queue-100", "older-0"]);
    assert_eq!(page["next"], uid("older-0").await);
    let last = app.get(&next(&page["next"])).await.json();
    assert_eq!(names(&last["items"]), ["older-1"]);
    assert_eq!(last.get("next"), None, "{last}");

    // A worker that ended leaves the list.
    sqlx::query("UPDATE workers SET state = 'Completed' WHERE name = 'older-1'")
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(names(&app.get(&next(&page["next"])).await.json()["items"]), Vec::<&str>::new());

    // A cursor whose worker went with its run, a limit out of range, a machine that is not there.
    assert_eq!(app.delete("/runs/older").await.status, 204);
    let reply = app.get(&next(&page["next"])).await;
    assert_eq!(reply.status, 410, "{}", reply.text);
    assert!(reply.message().contains("list again without a cursor"), "{}", reply.text);
    let reply = app.get("/machines/gpu-01/workers?limit=0").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    assert!(reply.message().contains("limit must be between 1 and 1000"), "{}", reply.text);
    let reply = app.get("/machines/gpu-02/workers").await;
    assert_eq!(reply.status, 404, "{}", reply.text);
    assert!(reply.message().contains("machine gpu-02 not found"), "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn workers_that_fit_no_machine_hold_up_none_behind_them(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    join(&app, "gpu-01", 2).await;
    // More workers than a scheduling pass claims, each asking for a GPU that gpu-01 lacks.
    for i in 0..5 {
        let mut gpus = run(&format!("gpus-{i}"), 1000);
        gpus["spec"]["task_template"]["requested_resources"]["gpus"] = json!(1);
        let reply = app.create_run(&gpus).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }
    let reply = app.create_run(&run("small", 1)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);

    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let small = app.get("/workers/small-0").await.json();
    assert_eq!(small["status"]["machine"], "gpu-01", "{small}");
    for worker in ["gpus-0-0", "gpus-4-999"] {
        let waiting = app.get(&format!("/workers/{worker}")).await.json();
        assert_eq!(waiting["status"]["state"], "Pending", "{waiting}");
        assert!(waiting["status"]["reason"].as_str().unwrap().contains("Insufficient gpus"), "{waiting}");
    }
}

/// A join of machine `name` with `token`: its status and answer.
async fn join_with(app: &TestApp, token: &Value, name: &str) -> (u16, Value) {
    let body = json!({
        "join_token": token,
        "name": name,
        "capacity": {"cpu_cores": 2, "memory_bytes": 1u64 << 32, "gpus": 0},
    });
    let joined = app.client.post(format!("{}/agent/v1/join", app.address)).json(&body).send().await.unwrap();
    let status = joined.status().as_u16();
    (status, joined.json().await.unwrap_or_default())
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_join_token_admits_as_many_machines_as_it_was_minted_for_and_never_takes_a_name(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let mint = |body: Value| {
        let (app, admin) = (&app, &admin);
        async move { app.request(Method::POST, "/clusters/main/join-tokens", Some(admin), Some(&body)).await }
    };
    let two = mint(json!({"uses": 2})).await;
    assert_eq!(two.status, 201, "{}", two.text);
    assert_eq!(two.json()["uses_left"], 2);
    let token = two.json()["token"].clone();

    let (status, first) = join_with(&app, &token, "gpu-01").await;
    assert_eq!(status, 200, "{first}");
    // Holding a token is not holding gpu-01: its name is taken, its credential stays its own,
    // and the refused join does not use the token up.
    let (status, taken) = join_with(&app, &token, "gpu-01").await;
    assert_eq!(status, 409, "{taken}");
    assert!(taken["error"]["message"].as_str().unwrap().contains("machine gpu-01 already exists"), "{taken}");
    let beat = json!({"data_location": {"total_bytes": 1, "used_bytes": 0, "free_bytes": 1}});
    let heartbeat = app
        .client
        .post(format!("{}/agent/v1/heartbeat", app.address))
        .bearer_auth(first["credential"].as_str().unwrap())
        .json(&beat)
        .send()
        .await
        .unwrap();
    assert_eq!(heartbeat.status().as_u16(), 200);
    assert_eq!(join_with(&app, &token, "gpu-02").await.0, 200);
    let (status, used_up) = join_with(&app, &token, "gpu-03").await;
    assert_eq!(status, 401, "{used_up}");
    assert!(used_up["error"]["message"].as_str().unwrap().contains("used up"), "{used_up}");

    let listed = app.request(Method::GET, "/clusters/main/join-tokens", Some(&admin), None).await;
    assert_eq!(listed.json()["items"][0]["uses_left"], 0, "{}", listed.text);
    for uses in [0, 10_001] {
        let refused = mint(json!({"uses": uses})).await;
        assert_eq!(refused.status, 422, "{}", refused.text);
        assert_eq!(refused.json()["error"]["fields"][0]["path"], "uses");
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn machines_are_listed_in_pages_by_cluster_then_name(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for name in ["gpu-03", "gpu-01", "gpu-02"] {
        join(&app, name, 1).await;
    }
    let first = app.get("/machines?limit=2").await.json();
    assert_eq!(names(&first["items"]), ["gpu-01", "gpu-02"]);
    let next = first["next"].as_str().unwrap();
    let second = app.get(&format!("/machines?limit=2&cursor={next}")).await.json();
    assert_eq!(names(&second["items"]), ["gpu-03"]);
    assert!(second["next"].is_null(), "{second}");
    let admin = app.token_for("default", Role::Admin, true).await;
    let gone = app.request(Method::DELETE, "/machines/gpu-02", Some(&admin), None).await;
    assert_eq!(gone.status, 204, "{}", gone.text);
    let stale = app.get(&format!("/machines?limit=2&cursor={next}")).await;
    assert_eq!(stale.status, 410, "{}", stale.text);
    assert_eq!(app.get("/machines?limit=1001").await.status, 400);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_disk_under_the_reserve_its_agent_reports_is_under_pressure(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 1).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let confirm = json!({"path": "/var/lib/astraeus"});
    let reply =
        app.request(Method::POST, "/machines/gpu-01/data-location", Some(&admin), Some(&confirm)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let beat = |reserve: u64| {
        let (app, credential) = (&app, &credential);
        async move {
            let body = json!({"data_location": {
                "total_bytes": 10_000_000_000u64, "used_bytes": 0, "free_bytes": 1_000_000_000u64,
                "reserve_bytes": reserve,
            }});
            let url = format!("{}/agent/v1/heartbeat", app.address);
            let sent = app.client.post(url).bearer_auth(credential).json(&body).send().await.unwrap();
            assert_eq!(sent.status(), 200);
        }
    };
    beat(0).await;
    assert!(astraeus::store::copies::under_pressure(&app.db).await.unwrap().is_empty());
    // The same report with a reserve is reconciled, not answered from memory.
    beat(3_000_000_000).await;
    let pressed = astraeus::store::copies::under_pressure(&app.db).await.unwrap();
    assert_eq!(pressed.len(), 1, "{pressed:?}");
    let (need, why) = astraeus::controllers::pressure::excess(&pressed[0]).unwrap();
    assert_eq!(need, 2_000_000_000);
    assert_eq!(why, "its disk had 1.0 GB free, under its reserve of 3.0 GB");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_state_the_server_does_not_know_is_an_error_where_it_is_read_not_a_default(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    join(&app, "gpu-01", 1).await;
    let reply = app.create_run(&run("one", 1)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    // States this server has no name for, as a newer one might write them.
    let machine: uuid::Uuid = sqlx::query_scalar("UPDATE machines SET state = 'Sleeping' RETURNING id")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(astraeus::store::machines::get(&app.db, machine).await.is_err());
    assert_eq!(app.get("/machines/gpu-01").await.status, 500);
    // The scheduler does not take the machine for one that is not Ready: its pass fails.
    assert!(astraeus::scheduler::tick(&app.db).await.is_err());
    let worker: uuid::Uuid = sqlx::query_scalar("UPDATE workers SET state = 'Succeeded' RETURNING id")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(astraeus::store::workers::state(&app.db, worker).await.is_err());
}

/// A heartbeat of gpu-01 reporting folder `default.food101`, made for `drive_id`, whole: the
/// folders the answer says to delete.
async fn report_food101(app: &TestApp, credential: &str, drive_id: Option<uuid::Uuid>) -> Value {
    let copy = json!({"drive": "default.food101", "drive_id": drive_id, "bytes": 3, "complete": true});
    let beat =
        json!({"data_location": {"total_bytes": 1000, "used_bytes": 3, "free_bytes": 997}, "copies": [copy]});
    let answer = app.client.post(format!("{}/agent/v1/heartbeat", app.address)).bearer_auth(credential);
    let answer = answer.json(&beat).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    answer.json::<Value>().await.unwrap()["delete_copies"].clone()
}

/// Drive food101 made anew, with a copy being filled on gpu-01: its id.
async fn food101_filling_on(app: &TestApp, machine: uuid::Uuid) -> uuid::Uuid {
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let drive = sqlx::query_scalar("SELECT id FROM drives WHERE name = 'food101'").fetch_one(&app.db);
    let drive = drive.await.unwrap();
    astraeus::store::copies::ensure_for(&app.db, drive, machine).await.unwrap();
    drive
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_folder_made_for_a_deleted_drive_is_never_the_copy_of_the_drive_made_again(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let credential = app.join_machine("gpu-01", 2).await;
    let machine = sqlx::query_scalar("SELECT id FROM machines WHERE name = 'gpu-01'").fetch_one(&app.db);
    let machine = machine.await.unwrap();
    let old = food101_filling_on(&app, machine).await;
    assert_eq!(report_food101(&app, &credential, Some(old)).await, json!([]));
    assert_eq!(app.get_drive("food101").await.json()["copies"][0]["complete"], true);

    assert_eq!(app.delete("/drives/food101").await.status, 204);
    let new = food101_filling_on(&app, machine).await;
    // The old drive's folder, or one naming no drive, is neither the new copy nor kept.
    for stale in [Some(old), None] {
        assert_eq!(report_food101(&app, &credential, stale).await, json!(["default.food101"]));
        let drive = app.get_drive("food101").await.json();
        assert_eq!(
            (&drive["copies"][0]["complete"], &drive["copies"][0]["state"]),
            (&json!(false), &json!("Filling"))
        );
    }
    assert_eq!(report_food101(&app, &credential, Some(new)).await, json!([]));
    assert_eq!(app.get_drive("food101").await.json()["copies"][0]["complete"], true);
}
