//! `apply -f FILE|-`: creates the secrets, drives and runs of a JSON document that do not exist yet.
//! The kind comes from the document: `spec.task_template` is a run, `spec.sources` a drive, `data`
//! a secret. Objects are never changed: one that exists is left as it is, and said so.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use super::client::Client;
use super::error::{CliError, Result};
use super::output::{self, Format, text};
use super::{Ctx, Kind};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A JSON file: one object, an array of objects, or several objects one after another; `-`
    /// reads stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
}

/// What the document is, from its shape.
pub fn kind_of(doc: &Value) -> Option<Kind> {
    if doc["spec"].get("task_template").is_some() {
        Some(Kind::Run)
    } else if doc["spec"].get("sources").is_some() {
        Some(Kind::Drive)
    } else if doc.get("data").is_some() {
        Some(Kind::Secret)
    } else {
        None
    }
}

/// The objects in `text`: each top-level object, and the objects of each top-level array.
pub fn documents(text: &str, source: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        match value.map_err(|e| CliError::failed(format!("{source} is not JSON: {e}")))? {
            Value::Array(items) => docs.extend(items),
            other => docs.push(other),
        }
    }
    if docs.is_empty() {
        return Err(CliError::failed(format!("{source} holds no objects")));
    }
    Ok(docs)
}

fn read(file: &PathBuf) -> Result<(String, String)> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::failed(format!("cannot read stdin: {e}")))?;
        return Ok((text, "stdin".into()));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::failed(format!("cannot read {}: {e}", file.display())))?;
    Ok((text, file.display().to_string()))
}

/// Secrets first, then drives, then runs: what a run needs exists before it is submitted.
fn order(kind: Kind) -> u8 {
    match kind {
        Kind::Secret => 0,
        Kind::Drive => 1,
        _ => 2,
    }
}

enum Outcome {
    Created(Value),
    Exists(Value),
}

async fn apply_one(client: &Client, kind: Kind, name: &str, doc: &Value) -> Result<Outcome> {
    let path = kind.path(name);
    if let Some(existing) = client.get_opt(&path).await? {
        return Ok(Outcome::Exists(existing));
    }
    match client.post(&format!("/{}s", kind.as_str()), doc).await {
        Ok(created) => Ok(Outcome::Created(created)),
        // Created by someone else in the meantime.
        Err(e) if e.status() == Some(409) => match client.get_opt(&path).await? {
            Some(existing) => Ok(Outcome::Exists(existing)),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

pub async fn run(ctx: &Ctx, args: ApplyArgs) -> Result<()> {
    let (text_in, source) = read(&args.file)?;
    let mut docs = Vec::new();
    for (i, doc) in documents(&text_in, &source)?.into_iter().enumerate() {
        let at = format!("{source}: object {}", i + 1);
        let kind = kind_of(&doc).ok_or_else(|| {
            CliError::failed(format!(
                "{at}: cannot tell its kind: a run has spec.task_template, a drive spec.sources, a secret data"
            ))
        })?;
        let name = text(&doc["metadata"]["name"]);
        if name.is_empty() {
            return Err(CliError::failed(format!("{at}: a {} needs metadata.name", kind.as_str())));
        }
        docs.push((kind, name, doc));
    }
    docs.sort_by_key(|(kind, _, _)| order(*kind));

    let client = ctx.client()?;
    let mut failed = 0;
    for (kind, name, doc) in &docs {
        let k = kind.as_str();
        match apply_one(&client, *kind, name, doc).await {
            Ok(outcome) => {
                let (object, said) = match outcome {
                    Outcome::Created(o) => (o, "created"),
                    Outcome::Exists(o) => (o, "unchanged (exists)"),
                };
                match ctx.format {
                    Format::Json => output::emit(&output::json(&object))?,
                    Format::Name => output::emit(&format!("{k}/{name}\n"))?,
                    _ => output::emit(&format!("{k} {name} {said}\n"))?,
                }
            }
            Err(e) if docs.len() == 1 => return Err(e.about(k, name)),
            Err(e) => {
                failed += 1;
                e.about(k, name).report();
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(CliError::failed(format!("{n} of {} objects could not be created", docs.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_kind_comes_from_the_shape_of_the_document() {
        assert_eq!(kind_of(&json!({"spec": {"task_template": {}}})), Some(Kind::Run));
        assert_eq!(kind_of(&json!({"spec": {"sources": []}})), Some(Kind::Drive));
        assert_eq!(kind_of(&json!({"metadata": {}, "data": {"K": "v"}})), Some(Kind::Secret));
        assert_eq!(kind_of(&json!({"spec": {}})), None);
    }

    #[test]
    fn a_file_may_hold_an_object_an_array_or_objects_in_a_row() {
        assert_eq!(documents(r#"{"a": 1}"#, "f").unwrap().len(), 1);
        assert_eq!(documents(r#"[{"a": 1}, {"b": 2}]"#, "f").unwrap().len(), 2);
        assert_eq!(documents("{\"a\": 1}\n{\"b\": 2}\n", "f").unwrap().len(), 2);
        assert!(documents("", "f").is_err());
        assert!(documents("{", "f").is_err());
    }
}
