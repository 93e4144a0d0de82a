//! `astraeus admin`: make or rotate the signing key, print a token.

use anyhow::Context;
use secrecy::ExposeSecret;

use crate::auth::{Keys, issue, machine::new_join_token};
use crate::domain::Name;
use crate::settings::{AdminCommand, JoinTokenArgs, TokenArgs};
use crate::store;

pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Keygen { out, rotate: true, .. } => {
            let id = Keys::rotate_file(&out)?;
            eprintln!(
                "added key {id} to {}: it signs and seals once the servers restart with it",
                out.display()
            );
            Ok(())
        }
        AdminCommand::Keygen { out, force, rotate: false } => {
            Keys::generate_file(&out, force)?;
            eprintln!("wrote a new signing key to {}", out.display());
            Ok(())
        }
        AdminCommand::Token(args) => {
            println!("{}", token(args).await?);
            Ok(())
        }
        AdminCommand::JoinToken(args) => {
            println!("{}", join_token(args).await?);
            Ok(())
        }
    }
}

async fn join_token(args: JoinTokenArgs) -> anyhow::Result<String> {
    let ttl = issue::parse_ttl(&args.ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
    let db = store::connect(args.database.url.expose_secret(), 2).await?;
    if !store::clusters::exists(&db, &args.cluster).await? {
        anyhow::bail!("--cluster: cluster {} does not exist", args.cluster);
    }
    let (token, hash) = new_join_token();
    store::join_tokens::insert(&db, &args.cluster, &hash, chrono::Utc::now() + ttl, args.uses).await?;
    Ok(token)
}

async fn token(args: TokenArgs) -> anyhow::Result<String> {
    let workspace = Name::parse(&args.workspace).map_err(|e| anyhow::anyhow!("--workspace: {e}"))?;
    let name = Name::parse(&args.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let ttl = issue::parse_ttl(&args.ttl).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
    let keys = Keys::load(&args.signing_key_file)?;
    let db = store::connect(args.database.url.expose_secret(), 2).await?;
    let workspace =
        store::workspaces::ensure(&db, workspace.as_str()).await.context("cannot create the workspace")?;
    let request = issue::Request {
        workspace: &workspace,
        name: name.as_str(),
        role: args.role,
        org_admin: args.org_admin,
        ttl,
    };
    let (_, jwt) = issue::issue(&db, &keys, &request).await.context("cannot record the token")?;
    Ok(jwt)
}
