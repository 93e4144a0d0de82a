//! The agent's side of the agent API.

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::auth::PublicKeys;
use crate::protocol::{
    Ack, Assignments, HeartbeatRequest, HeartbeatResponse, JoinRequest, JoinResponse, LogLineIn, LogUpload,
    ServerKeys, StatusReport, assignments_tag,
};

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    credential: String,
}

impl Client {
    pub fn new(server: &str) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build()?;
        Ok(Client {
            http,
            base: format!("{}/agent/v1", server.trim_end_matches('/')),
            credential: String::new(),
        })
    }

    async fn post<B: Serialize, R: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<R> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.credential)
            .timeout(Duration::from_secs(30))
            .json(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        read(resp).await
    }

    /// Uses a machine credential kept from an earlier join.
    pub fn resume(&mut self, credential: &str) {
        self.credential = credential.to_owned();
    }

    /// Joins with the join token and keeps the machine credential it answers with.
    pub async fn join(&mut self, request: &JoinRequest) -> anyhow::Result<JoinResponse> {
        let joined: JoinResponse = self.post("/join", request).await.context("cannot join the cluster")?;
        self.credential = joined.credential.clone();
        Ok(joined)
    }

    pub async fn heartbeat(&self, request: &HeartbeatRequest) -> anyhow::Result<HeartbeatResponse> {
        self.post("/heartbeat", request).await
    }

    /// Answers at once when assignments are newer than `version`, otherwise within `wait`.
    /// `None` when `held` (the agent has the answer for `version`) and nothing changed. An
    /// answer the server sent in parts comes back whole, at the oldest version of its parts,
    /// so that a change made between the parts is asked for again.
    pub async fn assignments(
        &self,
        version: i64,
        held: bool,
        wait_seconds: u64,
    ) -> anyhow::Result<Option<Assignments>> {
        let mut request = self
            .http
            .get(format!("{}/assignments", self.base))
            .query(&[("version", version.to_string()), ("wait_seconds", wait_seconds.to_string())])
            .bearer_auth(&self.credential)
            .timeout(Duration::from_secs(wait_seconds + 15));
        if held {
            request = request.header(reqwest::header::IF_NONE_MATCH, assignments_tag(version));
        }
        let resp = request.send().await.context("cannot reach the server")?;
        if resp.status() == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        let mut whole: Assignments = read(resp).await?;
        while let Some(after) = whole.next.take() {
            let resp = self
                .http
                .get(format!("{}/assignments", self.base))
                .query(&[("after", after.to_string())])
                .bearer_auth(&self.credential)
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .context("cannot reach the server")?;
            let part: Assignments = read(resp).await?;
            whole.version = whole.version.min(part.version);
            whole.workers.extend(part.workers);
            whole.next = part.next;
        }
        Ok(Some(whole))
    }

    /// The server's public keys, each checked to be what its id says.
    pub async fn keys(&self) -> anyhow::Result<PublicKeys> {
        let resp = self
            .http
            .get(format!("{}/keys", self.base))
            .bearer_auth(&self.credential)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        let answer: ServerKeys = read(resp).await?;
        PublicKeys::from_published(&answer.keys).map_err(|why| anyhow::anyhow!("the server's keys: {why}"))
    }

    /// A fresh transfer token for the peer fill `worker`, whose token the holder refused.
    pub async fn transfer_token(&self, worker: Uuid) -> anyhow::Result<String> {
        #[derive(serde::Deserialize)]
        struct Answer {
            token: String,
        }
        let answer: Answer =
            self.post(&format!("/workers/{worker}/transfer-token"), &serde_json::json!({})).await?;
        Ok(answer.token)
    }

    pub async fn report(&self, worker: Uuid, report: &StatusReport) -> anyhow::Result<Ack> {
        self.post(&format!("/workers/{worker}/status"), report).await
    }

    pub async fn logs(&self, worker: Uuid, lines: Vec<LogLineIn>) -> anyhow::Result<Ack> {
        self.post(&format!("/workers/{worker}/logs"), &LogUpload { lines }).await
    }
}

/// The server answered and said no (a 4xx): retrying the same request is pointless.
#[derive(Debug, thiserror::Error)]
#[error("the server answered {status}: {message}")]
pub struct Refused {
    pub status: reqwest::StatusCode,
    pub message: String,
}

pub fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<Refused>().is_some_and(|r| r.status.is_client_error()))
}

/// The server no longer takes the machine's credential: the machine was deleted.
pub fn is_unauthorized(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<Refused>().is_some_and(|r| r.status == reqwest::StatusCode::UNAUTHORIZED))
}

async fn read<R: DeserializeOwned>(resp: reqwest::Response) -> anyhow::Result<R> {
    let status = resp.status();
    if status.is_success() {
        return resp.json().await.context("the server's answer is not what the agent expects");
    }
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    let message = body["error"]["message"].as_str().unwrap_or("no message").to_owned();
    Err(Refused { status, message }.into())
}
