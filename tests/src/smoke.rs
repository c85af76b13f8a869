//! The deployer's smoke test (issue 26), behind `bash scripts/smoke.sh`: after a deploy, one
//! canary job through the real job queue to its fence, one poison job to its letter (then
//! discarded, with a reason), and the operators' API read with a token, all through what a
//! deployed stack exposes (its job queue and its API), never its database.
//!
//! The canary is a real job of the consumer: give it a payload whose effect is harmless (a test
//! account). Its fence expires with the TTL like any other. The poison letter opens an incident
//! for its group like any other letter; discarding it resolves the group, and the incident with
//! the next delivery round. `--no-letter` leaves that part out.

use dlq::client::{ApiError, Client};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What to check, and where.
#[derive(Debug, Clone)]
pub struct SmokeSpec {
    /// The consumer's job queue URL.
    pub queue_url: String,
    /// The operators' API.
    pub api_url: String,
    /// A token with the read scope (and discard, to clean the letter up).
    pub token: String,
    /// The consumer (`CONSUMER_NAME`).
    pub consumer: String,
    /// The canary's payload.
    pub payload: Value,
    /// Also send a poison job and discard its letter.
    pub with_letter: bool,
    /// How long each step may take.
    pub timeout: Duration,
}

/// One step's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What was checked.
    pub name: &'static str,
    /// `Ok(what was seen)` or `Err(what went wrong)`.
    pub outcome: Result<String, String>,
}

/// Runs the smoke test; every step, in order (it stops at the first that fails).
pub async fn run(spec: &SmokeSpec, sqs: &aws_sdk_sqs::Client) -> Vec<Step> {
    let mut steps = Vec::new();
    let api = match Client::new(&spec.api_url, spec.token.clone()) {
        Ok(api) => api,
        Err(e) => {
            steps.push(Step {
                name: "the API",
                outcome: Err(e),
            });
            return steps;
        }
    };
    let run_id = Uuid::new_v4().simple().to_string()[..8].to_owned();
    let checks: [(&'static str, Check); 3] = [
        ("the API answers a read", Check::Read),
        ("a canary job reaches its fence", Check::Canary),
        (
            "a poison job becomes a letter, then is discarded",
            Check::Letter,
        ),
    ];
    for (name, check) in checks {
        if check == Check::Letter && !spec.with_letter {
            continue;
        }
        let outcome = match check {
            Check::Read => read(&api).await,
            Check::Canary => canary(spec, sqs, &api, &run_id).await,
            Check::Letter => letter(spec, sqs, &api, &run_id).await,
        };
        let failed = outcome.is_err();
        steps.push(Step { name, outcome });
        if failed {
            break;
        }
    }
    steps
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Read,
    Canary,
    Letter,
}

/// The steps as lines for a person, and whether all passed.
pub fn report(steps: &[Step]) -> (String, bool) {
    let mut out = String::new();
    for step in steps {
        let (mark, text) = match &step.outcome {
            Ok(seen) => ("ok  ", seen),
            Err(why) => ("FAIL", why),
        };
        let _ = writeln!(out, "{mark} {}: {text}", step.name);
    }
    let passed = !steps.is_empty() && steps.iter().all(|s| s.outcome.is_ok());
    (out, passed)
}

async fn read(api: &Client) -> Result<String, String> {
    let groups = api.groups(&[]).await.map_err(|e| match e {
        ApiError::Refused {
            status: 401 | 403, ..
        } => format!(
            "{e}: the token needs the scope core.dead_letters.read (and .discard for the letter)"
        ),
        e => e.to_string(),
    })?;
    Ok(format!("{} failure group(s) listed", groups.items.len()))
}

async fn send(spec: &SmokeSpec, sqs: &aws_sdk_sqs::Client, body: &str) -> Result<String, String> {
    sqs.send_message()
        .queue_url(&spec.queue_url)
        .message_body(body)
        .send()
        .await
        .map_err(|e| {
            format!(
                "SendMessage to {}: {}",
                spec.queue_url,
                aws_sdk_sqs::error::DisplayErrorContext(e)
            )
        })
        .map(|out| out.message_id.unwrap_or_default())
}

/// A smoke job's envelope, charged to the all-ones tenant (no real tenant's).
fn envelope(job_id: Uuid, correlation_id: String, payload: Value) -> String {
    let tenant = shared::ids::TenantId(Uuid::from_u128(u128::MAX));
    shared_testkit::envelope(shared::ids::JobId(job_id), tenant, &correlation_id, payload)
}

async fn canary(
    spec: &SmokeSpec,
    sqs: &aws_sdk_sqs::Client,
    api: &Client,
    run_id: &str,
) -> Result<String, String> {
    let job = Uuid::new_v4();
    let body = envelope(job, format!("smoke-{run_id}-canary"), spec.payload.clone());
    let message = send(spec, sqs, &body).await?;
    let started = Instant::now();
    loop {
        if let Some(fence) = api
            .processed_job(job, &spec.consumer)
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(format!(
                "job {job} (message {message}) committed at {} in {:.1} s; its fence holds until {}",
                fence["processed_at"].as_str().unwrap_or("?"),
                started.elapsed().as_secs_f64(),
                fence["expires_at"].as_str().unwrap_or("?")
            ));
        }
        let letters = letters_of(api, job).await?;
        if let Some(letter) = letters.first() {
            return Err(format!(
                "job {job} was dead-lettered instead ({} letter {}: {}): the canary's payload \
                 does not suit {}, or the consumer fails",
                letter["error_kind"].as_str().unwrap_or("?"),
                letter["id"].as_str().unwrap_or("?"),
                letter["last_error"].as_str().unwrap_or("?"),
                spec.consumer
            ));
        }
        if started.elapsed() > spec.timeout {
            return Err(format!(
                "job {job} (message {message}) has no fence for {} after {:?}: is the consumer \
                 subscribed to {}? See its log group and its Errors alarm",
                spec.consumer, spec.timeout, spec.queue_url
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn letters_of(api: &Client, job: Uuid) -> Result<Vec<Value>, String> {
    let page = api
        .letters_raw(&[("job_id".into(), job.to_string())])
        .await
        .map_err(|e| e.to_string())?;
    Ok(page["items"].as_array().cloned().unwrap_or_default())
}

async fn letter(
    spec: &SmokeSpec,
    sqs: &aws_sdk_sqs::Client,
    api: &Client,
    run_id: &str,
) -> Result<String, String> {
    let job = Uuid::new_v4();
    // A string where the consumer's payload is an object: poison, never run.
    let body = envelope(
        job,
        format!("smoke-{run_id}-poison"),
        json!("smoke test: not a payload"),
    );
    send(spec, sqs, &body).await?;
    let started = Instant::now();
    let letter = loop {
        if let Some(letter) = letters_of(api, job).await?.into_iter().next() {
            break letter;
        }
        if started.elapsed() > spec.timeout {
            return Err(format!(
                "the poison job {job} has no letter after {:?}: the consumer did not record it",
                spec.timeout
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let id: Uuid = letter["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("a letter without an id: {letter}"))?;
    if letter["error_kind"] != "poison" {
        return Err(format!(
            "letter {id} is {}, not poison",
            letter["error_kind"]
        ));
    }
    let reason = format!("smoke test {run_id}: its own poison job, cleaned up");
    api.discard(id, &reason).await.map_err(|e| {
        format!("letter {id} was written, but discarding it failed ({e}): discard it by hand")
    })?;
    Ok(format!(
        "letter {id} (poison) in {:.1} s, discarded",
        started.elapsed().as_secs_f64()
    ))
}
