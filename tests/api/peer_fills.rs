//! Fills from peers, as the server decides them: a copy needed where a peer holds it whole is
//! pulled from that peer, with a transfer token for that drive alone, and filled from the
//! origin when the pull fails.

use astraeus::auth::transfer::verify_transfer;
use astraeus::domain::role::Role;
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

const MANIFEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A heartbeat of a machine: its copies of food101 (made for `drive`), whole with the manifest
/// when `drive` is given, and its data port when `address` is; the reply.
async fn beat(app: &TestApp, credential: &str, drive: Option<Uuid>, address: Option<&str>) -> Reply {
    let copies: Vec<Value> = drive
        .map(|d| {
            json!({"drive": "default.food101", "drive_id": d, "bytes": 6_000_000_000u64, "complete": true,
                   "last_used_at": null, "manifest": MANIFEST})
        })
        .into_iter()
        .collect();
    let extra = address.map_or(json!({}), |a| json!({"data_address": a}));
    app.heartbeat(credential, 1_000_000_000_000, 0, copies, extra).await
}

async fn agent(app: &TestApp, credential: &str, method: Method, path: &str, body: Option<Value>) -> Reply {
    app.agent(credential, method, path, body.as_ref()).await
}

/// gpu-01 holds food101 whole, with its manifest, and serves peers at http://10.0.0.1:7070; a
/// run pinned to gpu-02 needs it there. The app, the two credentials, the drive and gpu-01.
async fn holder_and_reader(db: sqlx::PgPool) -> (TestApp, String, String, Uuid, Uuid) {
    let app = spawn_app(db).await;
    let gpu01 = app.join_with_room("gpu-01", 4).await;
    let gpu02 = app.join_with_room("gpu-02", 4).await;
    let (drive, gpu01_id) = app.recipe_drive_with_copy_on("gpu-01").await;
    assert_eq!(beat(&app, &gpu01, Some(drive), Some("http://10.0.0.1:7070")).await.status, 200);
    let mut run = recipe_run();
    run["spec"]["task_template"]["requested_resources"]["node_selection"] =
        json!({"mode": "Exact", "names": ["gpu-02"]});
    assert_eq!(app.create_run(&run).await.status, 201);
    (app, gpu01, gpu02, drive, gpu01_id)
}

