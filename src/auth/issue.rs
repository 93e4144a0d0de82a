//! Issuing a token: record its id, then sign it. Used by the API and by `astraeus admin token`.

use chrono::{Duration, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Keys;
use super::token::{NewClaims, mint};
use crate::domain::role::Role;
use crate::store::tokens::{self, NewToken, TokenRecord};
use crate::store::workspaces::Workspace;

pub struct Request<'a> {
    pub workspace: &'a Workspace,
    pub name: &'a str,
    pub role: Role,
    pub org_admin: bool,
    pub ttl: Duration,
}

/// Writes the token's row and returns it with the signed token, which is never stored.
pub async fn issue(
    db: impl PgExecutor<'_>,
    keys: &Keys,
    r: &Request<'_>,
) -> sqlx::Result<(TokenRecord, String)> {
    let id = Uuid::now_v7();
    let issued_at = Utc::now();
    let expires_at = issued_at + r.ttl;
    let record = tokens::insert(
        db,
        &NewToken {
            id,
            workspace_id: r.workspace.id,
            name: r.name,
            role: r.role.as_str(),
            org_admin: r.org_admin,
            expires_at,
        },
    )
    .await?;
    let jwt = mint(
        keys,
        &NewClaims {
            id,
            name: r.name,
            workspace_id: r.workspace.id,
            workspace: &r.workspace.name,
            role: r.role,
            org_admin: r.org_admin,
            issued_at,
            expires_at,
        },
    );
    Ok((record, jwt))
}

/// Reads durations such as `30d`, `12h`, `90m`, `45s`.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = digits.parse().map_err(|_| format!("{s:?} is not a duration like 30d, 12h or 90m"))?;
    let ttl = match unit {
        "d" => Duration::days(n),
        "h" => Duration::hours(n),
        "m" => Duration::minutes(n),
        "s" | "" => Duration::seconds(n),
        _ => return Err(format!("{s:?} is not a duration like 30d, 12h or 90m")),
    };
    if n <= 0 || ttl > Duration::days(3650) {
        return Err(format!("{s:?} must be between 1 second and 10 years"));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_read_like_people_write_them() {
        assert_eq!(parse_ttl("30d"), Ok(Duration::days(30)));
        assert_eq!(parse_ttl("12h"), Ok(Duration::hours(12)));
        assert_eq!(parse_ttl("90m"), Ok(Duration::minutes(90)));
        assert_eq!(parse_ttl("45"), Ok(Duration::seconds(45)));
        assert!(parse_ttl("0d").is_err());
        assert!(parse_ttl("soon").is_err());
        assert!(parse_ttl("30w").is_err());
        assert!(parse_ttl("99999d").is_err());
    }
}
