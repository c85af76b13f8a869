//! The API's routes the tool uses: what it reads, the one-letter changes it makes, and the bulk
//! operations it starts, follows and cancels.

use super::error::{ApiError, decode};
use super::http::Client;
use super::types::{Answer, Group, Letter, Operation, Page};
use serde_json::{Value, json};

impl Client {
    /// The fence of `job_id` for `consumer`, if the job committed there (`None` on 404).
    pub async fn processed_job(
        &self,
        job_id: uuid::Uuid,
        consumer: &str,
    ) -> Result<Option<Value>, ApiError> {
        let path = format!("/v1/core/processed-jobs/{job_id}");
        match self
            .get(&path, &[("consumer".into(), consumer.into())])
            .await
        {
            Ok(answer) => Ok(Some(answer.body["processed_job"].clone())),
            // The function's own 404 (`not_found`); API Gateway's for a route it does not
            // have (an older stack) is an error.
            Err(ApiError::Refused {
                status: 404, code, ..
            }) if code == "not_found" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One page of letters.
    pub async fn letters(&self, query: &[(String, String)]) -> Result<Page<Letter>, ApiError> {
        decode(self.get("/v1/core/dead-letters", query).await?)
    }

    /// One page of letters, as the API sent it (`items`, `next_cursor`).
    pub async fn letters_raw(&self, query: &[(String, String)]) -> Result<Value, ApiError> {
        Ok(self.get("/v1/core/dead-letters", query).await?.body)
    }

    /// One letter whole, with its fence and failed replays (the API's body).
    pub async fn letter(&self, id: uuid::Uuid) -> Result<Value, ApiError> {
        Ok(self
            .get(&format!("/v1/core/dead-letters/{id}"), &[])
            .await?
            .body)
    }

    /// One page of groups.
    pub async fn groups(&self, query: &[(String, String)]) -> Result<Page<Group>, ApiError> {
        decode(self.get("/v1/core/dead-letter-groups", query).await?)
    }

    /// One group.
    pub async fn group(&self, id: i64) -> Result<Group, ApiError> {
        let answer = self
            .get(&format!("/v1/core/dead-letter-groups/{id}"), &[])
            .await?;
        let mut group = answer.body["group"].clone();
        if let (Some(fields), Some(again)) = (
            group.as_object_mut(),
            answer.body["failed_replays"].as_array(),
        ) {
            fields.insert("failed_replays".into(), Value::Array(again.clone()));
        }
        decode(Answer {
            status: answer.status,
            body: group,
        })
    }

    /// Replays a letter, saying why.
    pub async fn replay(&self, id: uuid::Uuid, reason: &str) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/replay");
        self.post(&path, &json!({ "reason": reason })).await
    }

    /// Replays a letter with an edited envelope, saying why; with `dry_run`, only the API's
    /// check and plan.
    pub async fn edit(
        &self,
        id: uuid::Uuid,
        body: &Value,
        reason: &str,
        dry_run: bool,
    ) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/edit");
        let request = json!({ "body": body, "reason": reason, "dry_run": dry_run });
        self.post(&path, &request).await
    }

    /// Discards a letter, saying why.
    pub async fn discard(&self, id: uuid::Uuid, reason: &str) -> Result<Answer, ApiError> {
        let path = format!("/v1/core/dead-letters/{id}/discard");
        self.post(&path, &json!({ "reason": reason })).await
    }

    /// Asks for the plan of a bulk `action` (`replay` or `discard`) on `filter` (the list's
    /// query parameters): the API's dry-run answer (`dry_run`, `action`, `selection`, `plan`).
    /// Needs the action's scope.
    pub async fn plan_operation(
        &self,
        action: &str,
        filter: &serde_json::Map<String, Value>,
        reason: &str,
    ) -> Result<Value, ApiError> {
        let path = format!("/v1/core/dead-letter-operations/{action}");
        let body = json!({"reason": reason, "filter": filter, "dry_run": true});
        Ok(self.post(&path, &body).await?.body)
    }

    /// Starts a bulk `action` on `filter` with `reason`: the operation, running. Not repeated
    /// once it may have reached the API (a repeat would start a second operation).
    pub async fn start_operation(
        &self,
        action: &str,
        filter: &serde_json::Map<String, Value>,
        reason: &str,
    ) -> Result<Operation, ApiError> {
        let path = format!("/v1/core/dead-letter-operations/{action}");
        let body = json!({"reason": reason, "filter": filter});
        operation_of(self.post_once(&path, &body).await?)
    }

    /// One operation, with its progress.
    pub async fn operation(&self, id: uuid::Uuid) -> Result<Operation, ApiError> {
        operation_of(
            self.get(&format!("/v1/core/dead-letter-operations/{id}"), &[])
                .await?,
        )
    }

    /// The latest operations, newest first.
    pub async fn operations(&self) -> Result<Vec<Operation>, ApiError> {
        let answer = self.get("/v1/core/dead-letter-operations", &[]).await?;
        decode(Answer {
            status: answer.status,
            body: answer.body["items"].clone(),
        })
    }

    /// Cancels a running operation, saying why: the operation as it stopped.
    pub async fn cancel_operation(
        &self,
        id: uuid::Uuid,
        reason: &str,
    ) -> Result<Operation, ApiError> {
        let path = format!("/v1/core/dead-letter-operations/{id}/cancel");
        operation_of(self.post(&path, &json!({ "reason": reason })).await?)
    }
}

/// The `operation` of an answer.
fn operation_of(answer: Answer) -> Result<Operation, ApiError> {
    decode(Answer {
        status: answer.status,
        body: answer.body["operation"].clone(),
    })
}
