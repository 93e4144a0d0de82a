//! Bearer tokens: every way a token can be wrong answers 401 with the error body, revocation
//! takes effect on the next request, and tokens are shown once.

use astraeus::auth::Keys;
use astraeus::domain::role::Role;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{Duration, Utc};
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::*;

/// GET /drives with `authorization` as the whole Authorization header (none when `None`).
async fn drives_with_header(app: &TestApp, authorization: Option<&str>) -> Reply {
    let mut req = app.client.get(format!("{}/drives", app.api));
    if let Some(value) = authorization {
        req = req.header("authorization", value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    Reply { status, text: resp.text().await.unwrap() }
}

async fn drives_with(app: &TestApp, token: &str) -> Reply {
    app.request(Method::GET, "/drives", Some(token), None).await
}

/// A 401 with the one error shape, `code` `unauthorized`, whose message mentions `why`.
#[track_caller]
fn assert_unauthorized(reply: &Reply, why: &str, case: &str) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{case}: {}", reply.text);
    let body = reply.json();
    assert_eq!(body["error"]["code"], "unauthorized", "{case}: {}", reply.text);
    assert!(reply.message().contains(why), "{case}: message {:?} should mention {why:?}", reply.message());
    assert_eq!(body.as_object().unwrap().len(), 1, "{case}: only `error`: {}", reply.text);
}

/// The server's signing key, as the test knows it.
fn app_key(app: &TestApp) -> EncodingKey {
    EncodingKey::from_ed_pem(app.signing_pem.as_bytes()).unwrap()
}

fn sign(key: &EncodingKey, alg: Algorithm, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

/// The claims of a real, active editor token, to forge from: each forgery then differs from a
/// good token in exactly one way.
async fn good_claims(app: &TestApp) -> Value {
    claims_of(&app.token_for("default", Role::Editor, false).await)
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_valid_token_is_accepted(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let reply = drives_with(&app, &app.token).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["items"], json!([]));

    // The forging below is sound: the same claims re-signed with the server's key work.
    let resigned = sign(&app_key(&app), Algorithm::EdDSA, &good_claims(&app).await);
    let reply = drives_with(&app, &resigned).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_request_without_a_bearer_token_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_unauthorized(&drives_with_header(&app, None).await, "no token", "no header");
    for header in ["Basic dXNlcjpwYXNz", &format!("Token {}", app.token), &app.token, "Bearer", ""] {
        let reply = drives_with_header(&app, Some(header)).await;
        assert_unauthorized(&reply, "Bearer <token>", &format!("header {header:?}"));
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_garbage_token_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for garbage in ["garbage", "a.b.c", "...", "Bearer", "eyJhbGciOiJFZERTQSJ9.e30.AAAA"] {
        let reply = drives_with_header(&app, Some(&format!("Bearer {garbage}"))).await;
        assert_unauthorized(&reply, "not valid", &format!("token {garbage:?}"));
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_expired_token_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let expired = app.token_with_ttl("default", Role::Admin, true, Duration::hours(-1)).await;
    assert_unauthorized(&drives_with(&app, &expired).await, "expired", "expired an hour ago");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_for_another_audience_or_issuer_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let key = app_key(&app);
    let good = good_claims(&app).await;
    let cases = [
        ("aud", json!("astraeus-machine"), "wrong audience"),
        ("aud", json!("someone-else"), "wrong audience"),
        ("iss", json!("mallory"), "wrong issuer"),
        ("iss", json!(""), "wrong issuer"),
    ];
    for (claim, value, why) in cases {
        let mut claims = good.clone();
        claims[claim] = value.clone();
        let reply = drives_with(&app, &sign(&key, Algorithm::EdDSA, &claims)).await;
        assert_unauthorized(&reply, why, &format!("{claim} = {value}"));
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_missing_a_required_claim_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let key = app_key(&app);
    let good = good_claims(&app).await;
    for claim in ["exp", "aud", "iss", "sub", "jti", "wid", "role"] {
        let mut claims = good.clone();
        claims.as_object_mut().unwrap().remove(claim);
        let reply = drives_with(&app, &sign(&key, Algorithm::EdDSA, &claims)).await;
        // jsonwebtoken reads the claims before it checks the required ones, so each of these
        // is "malformed" rather than "missing claim": either way, not valid.
        assert_unauthorized(&reply, "not valid", &format!("without {claim}"));
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_not_valid_yet_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let mut claims = good_claims(&app).await;
    claims["nbf"] = json!((Utc::now() + Duration::hours(1)).timestamp());
    let reply = drives_with(&app, &sign(&app_key(&app), Algorithm::EdDSA, &claims)).await;
    assert_unauthorized(&reply, "not valid yet", "nbf in an hour");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_unsigned_alg_none_token_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let payload = app.token.split('.').nth(1).unwrap();
    for header in [r#"{"alg":"none","typ":"JWT"}"#, r#"{"alg":"none"}"#, r#"{"alg":"None"}"#] {
        let unsigned = format!("{}.{payload}.", URL_SAFE_NO_PAD.encode(header));
        assert_unauthorized(&drives_with(&app, &unsigned).await, "not valid", header);
        // And with the real signature left on.
        let signature = app.token.split('.').nth(2).unwrap();
        let relabelled = format!("{}.{payload}.{signature}", URL_SAFE_NO_PAD.encode(header));
        assert_unauthorized(&drives_with(&app, &relabelled).await, "not valid", header);
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_hs256_token_keyed_with_the_public_key_is_unauthorized(db: sqlx::PgPool) {
    // Key confusion: a verifier that trusts the header's `alg` would check this HMAC with the
    // public key, which anyone may know.
    let app = spawn_app(db).await;
    let claims = good_claims(&app).await;
    let public = SigningKey::from_pkcs8_pem(&app.signing_pem).unwrap().verifying_key();
    let secrets: [(&str, Vec<u8>); 3] = [
        ("raw public key", public.as_bytes().to_vec()),
        ("base64url public key", URL_SAFE_NO_PAD.encode(public.as_bytes()).into_bytes()),
        ("public key PEM", public.to_public_key_pem(LineEnding::LF).unwrap().into_bytes()),
    ];
    for (what, secret) in secrets {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let forged = sign(&EncodingKey::from_secret(&secret), alg, &claims);
            let reply = drives_with(&app, &forged).await;
            assert_unauthorized(&reply, "not valid", &format!("{alg:?} keyed with the {what}"));
        }
    }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_with_a_flipped_signature_bit_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let parts: Vec<&str> = app.token.split('.').collect();
    let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    for (byte, bit) in [(0, 0), (17, 3), (signature.len() - 1, 7)] {
        let mut flipped = signature.clone();
        flipped[byte] ^= 1 << bit;
        let token = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(&flipped));
        assert_unauthorized(
            &drives_with(&app, &token).await,
            "bad signature",
            &format!("byte {byte} bit {bit}"),
        );
    }
    // A changed payload under the original signature fails the same way.
    let mut claims = claims_of(&app.token);
    claims["role"] = json!("admin");
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    let token = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert_unauthorized(&drives_with(&app, &token).await, "bad signature", "editor raised to admin");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_signed_by_another_key_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let other_pem = Keys::generate_pem().unwrap();
    let other = EncodingKey::from_ed_pem(other_pem.as_bytes()).unwrap();
    let forged = sign(&other, Algorithm::EdDSA, &good_claims(&app).await);
    assert_unauthorized(&drives_with(&app, &forged).await, "bad signature", "another Ed25519 key");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_token_whose_kid_names_an_unknown_key_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let claims = good_claims(&app).await;
    let removed = Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap().newest().id.clone();
    let long = "a".repeat(1000);
    for kid in [removed.as_str(), "", "../../signing-key.pem", &long] {
        // Signed with the server's own key: only the kid is wrong.
        let header = Header { kid: Some(kid.to_owned()), ..Header::new(Algorithm::EdDSA) };
        let token = jsonwebtoken::encode(&header, &claims, &app_key(&app)).unwrap();
        let reply = drives_with(&app, &token).await;
        assert_unauthorized(
            &reply,
            "signed with an unknown key",
            &format!("kid {:?}", &kid[..kid.len().min(20)]),
        );
        assert!(!reply.text.contains(kid) || kid.is_empty(), "the kid is not echoed: {}", reply.text);
    }
    // The same token naming the server's key is accepted: the kid alone made the difference.
    let header = Header { kid: Some(app.keys.newest().id.clone()), ..Header::new(Algorithm::EdDSA) };
    let token = jsonwebtoken::encode(&header, &claims, &app_key(&app)).unwrap();
    assert_eq!(drives_with(&app, &token).await.status, 200);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_well_signed_token_the_server_never_issued_is_unauthorized(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let mut claims = good_claims(&app).await;
    claims["jti"] = json!(uuid::Uuid::now_v7());
    let reply = drives_with(&app, &sign(&app_key(&app), Algorithm::EdDSA, &claims)).await;
    assert_unauthorized(&reply, "revoked", "unknown jti");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_revoked_token_is_refused_on_its_very_next_request(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, false).await;
    let created = app
        .request(Method::POST, "/tokens", Some(&admin), Some(&json!({"name": "ci", "role": "editor"})))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let (id, token) = (created.json()["id"].as_str().unwrap().to_owned(), created.json()["token"].clone());
    let token = token.as_str().unwrap();
    assert_eq!(claims_of(token)["jti"], id);
    assert_eq!(drives_with(&app, token).await.status, 200);

    let revoked = app.request(Method::DELETE, &format!("/tokens/{id}"), Some(&admin), None).await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert!(revoked.json()["revoked_at"].is_string(), "{}", revoked.text);
    assert_unauthorized(&drives_with(&app, token).await, "revoked", "the next request");

    // Revoking twice is harmless and keeps the first time; other tokens still work.
    let again = app.request(Method::DELETE, &format!("/tokens/{id}"), Some(&admin), None).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json()["revoked_at"], revoked.json()["revoked_at"]);
    assert_eq!(drives_with(&app, &admin).await.status, 200);
    // A revoked admin cannot revoke its way back either.
    let admin_id = claims_of(&admin)["jti"].as_str().unwrap().to_owned();
    let self_revoked = app.request(Method::DELETE, &format!("/tokens/{admin_id}"), Some(&admin), None).await;
    assert_eq!(self_revoked.status, 200, "{}", self_revoked.text);
    let reply = app
        .request(Method::POST, "/tokens", Some(&admin), Some(&json!({"name": "x", "role": "admin"})))
        .await;
    assert_unauthorized(&reply, "revoked", "a revoked admin minting");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_created_token_is_shown_once_and_never_listed(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let admin = app.token_for("default", Role::Admin, false).await;
    let body = json!({"name": "ci", "role": "viewer", "ttl_seconds": 3600});
    let created = app.request(Method::POST, "/tokens", Some(&admin), Some(&body)).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let c = created.json();
    let token = c["token"].as_str().expect("the answer holds the token").to_owned();
    assert_eq!(
        (c["name"].as_str(), c["role"].as_str(), c["org_admin"].as_bool()),
        (Some("ci"), Some("viewer"), Some(false))
    );
    assert!(c["revoked_at"].is_null(), "{}", created.text);
    let claims = claims_of(&token);
    assert_eq!((claims["role"].as_str(), claims["ws"].as_str()), (Some("viewer"), Some("default")));
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 3600);
    assert_eq!(drives_with(&app, &token).await.status, 200);

    let listed = app.request(Method::GET, "/tokens", Some(&admin), None).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let items = listed.json()["items"].as_array().unwrap().clone();
    assert!(items.iter().any(|t| t["id"] == c["id"]), "{}", listed.text);
    for t in &items {
        assert!(t.get("token").is_none(), "a listed token carries no token: {t}");
    }
    // No part of any token appears anywhere in the list: not the new one, not the caller's.
    for jwt in [token.as_str(), admin.as_str(), app.token.as_str()] {
        let signature = jwt.rsplit('.').next().unwrap();
        assert!(!listed.text.contains(signature), "the list leaks a token: {}", listed.text);
    }
    assert!(!listed.text.contains("eyJ"), "the list holds something like a JWT: {}", listed.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn an_editor_cannot_create_tokens(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    for role in ["viewer", "editor", "admin"] {
        let body = json!({"name": "ci", "role": role});
        let reply = app.request(Method::POST, "/tokens", Some(&app.token), Some(&body)).await;
        assert_eq!(reply.status, 403, "{role}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "forbidden");
    }
    let listed = app.request(Method::GET, "/tokens", Some(&app.token), None).await;
    assert_eq!(listed.status, 403, "{}", listed.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn only_an_organisation_admin_mints_organisation_admin_tokens(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    let body = json!({"name": "ops", "role": "admin", "org_admin": true});
    let admin = app.token_for("default", Role::Admin, false).await;
    let reply = app.request(Method::POST, "/tokens", Some(&admin), Some(&body)).await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "forbidden");
    assert!(reply.message().contains("organisation admin"), "{}", reply.message());

    let org_admin = app.token_for("default", Role::Admin, true).await;
    let reply = app.request(Method::POST, "/tokens", Some(&org_admin), Some(&body)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let minted = reply.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(claims_of(&minted)["org"], true);
    let workspaces = app.request(Method::GET, "/workspaces", Some(&minted), None).await;
    assert_eq!(workspaces.status, 200, "the minted token is an organisation admin: {}", workspaces.text);
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_flood_from_one_token_gets_429_with_retry_after_and_spares_other_tokens(db: sqlx::PgPool) {
    let app = spawn_app(db.clone()).await;
    // A second server over the same database with a limit of 5 a second (bursts of 10).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api/v1", listener.local_addr().unwrap());
    let router = astraeus::api::router(astraeus::api::AppState::new(db, app.keys.clone()).with_rate_limit(5));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let get = |token: String| {
        let (client, url) = (app.client.clone(), format!("{base}/drives"));
        async move { client.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let mut limited = None;
    for _ in 0..40 {
        let resp = get(app.token.clone()).await;
        if resp.status() == 429 {
            limited = Some(resp);
            break;
        }
        assert_eq!(resp.status(), 200);
    }
    let resp = limited.expect("40 requests at once from one token are limited");
    let retry: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_requests");
    let other = app.token_for("default", Role::Viewer, false).await;
    assert_eq!(get(other).await.status(), 200, "another token is not slowed");
}
