//! The one error type of `astra`: what went wrong in words, and the exit code it maps to.

use std::process::ExitCode;

/// Everything a command can fail with. None of them is shown with `{:?}`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The API answered with an error body: its message (and each field's problem) is shown as is.
    #[error("{message}")]
    Api { status: u16, code: String, message: String, fields: Vec<(String, String)> },
    /// The API could not be reached, or the connection broke.
    #[error("{0}")]
    Http(String),
    /// The command line itself is wrong: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// Anything else that stops a command: a timeout, a bad file, an unexpected state.
    #[error("{0}")]
    Failed(String),
    /// The reader of stdout went away (`| head`): stop quietly.
    #[error("stdout was closed")]
    BrokenPipe,
}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    pub fn failed(message: impl Into<String>) -> CliError {
        CliError::Failed(message.into())
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }

    /// A request that did not get an answer, with the root cause (`Connection refused`).
    pub fn http(url: &str, e: &reqwest::Error) -> CliError {
        let mut cause: &dyn std::error::Error = e;
        while let Some(next) = cause.source() {
            cause = next;
        }
        let what = if e.is_timeout() { "timed out".to_owned() } else { cause.to_string() };
        CliError::Http(format!("cannot reach the API at {url}: {what}"))
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            CliError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Names the object when the API's message does not already (`run x: spec.replicas: …`).
    pub fn about(self, kind: &str, name: &str) -> CliError {
        match self {
            CliError::Api { status, code, message, fields } if !message.contains(name) => {
                CliError::Api { status, code, message: format!("{kind} {name}: {message}"), fields }
            }
            other => other,
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            CliError::BrokenPipe => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        }
    }

    /// Prints the error on stderr the way users read it: `error: …`, then each field below.
    pub fn report(&self) {
        match self {
            CliError::BrokenPipe => {}
            CliError::Api { message, fields, .. } => {
                eprintln!("error: {message}");
                // The message already holds the first field's problem.
                for (path, why) in fields.iter().skip(1) {
                    eprintln!("  {path}: {why}");
                }
            }
            CliError::Usage(message) => {
                eprintln!("error: {message}");
                eprintln!("\nFor more information, try '--help'.");
            }
            other => eprintln!("error: {other}"),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> CliError {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CliError::BrokenPipe
        } else {
            CliError::Failed(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(message: &str) -> CliError {
        CliError::Api { status: 422, code: "invalid".into(), message: message.into(), fields: vec![] }
    }

    #[test]
    fn about_names_the_object_only_when_the_message_does_not() {
        assert_eq!(api("run x not found").about("run", "x").to_string(), "run x not found");
        assert_eq!(
            api("spec.replicas: too many").about("run", "x").to_string(),
            "run x: spec.replicas: too many"
        );
    }

    #[test]
    fn usage_errors_exit_2_and_others_1() {
        assert_eq!(CliError::usage("bad").exit_code(), ExitCode::from(2));
        assert_eq!(api("no").exit_code(), ExitCode::FAILURE);
        assert_eq!(CliError::failed("timed out").exit_code(), ExitCode::FAILURE);
    }
}
