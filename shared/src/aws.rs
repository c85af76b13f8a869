//! The AWS SDK as every function builds it: every call (SQS, Secrets Manager) has a timeout
//! shorter than what it could otherwise eat of a Lambda's deadline.
//!
//! Invariant: one call costs at most [`SDK_OPERATION_TIMEOUT`], retries included; a consumer
//! keeps more than that free before its deadline (`DEADLINE_MARGIN_MS` is checked against it).

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use std::time::Duration;

/// Opening a connection to an AWS endpoint.
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// One attempt of a call.
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1_500);
/// A whole call, its one retry included.
pub const SDK_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// The SDK configuration from the environment (region, credentials, `AWS_ENDPOINT_URL_*`), with
/// the timeouts above and at most two attempts per call.
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(SDK_CONNECT_TIMEOUT)
                .operation_attempt_timeout(SDK_ATTEMPT_TIMEOUT)
                .operation_timeout(SDK_OPERATION_TIMEOUT)
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .load()
        .await
}
