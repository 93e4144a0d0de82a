//! Fills from peers on an in-process cluster with real agents: a copy pulled from the machine
//! that holds it whole, or from one still pulling it, checked against its manifest, over HTTPS
//! when the data port has a certificate, resumed after a cut, given up for the origin when its
//! holder goes, and a transfer token that opens one copy only.

mod cluster;

use std::num::NonZeroU64;

use astraeus::agent::PeerConfig;
use cluster::{Api, BLOB_FILL, Cluster, eventually, json, pinned, placed_drive, run_mounting};
use reqwest::StatusCode;
use sqlx::PgPool;

/// A fill that writes one blob of 24 MB, three chunks of a manifest's 8 MiB, then the marker.
const BIG_FILL: &str = "set -e; head -c 24000000 /dev/urandom > /drive/blob; touch /drive/.astralyx-filled";
const BIG: u64 = 24_000_000;
const CHUNK: u64 = 8 << 20;

/// Peer limits of `bytes_per_second` for downloads, or for uploads.
fn slow(download: bool, bytes_per_second: u64) -> PeerConfig {
    let limit = NonZeroU64::new(bytes_per_second);
    let mut peers = PeerConfig::default();
    match download {
        true => peers.download_bytes_per_second = limit,
        false => peers.upload_bytes_per_second = limit,
    }
    peers
}

/// The bytes received so far of `machine`'s pull of `folder`'s file `file`.
fn received(cluster: &Cluster, machine: &str, folder: &str, file: &str) -> u64 {
    let staging = cluster.machine(machine).data.path().join("drives").join(format!(".receiving-{folder}"));
    std::fs::metadata(staging.join(file)).map_or(0, |m| m.len())
}

/// Waits until `machine`'s pull of `folder` has received `at_least` bytes of `file`.
async fn wait_received(cluster: &Cluster, machine: &str, folder: &str, file: &str, at_least: u64) {
    eventually(&format!("{machine} receives {at_least} bytes of {folder}/{file}"), || async {
        match received(cluster, machine, folder, file) {
            n if n >= at_least => Ok(()),
            n => Err(format!("{n} bytes")),
        }
    })
    .await;
}

/// The copy of `drive` on `machine`, as the drive shows it.
async fn copy_on(api: &Api, drive: &str, machine: &str) -> serde_json::Value {
    let copies = api.drive(drive).await["copies"].clone();
    copies.as_array().unwrap().iter().find(|c| c["node"] == machine).cloned().unwrap_or_default()
}

/// Fills `drive` on `machine` with a run pinned there, and waits for its manifest.
async fn fill_on(api: &Api, drive: &str, machine: &str) -> String {
    let run = format!("first-{drive}");
    api.create_run(&pinned(run_mounting(&run, "true", &[drive], 0.5), machine)).await;
    api.wait_completed(&run).await;
    manifest_of(api, machine, drive).await
}

