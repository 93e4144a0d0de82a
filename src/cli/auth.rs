//! `auth login --with-token`, `auth status` and `auth logout`: the stored login. The token itself is
//! never printed; status reads the workspace, role and expiry from its claims.

use std::io::Read;

use base64::Engine;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::Value;

use super::Ctx;
use super::client::Client;
use super::config::{self, Source, Stored};
use super::error::{CliError, Result};
use super::output::{self, field, text};

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Store a token for later commands: `astra auth login --with-token < token.txt`.
    Login {
        /// Read the token from stdin.
        #[arg(long, required = true)]
        with_token: bool,
    },
    /// Show the API, the token's workspace, role and expiry, and whether the API accepts it.
    Status,
    /// Forget the stored token.
    Logout,
}

pub async fn run(ctx: &Ctx, command: AuthCommand) -> Result<()> {
    match command {
        AuthCommand::Login { .. } => login(ctx).await,
        AuthCommand::Status => status(ctx).await,
        AuthCommand::Logout => logout(),
    }
}

/// The claims of a JWT, read without verifying it: only the API can say whether it is valid.
pub fn claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    let bytes =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn who(claims: &Value) -> String {
    let org = if claims["org"].as_bool() == Some(true) { ", organisation admin" } else { "" };
    format!("workspace {} (role {}{org})", text(&claims["ws"]), text(&claims["role"]))
}

/// Any read the token's role allows, to learn whether the API accepts it.
async fn check(client: &Client) -> Result<()> {
    client.get("/runs?limit=1").await.map(drop)
}

async fn login(ctx: &Ctx) -> Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| CliError::failed(format!("cannot read stdin: {e}")))?;
    let token = input.trim().to_owned();
    if token.is_empty() {
        return Err(CliError::failed("no token on stdin: astra auth login --with-token < token.txt"));
    }
    let mut target = ctx.target.clone();
    target.token = Some(token.clone());
    check(&Client::new(&target)?).await?;
    let mut stored = config::load()?;
    stored.api = Some(target.api.clone());
    stored.token = Some(token.clone());
    let path = config::save(&stored)?;
    let as_whom = claims(&token).map(|c| format!(" to {}", who(&c))).unwrap_or_default();
    output::emit(&format!(
        "Logged in{as_whom} at {}; the token is stored in {}\n",
        target.api,
        path.display()
    ))?;
    if ctx.target.token_source == Source::Env {
        eprintln!("note: ASTRAEUS_TOKEN is set, and is used instead of the stored token while it is");
    }
    Ok(())
}

async fn status(ctx: &Ctx) -> Result<()> {
    let t = &ctx.target;
    let mut out = String::new();
    field(&mut out, "API", format!("{} ({})", t.api, t.api_source.describe("--api", "ASTRAEUS_API")));
    let Some(token) = &t.token else {
        output::emit(&out)?;
        return Err(CliError::failed(
            "not logged in: set ASTRAEUS_TOKEN, pass --token, or run `astra auth login --with-token`",
        ));
    };
    field(&mut out, "Token", t.token_source.describe("--token", "ASTRAEUS_TOKEN"));
    if let Some(c) = claims(token) {
        field(&mut out, "Workspace", text(&c["ws"]));
        let org = if c["org"].as_bool() == Some(true) { " (organisation admin)" } else { "" };
        field(&mut out, "Role", format!("{}{org}", text(&c["role"])));
        if let Some(exp) = c["exp"].as_i64().and_then(|s| DateTime::<Utc>::from_timestamp(s, 0)) {
            let left = exp - Utc::now();
            let when = if left.num_seconds() > 0 {
                format!("in {}", output::age_since(Utc::now() - left, Utc::now()))
            } else {
                "expired".into()
            };
            field(
                &mut out,
                "Expires",
                format!("{} ({when})", exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            );
        }
    }
    let verdict = check(&ctx.client()?).await;
    field(&mut out, "Accepted", if verdict.is_ok() { "yes" } else { "no" });
    output::emit(&out)?;
    verdict
}

fn logout() -> Result<()> {
    let mut stored = config::load()?;
    if stored.token.take().is_none() {
        return output::emit("Not logged in: no token is stored\n");
    }
    let path = config::save(&Stored { api: stored.api, token: None })?;
    output::emit(&format!("Logged out: the token is removed from {}\n", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claims_of_a_jwt_are_read_without_its_signature() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(r#"{"ws":"default","role":"editor","org":false,"exp":1}"#);
        let c = claims(&format!("e30.{payload}.sig")).unwrap();
        assert_eq!(who(&c), "workspace default (role editor)");
        assert!(claims("not-a-jwt").is_none());
    }
}
