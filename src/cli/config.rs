//! Where `astra` finds its API and token: `--api`/`--token`, then `ASTRAEUS_API`/`ASTRAEUS_TOKEN`,
//! then the stored login in `$XDG_CONFIG_HOME/astra/config.json` (mode 0600).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{CliError, Result};

/// Dev mode's address: what `astra` talks to when nothing else is set.
pub const DEFAULT_API: &str = "http://127.0.0.1:8080/api/v1";

/// The stored login.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Stored {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Where a setting came from, for `auth status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    Stored,
    Default,
}

impl Source {
    pub fn describe(self, flag: &str, env: &str) -> String {
        match self {
            Source::Flag => format!("from {flag}"),
            Source::Env => format!("from {env}"),
            Source::Stored => match path() {
                Ok(p) => format!("stored in {}", p.display()),
                Err(_) => "stored".into(),
            },
            Source::Default => "the default".into(),
        }
    }
}

/// The API and token a command uses.
#[derive(Debug, Clone)]
pub struct Target {
    pub api: String,
    pub api_source: Source,
    pub token: Option<String>,
    pub token_source: Source,
}

/// `$XDG_CONFIG_HOME/astra/config.json`, or `~/.config/astra/config.json`.
pub fn path() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => return Err(CliError::failed("neither XDG_CONFIG_HOME nor HOME is set")),
        },
    };
    Ok(base.join("astra").join("config.json"))
}

pub fn load() -> Result<Stored> {
    let path = path()?;
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| CliError::failed(format!("{} is not valid: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Stored::default()),
        Err(e) => Err(CliError::failed(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Writes the login readable by its owner only, replacing the file in one step.
pub fn save(stored: &Stored) -> Result<PathBuf> {
    let path = path()?;
    let fail = |e: std::io::Error| CliError::failed(format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    }
    let text = serde_json::to_string_pretty(stored).map_err(|e| CliError::failed(e.to_string()))? + "\n";
    let tmp = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)?;
    Ok(path)
}

/// Removes `/` at the end, and adds `/api/v1` to a bare server address.
pub fn normalize_api(api: &str) -> Result<String> {
    let url = reqwest::Url::parse(api.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or_else(|| CliError::usage(format!("the API must be a URL like {DEFAULT_API}, not {api:?}")))?;
    let text = url.as_str().trim_end_matches('/').to_owned();
    Ok(if url.path() == "/" { format!("{text}/api/v1") } else { text })
}

/// Resolves the API and token: flag, then environment, then the stored login.
pub fn resolve(api: Option<&str>, token: Option<&str>) -> Result<Target> {
    let stored = load()?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    // clap reads the flag or, failing that, the environment: tell which one it was.
    let source_of = |value: &str, var: &str| {
        if env(var).as_deref() == Some(value) { Source::Env } else { Source::Flag }
    };
    let (api, api_source) = match api.filter(|a| !a.trim().is_empty()) {
        Some(a) => (a.to_owned(), source_of(a, "ASTRAEUS_API")),
        None => match stored.api {
            Some(a) => (a, Source::Stored),
            None => (DEFAULT_API.to_owned(), Source::Default),
        },
    };
    let (token, token_source) = match token.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => (Some(t.to_owned()), source_of(t, "ASTRAEUS_TOKEN")),
        None => match stored.token {
            Some(t) => (Some(t), Source::Stored),
            None => (None, Source::Default),
        },
    };
    Ok(Target { api: normalize_api(&api)?, api_source, token, token_source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_address_keeps_its_path_and_a_bare_server_gets_api_v1() {
        assert_eq!(normalize_api("http://127.0.0.1:8080/api/v1/").unwrap(), "http://127.0.0.1:8080/api/v1");
        assert_eq!(normalize_api("http://127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080/api/v1");
        assert!(normalize_api("127.0.0.1:8080").is_err());
        assert!(normalize_api("ftp://x/").is_err());
    }
}