/// The manifest digest of `machine`'s copy of `drive`, once its agent reports one.
async fn manifest_of(api: &Api, machine: &str, drive: &str) -> String {
    eventually(&format!("the copy of {drive} on {machine} has its manifest"), || async move {
        let m = api.machine(machine).await;
        let copy = m["copies"].as_array().unwrap().iter().find(|c| c["drive"] == drive).cloned();
        match copy.as_ref().and_then(|c| c["manifest"].as_str()) {
            Some(digest) => Ok(digest.to_owned()),
            None => Err(format!("{copy:?}")),
        }
    })
    .await
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_held_whole_by_a_peer_is_pulled_from_it_and_one_that_differs_from_another_peer(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    for name in ["gpu-01", "gpu-02", "gpu-03"] {
        cluster.add_peer_machine(name).await;
    }
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("blobs", 1_000_000, true, BLOB_FILL, 0.5)).await;
    api.create_run(&pinned(run_mounting("first", "true", &["blobs"], 0.5), "gpu-01")).await;
    api.wait_completed("first").await;
    let digest = manifest_of(&api, "gpu-01", "blobs").await;

    // gpu-02 pulls its copy from gpu-01: the same bytes, the same manifest, no container.
    api.create_run(&pinned(
        run_mounting("second", "cmp -s /data/blob /data/blob", &["blobs"], 0.5),
        "gpu-02",
    ))
    .await;
    api.wait_completed("second").await;
    let started = api.events_with("drive/blobs", "FillStarted").await;
    assert!(
        started
            .iter()
            .any(|e| e["message"] == "fill run fill-blobs-gpu-02 started on gpu-02 from peer gpu-01"),
        "{started:?}"
    );
    let blob =
        |machine: &str| std::fs::read(cluster.machine(machine).data.path().join("drives/default.blobs/blob"));
    assert_eq!(blob("gpu-02").unwrap(), blob("gpu-01").unwrap());
    assert_eq!(manifest_of(&api, "gpu-02", "blobs").await, digest);
    let copies = api.drive("blobs").await["copies"].clone();
    let source =
        |node: &str| copies.as_array().unwrap().iter().find(|c| c["node"] == node).unwrap()["source"].clone();
    assert_eq!((source("gpu-01"), source("gpu-02")), (json!("fill"), json!("peer gpu-01")), "{copies}");

    // A byte of gpu-01's copy changes after its manifest was made: gpu-03's pull from it (the
    // least busy holder, before gpu-02) catches the file, and the fill pulls from gpu-02.
    let path = cluster.machine("gpu-01").data.path().join("drives/default.blobs/blob");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    api.create_run(&pinned(run_mounting("third", "true", &["blobs"], 0.5), "gpu-03")).await;
    api.wait_completed("third").await;
    let failed = api.events_with("drive/blobs", "PeerFillFailed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let message = failed[0]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "peer copy of default.blobs differs from its manifest at blob; pulling from peer gpu-02 instead"
        ),
        "{message}"
    );
    let copies = api.drive("blobs").await["copies"].clone();
    let gpu03 = copies.as_array().unwrap().iter().find(|c| c["node"] == "gpu-03").unwrap().clone();
    assert_eq!((&gpu03["state"], &gpu03["source"]), (&json!("Complete"), &json!("peer gpu-02")), "{copies}");
    assert_eq!(blob("gpu-03").unwrap(), blob("gpu-02").unwrap());
    assert_eq!(
        cluster.worker_names("fill-blobs-gpu-03").await,
        ["fill-blobs-gpu-03-0", "fill-blobs-gpu-03-1"]
    );
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn machines_that_need_a_drive_at_once_pull_it_from_peers_and_read_the_origin_once(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    let names = ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06"];
    for name in names {
        cluster.add_peer_machine(name).await;
    }
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("blobs", 1_000_000, true, BLOB_FILL, 0.5)).await;
    api.create_run(&pinned(run_mounting("first", "true", &["blobs"], 0.5), "gpu-01")).await;
    api.wait_completed("first").await;
    manifest_of(&api, "gpu-01", "blobs").await;

    // Five workers, one a machine (each takes both cores), on the five others at once: each
    // holder serves one at a time (controllers::fill::peers), each copy being pulled serving
    // the next as it lands, and the others wait for a slot rather than read the origin.
    let mut wide = run_mounting("wide", "true", &["blobs"], 2.0);
    wide["spec"]["replicas"] = json!(5);
    wide["spec"]["task_template"]["requested_resources"]["node_selection"] =
        json!({"mode": "Exact", "names": &names[1..]});
    api.create_run(&wide).await;
    api.wait_completed("wide").await;
    let started = api.events_with("drive/blobs", "FillStarted").await;
    let from_origin: Vec<_> =
        started.iter().filter(|e| !e["message"].as_str().unwrap().contains("from peer")).collect();
    assert_eq!((started.len(), from_origin.len()), (6, 1), "{started:?}");
    let copies = api.drive("blobs").await["copies"].clone();
    let copies = copies.as_array().unwrap();
    assert_eq!(copies.len(), 6);
    for c in copies.iter().filter(|c| c["node"] != "gpu-01") {
        assert!(c["source"].as_str().unwrap().starts_with("peer gpu-0"), "{c}");
    }
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_pull_cut_by_a_restart_of_the_receiving_agent_resumes_from_the_chunks_it_had(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_peer_machine("gpu-01").await;
    // 4 MB/s: the pull of 24 MB lasts six seconds, long enough to cut.
    cluster.add_peer_machine_with("gpu-02", slow(true, 4_000_000)).await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("big", BIG, true, BIG_FILL, 0.5)).await;
    let digest = fill_on(&api, "big", "gpu-01").await;

    api.create_run(&pinned(run_mounting("second", "cmp -s /data/blob /data/blob", &["big"], 0.5), "gpu-02"))
        .await;
    // The first chunk is whole and checked; the agent restarts mid-pull.
    wait_received(&cluster, "gpu-02", "default.big", "blob", CHUNK + 1_000_000).await;
    cluster.restart("gpu-02").await;
    assert!(received(&cluster, "gpu-02", "default.big", "blob") >= CHUNK, "what was received stays");

    api.wait_completed("second").await;
    let pulled = api.events_with("worker/fill-big-gpu-02-0", "Pulled").await;
    assert_eq!(pulled.len(), 1, "{pulled:?}");
    let message = pulled[0]["message"].as_str().unwrap();
    let kept: u64 = message
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(" bytes kept"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!(kept >= CHUNK && kept.is_multiple_of(CHUNK), "whole chunks kept: {message}");
    assert!(
        message.starts_with(&format!("received {} bytes of 1 files from gpu-01", BIG - kept)),
        "{message}"
    );
    let copy = copy_on(&api, "big", "gpu-02").await;
    assert_eq!((&copy["state"], &copy["source"]), (&json!("Complete"), &json!("peer gpu-01")), "{copy}");
    assert_eq!(manifest_of(&api, "gpu-02", "big").await, digest);
    let blob =
        |machine: &str| std::fs::read(cluster.machine(machine).copy_dir("default.big").join("blob")).unwrap();
    assert!(blob("gpu-01") == blob("gpu-02"), "the copies differ");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_pull_whose_holder_is_deleted_mid_transfer_is_filled_from_the_origin(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    // gpu-01 sends 2 MB/s: its upload of 24 MB is under way when it goes.
    cluster.add_peer_machine_with("gpu-01", slow(false, 2_000_000)).await;
    cluster.add_peer_machine("gpu-02").await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("big", BIG, true, BIG_FILL, 0.5)).await;
    fill_on(&api, "big", "gpu-01").await;

    api.create_run(&pinned(run_mounting("second", "true", &["big"], 0.5), "gpu-02")).await;
    wait_received(&cluster, "gpu-02", "default.big", "blob", 1).await;
    cluster.kill("gpu-01").await;
    let admin = cluster.api.delete("/machines/gpu-01").await;
    assert_eq!(admin.status, StatusCode::NO_CONTENT, "{}", admin.text);

    // The pull fails at once, and its agent stops it; the fill runs its template instead.
    api.wait_completed("second").await;
    let failed = api.events_with("drive/big", "PeerFillFailed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        failed[0]["message"],
        "the fill on gpu-02 from a peer failed: its peer gpu-01 was deleted by an organisation admin; \
         filling from the origin"
    );
    let copy = copy_on(&api, "big", "gpu-02").await;
    assert_eq!((&copy["state"], &copy["source"]), (&json!("Complete"), &json!("fill")), "{copy}");
    assert_eq!(cluster.worker_names("fill-big-gpu-02").await, ["fill-big-gpu-02-0", "fill-big-gpu-02-1"]);
    let staging = cluster.machine("gpu-02").data.path().join("drives/.receiving-default.big");
    eventually("what the failed pull received is removed", || async {
        if staging.exists() { Err("still there".to_owned()) } else { Ok(()) }
    })
    .await;
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_transfer_token_opens_its_own_drives_copy_at_its_holder_and_no_other(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_peer_machine("gpu-01").await;
    // 1 MB/s: the pull lasts while the token is tried.
    cluster.add_peer_machine_with("gpu-02", slow(true, 1_000_000)).await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("big", BIG, true, BIG_FILL, 0.5)).await;
    api.create_drive(&placed_drive("other", 100_000, true, BLOB_FILL, 0.5)).await;
    fill_on(&api, "big", "gpu-01").await;
    fill_on(&api, "other", "gpu-01").await;

    // gpu-02 pulls big from gpu-01, and takes a fresh token for that pull as its agent would.
    api.create_run(&pinned(run_mounting("second", "true", &["big"], 0.5), "gpu-02")).await;
    wait_received(&cluster, "gpu-02", "default.big", "blob", 1).await;
    let fill = api.worker("fill-big-gpu-02-0").await;
    let uid = fill["metadata"]["uid"].as_str().unwrap();
    let http = reqwest::Client::new();
    let minted = http
        .post(format!("{}/agent/v1/workers/{uid}/transfer-token", api.base))
        .bearer_auth(cluster.machine("gpu-02").credential())
        .send()
        .await
        .unwrap();
    assert_eq!(minted.status(), StatusCode::OK);
    let token = minted.json::<serde_json::Value>().await.unwrap()["token"].as_str().unwrap().to_owned();
    let address: String = sqlx::query_scalar("SELECT data_address FROM machines WHERE name = 'gpu-01'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let get = |path: String| {
        let request = http.get(format!("{address}/v1/copies/{path}")).bearer_auth(&token);
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };

    // The token opens big's manifest; the same token for other's copy, its manifest or its
    // file, is refused and says why.
    assert_eq!(get("default.big/manifest".into()).await.0, StatusCode::OK);
    for path in ["default.other/manifest", "default.other/files/blob"] {
        let (status, body) = get(path.into()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(body.contains("default.other"), "{path}: {body}");
    }
    cluster.stop().await;
}

/// A CA made for the test, and the data-port TLS of a machine whose certificate it signs for
/// 127.0.0.1, trusting `trusted` alone.
struct TestCa {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa { pem, issuer: Issuer::new(params, key) }
    }

    fn peers(&self, trusted: &TestCa) -> astraeus::agent::PeerConfig {
        use astraeus::agent::peer::tls::{self, PemFile};
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        let path = std::path::Path::new("test.pem");
        let pem = |flag, text: String| PemFile { flag, path, bytes: text.into_bytes() };
        let server = tls::server(&pem(tls::CERT_FLAG, cert), &pem(tls::KEY_FLAG, key.serialize_pem()), None);
        astraeus::agent::PeerConfig {
            tls: Some(std::sync::Arc::new(server.unwrap())),
            trust: tls::Trust::cas(&pem(tls::CA_FLAG, trusted.pem.clone())).unwrap(),
            ..Default::default()
        }
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_is_pulled_from_a_peer_over_https_and_a_certificate_refused_sends_the_fill_to_the_origin(
    pool: PgPool,
) {
    let (ours, theirs) = (TestCa::new("ours"), TestCa::new("theirs"));
    let mut cluster = Cluster::start(&pool).await;
    cluster.add_peer_machine_with("gpu-01", ours.peers(&ours)).await;
    cluster.add_peer_machine_with("gpu-02", ours.peers(&ours)).await;
    // gpu-03 trusts another CA than the one that signs the others' certificates.
    cluster.add_peer_machine_with("gpu-03", ours.peers(&theirs)).await;
    let address: String = sqlx::query_scalar("SELECT data_address FROM machines WHERE name = 'gpu-01'")
        .fetch_one(&cluster.db)
        .await
        .unwrap();
    assert!(address.starts_with("https://127.0.0.1:"), "{address}");
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("blobs", 1_000_000, true, BLOB_FILL, 0.5)).await;
    api.create_run(&pinned(run_mounting("first", "true", &["blobs"], 0.5), "gpu-01")).await;
    api.wait_completed("first").await;
    let digest = manifest_of(&api, "gpu-01", "blobs").await;

    // gpu-02 trusts gpu-01's certificate: it pulls the copy over HTTPS.
    api.create_run(&pinned(run_mounting("second", "true", &["blobs"], 0.5), "gpu-02")).await;
    api.wait_completed("second").await;
    let blob =
        |machine: &str| std::fs::read(cluster.machine(machine).data.path().join("drives/default.blobs/blob"));
    assert_eq!(blob("gpu-02").unwrap(), blob("gpu-01").unwrap());
    assert_eq!(manifest_of(&api, "gpu-02", "blobs").await, digest);
    let copies = api.drive("blobs").await["copies"].clone();
    let gpu02 = copies.as_array().unwrap().iter().find(|c| c["node"] == "gpu-02").unwrap().clone();
    assert_eq!(gpu02["source"], json!("peer gpu-01"), "{copies}");

    // gpu-03 refuses whichever holder it is sent to: it tries the other, then the fill goes to
    // the origin, saying why.
    api.create_run(&pinned(run_mounting("third", "true", &["blobs"], 0.5), "gpu-03")).await;
    api.wait_completed("third").await;
    let failed = api.events_with("drive/blobs", "PeerFillFailed").await;
    let mut messages: Vec<&str> = failed.iter().map(|e| e["message"].as_str().unwrap()).collect();
    messages.sort_by_key(|m| m.ends_with("filling from the origin"));
    assert_eq!(messages.len(), 2, "{messages:?}");
    for message in &messages {
        assert!(message.contains("cannot pull over TLS from the peer at https://127.0.0.1:"), "{message}");
    }
    assert!(
        messages[0].contains(": invalid peer certificate: UnknownIssuer; pulling from peer gpu-0"),
        "{messages:?}"
    );
    assert!(
        messages[1].contains(": invalid peer certificate: UnknownIssuer; filling from the origin"),
        "{messages:?}"
    );
    let copies = api.drive("blobs").await["copies"].clone();
    let gpu03 = copies.as_array().unwrap().iter().find(|c| c["node"] == "gpu-03").unwrap().clone();
    assert_eq!((&gpu03["state"], &gpu03["source"]), (&json!("Complete"), &json!("fill")), "{copies}");
    cluster.stop().await;
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_copy_being_pulled_feeds_the_next_machine_before_it_is_whole(pool: PgPool) {
    let mut cluster = Cluster::start(&pool).await;
    // gpu-01 sends 2 MB/s: gpu-02's pull of 24 MB lasts twelve seconds.
    cluster.add_peer_machine_with("gpu-01", slow(false, 2_000_000)).await;
    cluster.add_peer_machine("gpu-02").await;
    cluster.add_peer_machine("gpu-03").await;
    let api = cluster.api.clone();
    api.create_drive(&placed_drive("big", BIG, true, BIG_FILL, 0.5)).await;
    let digest = fill_on(&api, "big", "gpu-01").await;
    let reader = |name: &str| run_mounting(name, "cmp -s /data/blob /data/blob", &["big"], 0.5);
    api.create_run(&pinned(reader("second"), "gpu-02")).await;
    wait_received(&cluster, "gpu-02", "default.big", "blob", 1).await;

    // gpu-01 serves one pull at a time: gpu-03 pulls from gpu-02, which passes on each chunk it
    // has checked while it still receives the rest.
    api.create_run(&pinned(reader("third"), "gpu-03")).await;
    wait_received(&cluster, "gpu-03", "default.big", "blob", CHUNK).await;
    let gpu02 = copy_on(&api, "big", "gpu-02").await;
    assert_eq!(gpu02["state"], json!("Filling"), "gpu-02 is not whole yet: {gpu02}");
    assert!(received(&cluster, "gpu-02", "default.big", "blob") < BIG);

    api.wait_completed("second").await;
    api.wait_completed("third").await;
    let gpu03 = copy_on(&api, "big", "gpu-03").await;
    assert_eq!((&gpu03["state"], &gpu03["source"]), (&json!("Complete"), &json!("peer gpu-02")), "{gpu03}");
    assert_eq!(manifest_of(&api, "gpu-03", "big").await, digest);
    let blob =
        |machine: &str| std::fs::read(cluster.machine(machine).copy_dir("default.big").join("blob")).unwrap();
    assert!(blob("gpu-01") == blob("gpu-03"), "the copies differ");
    cluster.stop().await;
}
