//! The server's public keys on the agent API: what holders check transfer tokens with.

use astraeus::agent::client::Client;
use astraeus::agent::peer::TrustedKeys;
use astraeus::auth::transfer::{TransferClaims, mint_transfer, verify_transfer};
use astraeus::auth::{Keys, PublicKeys};
use astraeus::protocol::ServerKeys;
use uuid::Uuid;

use crate::helpers::*;

fn grant() -> TransferClaims {
    let digest = "0f".repeat(32);
    TransferClaims::new(
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        "default.food101",
        &digest,
        chrono::Utc::now(),
    )
}

async fn keys_as(app: &TestApp, bearer: Option<&str>) -> Reply {
    let mut request = app.client.get(format!("{}/agent/v1/keys", app.address));
    if let Some(b) = bearer {
        request = request.bearer_auth(b);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status();
    Reply { status, text: resp.text().await.unwrap() }
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn a_machine_reads_the_servers_public_keys_and_they_verify_a_transfer_token(db: sqlx::PgPool) {
    // A key file after a rotation: both keys are handed out, oldest first.
    let pem = format!("{}{}", Keys::generate_pem().unwrap(), Keys::generate_pem().unwrap());
    let app = spawn_app_with_keys(db, &pem, |state| state).await;
    let credential = app.join_machine("gpu-01", 4).await;
    let reply = keys_as(&app, Some(&credential)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(!reply.text.contains("PRIVATE"));
    let answer: ServerKeys = serde_json::from_str(&reply.text).unwrap();
    let ids: Vec<&str> = answer.keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, app.keys.ids().collect::<Vec<_>>());
    let public = PublicKeys::from_published(&answer.keys).unwrap();
    let token = mint_transfer(&app.keys, &grant());
    assert!(verify_transfer(&public, &token).is_ok());

    // As the agent holds them: fetched at the first token, and not again within a minute.
    let mut client = Client::new(&app.address).unwrap();
    client.resume(&credential);
    let trusted = TrustedKeys::new(client);
    assert!(trusted.current().is_empty());
    assert_eq!(trusted.verify_transfer(&token).await.unwrap(), verify_transfer(&app.keys, &token).unwrap());
    let foreign = mint_transfer(&Keys::from_pem(&Keys::generate_pem().unwrap()).unwrap(), &grant());
    let refused = trusted.verify_transfer(&foreign).await.unwrap_err();
    assert_eq!(refused.to_string(), "the token is not valid: signed with an unknown key");
    assert!(!trusted.refresh().await, "fetched within the minute already");
}

#[sqlx::test(migrator = "astraeus::store::MIGRATOR")]
async fn the_servers_keys_need_a_machine_credential(db: sqlx::PgPool) {
    let app = spawn_app(db).await;
    assert_eq!(keys_as(&app, None).await.status, 401);
    assert_eq!(keys_as(&app, Some(&app.token)).await.status, 401, "a user token is not a machine's");
    let transfer = mint_transfer(&app.keys, &grant());
    assert_eq!(keys_as(&app, Some(&transfer)).await.status, 401, "nor is a transfer token");
}