async fn fill_tick(app: &TestApp) {
    astraeus::controllers::fill::tick(&app.db, std::time::Duration::from_secs(600)).await.unwrap();
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_a_peer_holds_whole_is_pulled_from_it_and_filled_from_the_origin_when_the_pull_fails(
    db: sqlx::PgPool,
) {
    let (app, gpu01, gpu02, drive, gpu01_id) = holder_and_reader(db).await;
    let machine = app.get("/machines/gpu-01").await.json();
    assert_eq!(machine["copies"][0]["manifest"], MANIFEST, "{machine}");

    // The run pinned to gpu-02 needs the copy there: its fill pulls it from gpu-01.
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    fill_tick(&app).await;
    let events = app.get("/events?object=drive/food101").await.json();
    let started = events["items"].as_array().unwrap().iter().find(|e| e["reason"] == "FillStarted").unwrap();
    assert_eq!(
        started["message"], "fill run fill-food101-gpu-02 started on gpu-02 from peer gpu-01",
        "{events}"
    );
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1, "the fill's worker is placed");

    // Its assignment names the peer, with a token for that holder, this drive and gpu-02.
    let answer = agent(&app, &gpu02, Method::GET, "/assignments?version=0&wait_seconds=0", None).await;
    let answer = answer.json();
    let fill = answer["workers"].as_array().unwrap().iter().find(|w| w["fill"] == true).unwrap().clone();
    let peer = &fill["peer"];
    assert_eq!(
        (&peer["address"], &peer["machine"], &peer["manifest"]),
        (&json!("http://10.0.0.1:7070"), &json!("gpu-01"), &json!(MANIFEST))
    );
    let claims = verify_transfer(app.keys.as_ref(), peer["token"].as_str().unwrap()).unwrap();
    assert_eq!((claims.source, claims.drive, claims.folder.as_str()), (gpu01_id, drive, "default.food101"));
    let reader = answer["workers"].as_array().unwrap().iter().find(|w| w["fill"] != true).cloned();
    assert!(reader.is_none() || reader.unwrap().get("peer").is_none(), "only the fill pulls");

    // A fresh token for the fill, and none for another machine's credential or a worker that
    // pulls nothing.
    let uid = fill["uid"].as_str().unwrap();
    let fresh = agent(&app, &gpu02, Method::POST, &format!("/workers/{uid}/transfer-token"), None).await;
    assert_eq!(fresh.status, 200, "{}", fresh.text);
    assert_eq!(
        verify_transfer(app.keys.as_ref(), fresh.json()["token"].as_str().unwrap()).unwrap().source,
        gpu01_id
    );
    let stolen = agent(&app, &gpu01, Method::POST, &format!("/workers/{uid}/transfer-token"), None).await;
    assert_eq!(stolen.status, 404, "{}", stolen.text);

    // The pull fails: the fill goes back to the drive's template, with a new worker, and the
    // drive says why.
    let failed = json!({"state": "Running", "exit_code": null});
    assert_eq!(
        agent(&app, &gpu02, Method::POST, &format!("/workers/{uid}/status"), Some(failed)).await.status,
        200
    );
    let why = "peer copy of default.food101 differs from its manifest at train/00012.parquet";
    let failed = json!({"state": "Failed", "exit_code": null, "reason": why});
    assert_eq!(
        agent(&app, &gpu02, Method::POST, &format!("/workers/{uid}/status"), Some(failed)).await.status,
        200
    );
    fill_tick(&app).await;
    let peer: Option<Uuid> =
        sqlx::query_scalar("SELECT fill_peer_machine_id FROM runs WHERE name = 'fill-food101-gpu-02'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(peer, None);
    assert_eq!(app.get("/workers/fill-food101-gpu-02-1").await.status, 200, "a new worker runs the template");
    // The fill run is as its new worker is: the next tick leaves the copy filling.
    fill_tick(&app).await;
    let states: (String, String) = sqlx::query_as(
        "SELECT r.state, c.state FROM runs r
         JOIN copies c ON c.drive_id = r.fill_drive_id AND c.machine_id = r.fill_machine_id
         WHERE r.name = 'fill-food101-gpu-02'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(states, ("Pending".to_owned(), "Filling".to_owned()));
    let events = app.get("/events?object=drive/food101").await.json();
    let fell_back =
        events["items"].as_array().unwrap().iter().find(|e| e["reason"] == "PeerFillFailed").unwrap();
    assert_eq!(
        fell_back["message"],
        format!("the fill on gpu-02 from a peer failed: {why}; filling from the origin"),
        "{events}"
    );
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let answer = agent(&app, &gpu02, Method::GET, "/assignments?version=0&wait_seconds=0", None).await.json();
    let fill = answer["workers"].as_array().unwrap().iter().find(|w| w["fill"] == true).unwrap().clone();
    assert_eq!(fill["name"], "fill-food101-gpu-02-1");
    assert!(fill.get("peer").is_none(), "{fill}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_data_port_that_is_not_a_plain_http_address_is_refused(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let gpu01 = app.join_with_room("gpu-01", 4).await;
    for bad in
        ["ftp://10.0.0.1:21", "http://user@10.0.0.1:80", "http://10.0.0.1:80/path", "http://", "10.0.0.1:80"]
    {
        let reply = beat(&app, &gpu01, None, Some(bad)).await;
        assert_eq!(reply.status, 422, "{bad}: {}", reply.text);
        assert!(reply.text.contains("data_address"), "{}", reply.text);
    }
    assert_eq!(beat(&app, &gpu01, None, Some("http://[::1]:7070")).await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_clusters_limit_on_fills_from_the_origin_holds_the_others_back(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    app.join_with_room("gpu-01", 4).await;
    app.join_with_room("gpu-02", 4).await;
    assert_eq!(app.create_drive(&recipe_drive()).await.status, 201);
    let admin = app.token_for("default", Role::Admin, true).await;
    let editor = app.token_for("default", Role::Editor, false).await;
    let path = "/clusters/main/origin-fills";
    let set = |n: Value| json!({"max_concurrent": n});
    assert_eq!(app.request(Method::PUT, path, Some(&editor), Some(&set(json!(1)))).await.status, 403);
    let zero = app.request(Method::PUT, path, Some(&admin), Some(&set(json!(0)))).await;
    assert_eq!(zero.status, 422, "{}", zero.text);
    assert!(zero.text.contains("max_concurrent"), "{}", zero.text);
    assert_eq!(
        app.request(Method::PUT, "/clusters/nowhere/origin-fills", Some(&admin), Some(&set(json!(1))))
            .await
            .status,
        404
    );
    let one = app.request(Method::PUT, path, Some(&admin), Some(&set(json!(1)))).await;
    assert_eq!((one.status.as_u16(), one.json()), (200, json!({"max_concurrent": 1, "running": 0})));

    // Two copies wanted at once, no peer holds the drive: one fill from the origin, the other waits.
    for machine in ["gpu-01", "gpu-02"] {
        let mut run = recipe_run();
        run["metadata"]["name"] = json!(format!("read-{machine}"));
        run["spec"]["task_template"]["requested_resources"]["node_selection"] =
            json!({"mode": "Exact", "names": [machine]});
        assert_eq!(app.create_run(&run).await.status, 201);
    }
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 2);
    let fills = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM runs WHERE fill_drive_id IS NOT NULL")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    fill_tick(&app).await;
    fill_tick(&app).await;
    assert_eq!(fills().await, 1);
    assert_eq!(app.get(path).await.json(), json!({"max_concurrent": 1, "running": 1}));

    // Lifting the limit lets the other start.
    let none = app.request(Method::PUT, path, Some(&admin), Some(&set(Value::Null))).await;
    assert_eq!((none.status.as_u16(), none.json()), (200, json!({"running": 1})));
    fill_tick(&app).await;
    assert_eq!(fills().await, 2);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_fill_whose_peer_is_deleted_mid_pull_is_filled_from_the_origin_at_once(db: sqlx::PgPool) {
    let (app, _, gpu02, _, _) = holder_and_reader(db).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    fill_tick(&app).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    let fill = app.get("/workers/fill-food101-gpu-02-0").await.json();
    let uid = fill["metadata"]["uid"].as_str().unwrap().to_owned();
    let running = json!({"state": "Running", "exit_code": null});
    agent(&app, &gpu02, Method::POST, &format!("/workers/{uid}/status"), Some(running)).await;

    // The holder is deleted while the copy is being pulled: the pull fails at once, saying why,
    // rather than once its retries find nobody; the copy still says where it was coming from.
    let admin = app.token_for("default", Role::Admin, true).await;
    assert_eq!(app.request(Method::DELETE, "/machines/gpu-01", Some(&admin), None).await.status, 204);
    let fill = app.get("/workers/fill-food101-gpu-02-0").await.json();
    assert_eq!(fill["status"]["state"], "Failed", "{fill}");
    assert_eq!(fill["status"]["reason"], "its peer gpu-01 was deleted by an organisation admin", "{fill}");
    let copies = app.get_drive("food101").await.json()["copies"].clone();
    assert_eq!(copies[0]["source"], "peer", "{copies}");
    fill_tick(&app).await;
    let events = app.get("/events?object=drive/food101").await.json();
    let failed: Vec<&Value> =
        events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == "PeerFillFailed").collect();
    assert_eq!(failed.len(), 1, "{events}");
    assert_eq!(
        failed[0]["message"],
        "the fill on gpu-02 from a peer failed: its peer gpu-01 was deleted by an organisation admin; \
         filling from the origin"
    );
    assert_eq!(app.get("/workers/fill-food101-gpu-02-1").await.status, 200, "the template runs");
    let copies = app.get_drive("food101").await.json()["copies"].clone();
    assert_eq!((&copies[0]["state"], &copies[0]["source"]), (&json!("Filling"), &json!("fill")), "{copies}");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_whose_pull_from_a_peer_runs_feeds_the_next_machine_and_when_it_fails_another_peer_does(
    db: sqlx::PgPool,
) {
    let (app, _, gpu02, _, gpu01_id) = holder_and_reader(db).await;
    assert_eq!(beat(&app, &gpu02, None, Some("http://10.0.0.2:7070")).await.status, 200);
    let gpu03 = app.join_with_room("gpu-03", 4).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    fill_tick(&app).await;
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1, "gpu-02's fill is placed");
    let answer = agent(&app, &gpu02, Method::GET, "/assignments?version=0&wait_seconds=0", None).await.json();
    let fill = answer["workers"].as_array().unwrap().iter().find(|w| w["fill"] == true).unwrap().clone();
    let running = json!({"state": "Running", "exit_code": null});
    let uid = fill["uid"].as_str().unwrap();
    let path = format!("/workers/{uid}/status");
    assert_eq!(agent(&app, &gpu02, Method::POST, &path, Some(running)).await.status, 200);

    // gpu-03 needs the drive while gpu-02 pulls it: gpu-02, with no upload under way, passes on
    // what it has checked, and gpu-01 keeps a slot.
    let mut third = recipe_run();
    third["metadata"]["name"] = json!("third");
    third["spec"]["task_template"]["requested_resources"]["node_selection"] =
        json!({"mode": "Exact", "names": ["gpu-03"]});
    assert_eq!(app.create_run(&third).await.status, 201);
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1);
    fill_tick(&app).await;
    let events = app.get("/events?object=drive/food101").await.json();
    let started: Vec<_> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "FillStarted")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        started.contains(&"fill run fill-food101-gpu-03 started on gpu-03 from peer gpu-02".to_owned()),
        "{started:?}"
    );
    assert_eq!(astraeus::scheduler::tick(&app.db).await.unwrap(), 1, "gpu-03's fill is placed");
    let answer = agent(&app, &gpu03, Method::GET, "/assignments?version=0&wait_seconds=0", None).await.json();
    let fill = answer["workers"].as_array().unwrap().iter().find(|w| w["fill"] == true).unwrap().clone();
    let peer = &fill["peer"];
    assert_eq!(
        (&peer["address"], &peer["machine"], &peer["manifest"]),
        (&json!("http://10.0.0.2:7070"), &json!("gpu-02"), &json!(MANIFEST))
    );
    let claims = verify_transfer(app.keys.as_ref(), peer["token"].as_str().unwrap()).unwrap();
    let gpu02_id: Uuid =
        sqlx::query_scalar("SELECT id FROM machines WHERE name = 'gpu-02'").fetch_one(&app.db).await.unwrap();
    assert_eq!((claims.source, claims.folder.as_str()), (gpu02_id, "default.food101"));

    // gpu-02's pull fails, and with it gpu-03's: gpu-03 pulls from gpu-01 instead, which holds
    // the copy whole, rather than read the origin.
    let failed = |why: &str| json!({"state": "Failed", "exit_code": null, "reason": why});
    let why = "the transfer from the peer failed: connection reset";
    assert_eq!(agent(&app, &gpu02, Method::POST, &path, Some(failed(why))).await.status, 200);
    let uid = fill["uid"].as_str().unwrap();
    let path = format!("/workers/{uid}/status");
    assert_eq!(agent(&app, &gpu03, Method::POST, &path, Some(json!({"state": "Running"}))).await.status, 200);
    let why = "the peer refused (409): the copy of default.food101 here: it stopped before it was whole";
    assert_eq!(agent(&app, &gpu03, Method::POST, &path, Some(failed(why))).await.status, 200);
    fill_tick(&app).await;
    let peers: Vec<(String, Option<Uuid>)> = sqlx::query_as(
        "SELECT r.name, r.fill_peer_machine_id FROM runs r WHERE r.fill_drive_id IS NOT NULL ORDER BY r.name",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let expected =
        [("fill-food101-gpu-02".to_owned(), None), ("fill-food101-gpu-03".to_owned(), Some(gpu01_id))];
    assert_eq!(peers, expected, "gpu-02's failed source is not tried again");
    let events = app.get("/events?object=drive/food101").await.json();
    let failed: Vec<_> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "PeerFillFailed")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        failed.contains(&format!(
            "the fill on gpu-03 from a peer failed: {why}; pulling from peer gpu-01 instead"
        )),
        "{failed:?}"
    );
    assert_eq!(app.get("/workers/fill-food101-gpu-03-1").await.status, 200, "with a new worker");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_organisation_admin_bounds_what_a_machine_sends_to_peers_and_its_heartbeats_bring_it(
    db: sqlx::PgPool,
) {
    let app = spawn_app(db).await;
    // Heartbeats answered from memory are forgotten when Postgres says the machine changed.
    let listener = tokio::spawn(app.state.hub.clone().listen(app.db.clone()));
    while !app.state.hub.listening() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let gpu01 = app.join_with_room("gpu-01", 4).await;
    let admin = app.token_for("default", Role::Admin, true).await;
    let path = "/machines/gpu-01/transfer-limits";
    let put = |body: Value, token: String| {
        let app = &app;
        async move { app.request(Method::PUT, path, Some(&token), Some(&body)).await }
    };
    let beat_limits = || async {
        let reply = beat(&app, &gpu01, None, None).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        reply.json()["transfer_limits"].clone()
    };
    let none = json!({"upload_bytes_per_second": null, "download_bytes_per_second": null});
    assert_eq!(beat_limits().await, none);

    // A workspace admin may not: the machine is every workspace's.
    let ws_admin = app.token_for("default", Role::Admin, false).await;
    let refused = put(json!({"upload_bytes_per_second": 100_000_000}), ws_admin).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    // Out of bounds (422) or a field it does not know (400): the answer names it, and nothing
    // is written.
    let low = put(json!({"upload_bytes_per_second": 999_999}), admin.clone()).await;
    assert_eq!(low.status, 422, "{}", low.text);
    assert_eq!(low.fields()[0].0, "upload_bytes_per_second", "{}", low.text);
    let high = put(json!({"download_bytes_per_second": 1_000_000_000_001u64}), admin.clone()).await;
    assert_eq!(high.fields()[0].0, "download_bytes_per_second", "{}", high.text);
    let unknown = put(json!({"upload_bytes_per_second": 100_000_000, "burst": 1}), admin.clone()).await;
    assert_eq!((unknown.status.as_u16(), unknown.fields()[0].0.as_str()), (400, "burst"), "{}", unknown.text);
    let machine = app.get("/machines/gpu-01").await.json();
    assert_eq!(machine["status"]["transfer_limits"], none, "{machine}");

    let set = put(json!({"upload_bytes_per_second": 100_000_000}), admin.clone()).await;
    assert_eq!(set.status, 200, "{}", set.text);
    let limited = json!({"upload_bytes_per_second": 100_000_000, "download_bytes_per_second": null});
    assert_eq!(set.json()["status"]["transfer_limits"], limited);
    assert_eq!(app.get("/machines/gpu-01").await.json()["status"]["transfer_limits"], limited);
    // The next heartbeats bring the limits, answered in full or from memory alike: the
    // change's notification makes the server forget the answer it kept.
    let until_beat_says = |limits: Value| {
        let beat_limits = &beat_limits;
        async move {
            let mut seen = beat_limits().await;
            for _ in 0..100 {
                if seen == limits {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                seen = beat_limits().await;
            }
            assert_eq!(seen, limits);
            assert_eq!(beat_limits().await, limits, "and again, from memory");
        }
    };
    until_beat_says(limited).await;
    let lifted = put(none.clone(), admin.clone()).await;
    assert_eq!(lifted.status, 200, "{}", lifted.text);
    until_beat_says(none.clone()).await;
    let elsewhere =
        app.request(Method::PUT, "/machines/gpu-09/transfer-limits", Some(&admin), Some(&none)).await;
    assert_eq!(elsewhere.status, 404, "{}", elsewhere.text);
    listener.abort();
}
