//! A local Lambda: runs a real function binary as a child process and serves it the Lambda
//! Runtime API (`/2018-06-01/runtime/...`, the protocol `lambda_runtime` speaks on AWS and under
//! `cargo lambda watch`). One invocation at a time, as in one Lambda sandbox.
//!
//! Like Lambda, a process that dies or overruns its timeout is discarded and the next invocation
//! starts a fresh one. Each sandbox has its own listener, so nothing a dead process was waiting
//! for can leak into the next. EMF lines on the function's stdout are summed as metrics (counts),
//! and their samples (arrays of values, with a unit) are kept.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

/// What to run and how.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub name: String,
    /// The binary.
    pub binary: PathBuf,
    /// Its environment, on top of this process's.
    pub env: Vec<(String, String)>,
    /// The function timeout: the deadline each invocation gets.
    pub timeout: Duration,
    /// Where its stderr (the logs) goes; `None` discards it.
    pub log_file: Option<PathBuf>,
    /// Send `Lambda-Runtime-Deadline-Ms` as the timeout in milliseconds, a duration, as
    /// cargo-lambda 1.9's emulator (`cargo lambda watch`) does, instead of an epoch time.
    pub deadline_as_duration: bool,
}

/// Why an invocation produced no response.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The process could not be started.
    #[error("could not start {0}")]
    Start(String),
    /// The function returned an error.
    #[error("function error: {0}")]
    Function(String),
    /// The process died during init or the invocation.
    #[error("process exited ({status}){init_error}")]
    Crashed {
        /// How it ended.
        status: ExitStatus,
        /// What it reported to `/runtime/init/error`, if anything.
        init_error: String,
    },
    /// The invocation overran the timeout; the process was killed.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

struct Invocation {
    id: String,
    body: Bytes,
    deadline_ms: u128,
    trace_header: String,
}

type Reply = Result<Bytes, String>;

struct SandboxState {
    function_arn: String,
    next: tokio::sync::Mutex<mpsc::Receiver<Invocation>>,
    reply: Mutex<Option<(String, oneshot::Sender<Reply>)>>,
    init_error: Mutex<Option<String>>,
    /// `GET …/invocation/next` requests so far, the host's count (see [`LambdaHost::nexts`]).
    nexts: Arc<std::sync::atomic::AtomicU32>,
}

struct Sandbox {
    child: Child,
    server: JoinHandle<()>,
    invocations: mpsc::Sender<Invocation>,
    state: Arc<SandboxState>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.server.abort();
        let _ = self.child.start_kill();
    }
}

/// A function that can be invoked; starts its process on first use and after every crash.
pub struct LambdaHost {
    spec: FunctionSpec,
    sandbox: tokio::sync::Mutex<Option<Sandbox>>,
    metrics: Arc<Mutex<Emf>>,
    starts: Mutex<u32>,
    /// The running process's pid (0: none), readable while an invocation holds the sandbox.
    pid: std::sync::atomic::AtomicU32,
    /// The X-Ray trace header of every invocation so far.
    trace_headers: Mutex<Vec<String>>,
    /// How many times its processes asked for the next invocation.
    nexts: Arc<std::sync::atomic::AtomicU32>,
}

/// The scheduled function's local binary (`binary`: a test's
/// `env!("CARGO_BIN_EXE_local-scheduled")`) on the database `pool` connects to, alerting off,
/// with `connections` in its pool and a 40 s timeout.
pub fn scheduled_function(binary: &str, pool: &sqlx::PgPool, connections: u32) -> LambdaHost {
    LambdaHost::new(FunctionSpec {
        name: "scheduled".into(),
        binary: binary.into(),
        env: [
            (
                "DATABASE_URL",
                crate::test_database_url(&pool.connect_options()),
            ),
            ("ALERTING_DISABLED", "true".to_owned()),
            ("DATABASE_POOL_SIZE", connections.to_string()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .to_vec(),
        timeout: Duration::from_secs(40),
        log_file: None,
        deadline_as_duration: false,
    })
}

impl LambdaHost {
    /// A host for `spec`; nothing runs until the first invocation.
    pub fn new(spec: FunctionSpec) -> Self {
        Self {
            spec,
            sandbox: Default::default(),
            metrics: Default::default(),
            starts: Mutex::new(0),
            pid: Default::default(),
            trace_headers: Default::default(),
            nexts: Default::default(),
        }
    }

    /// How many times its processes asked for the next invocation (`GET …/invocation/next`):
    /// the moment Lambda may freeze a sandbox, so whatever an invocation does after its
    /// response (a flush) must be done by then.
    pub fn nexts(&self) -> u32 {
        self.nexts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The `Lambda-Runtime-Trace-Id` each invocation was given, in order: a sampled trace of its
    /// own (`Root=1-<time>-<id>;Parent=<the function's segment>;Sampled=1`), as Lambda gives an
    /// actively traced function.
    pub fn trace_headers(&self) -> Vec<String> {
        self.trace_headers.lock().unwrap().clone()
    }

    /// The sum of every EMF metric the function's processes printed so far.
    pub fn metrics(&self) -> BTreeMap<String, u64> {
        self.metrics.lock().unwrap().counts.clone()
    }

    /// Every sample of the metric `name` the function's processes printed so far, and its unit.
    pub fn samples(&self, name: &str) -> (Option<String>, Vec<f64>) {
        let emf = self.metrics.lock().unwrap();
        emf.samples
            .get(name)
            .map(|(unit, values)| (Some(unit.clone()), values.clone()))
            .unwrap_or_default()
    }

    /// The running process's peak resident memory (`VmHWM`), in KiB; `None` if none runs.
    pub async fn peak_rss_kib(&self) -> Option<u64> {
        let slot = self.sandbox.lock().await;
        let pid = slot.as_ref()?.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Sends SIGKILL to the running process, wherever it is (mid-invocation included), as a
    /// host failure or an out-of-memory kill would. Returns whether a process was there.
    pub fn kill(&self) -> bool {
        let pid = self.pid.swap(0, std::sync::atomic::Ordering::SeqCst);
        pid != 0
            && std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    }

    /// How many processes were started (1 + crashes and timeouts).
    pub fn starts(&self) -> u32 {
        *self.starts.lock().unwrap()
    }

    /// Invokes the function with `event` and returns its response.
    pub async fn invoke(&self, event: &Value) -> Result<Value, InvokeError> {
        let mut slot = self.sandbox.lock().await;
        if let Some(sandbox) = slot.as_mut()
            && sandbox.child.try_wait().ok().flatten().is_some()
        {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.start().await?);
        }
        let sandbox = slot.as_mut().expect("started");
        let id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        *sandbox.state.reply.lock().unwrap() = Some((id.clone(), tx));
        let deadline_ms = if self.spec.deadline_as_duration {
            self.spec.timeout.as_millis()
        } else {
            (SystemTime::now() + self.spec.timeout)
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis()
        };
        let body = Bytes::from(serde_json::to_vec(event).expect("event serializes"));
        let trace = uuid::Uuid::new_v4().simple().to_string();
        let trace_header = format!(
            "Root=1-{:08x}-{};Parent={};Sampled=1",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            &trace[..24],
            &uuid::Uuid::new_v4().simple().to_string()[..16],
        );
        self.trace_headers
            .lock()
            .unwrap()
            .push(trace_header.clone());
        let _ = sandbox
            .invocations
            .send(Invocation {
                id,
                body,
                deadline_ms,
                trace_header,
            })
            .await;
        tokio::select! {
            reply = rx => match reply {
                Ok(Ok(bytes)) => serde_json::from_slice(&bytes).map_err(|e| InvokeError::Function(format!("response is not JSON: {e}"))),
                Ok(Err(error)) => Err(InvokeError::Function(error)),
                Err(_) => Err(InvokeError::Function("no reply".into())),
            },
            status = sandbox.child.wait() => {
                let init_error = sandbox.state.init_error.lock().unwrap().take().map(|e| format!(": {e}")).unwrap_or_default();
                *slot = None;
                Err(InvokeError::Crashed { status: status.expect("wait"), init_error })
            }
            _ = tokio::time::sleep(self.spec.timeout) => {
                *slot = None; // kills the process
                Err(InvokeError::Timeout(self.spec.timeout))
            }
        }
    }

    async fn start(&self) -> Result<Sandbox, InvokeError> {
        let start_error =
            |e: std::io::Error| InvokeError::Start(format!("{}: {e}", self.spec.binary.display()));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(start_error)?;
        let addr = listener.local_addr().map_err(start_error)?;
        let (invocations, next) = mpsc::channel(1);
        let state = Arc::new(SandboxState {
            function_arn: format!(
                "arn:aws:lambda:us-east-1:123456789012:function:{}",
                self.spec.name
            ),
            next: tokio::sync::Mutex::new(next),
            reply: Mutex::new(None),
            init_error: Mutex::new(None),
            nexts: self.nexts.clone(),
        });
        let server = tokio::spawn(serve(listener, state.clone()));
        let stderr = match &self.spec.log_file {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(start_error)?,
            ),
            None => Stdio::null(),
        };
        let mut child = Command::new(&self.spec.binary)
            .envs(self.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", &self.spec.name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(start_error)?;
        let stdout = child.stdout.take().expect("piped");
        tokio::spawn(sum_emf(stdout, self.metrics.clone()));
        *self.starts.lock().unwrap() += 1;
        self.pid.store(
            child.id().unwrap_or_default(),
            std::sync::atomic::Ordering::SeqCst,
        );
        Ok(Sandbox {
            child,
            server,
            invocations,
            state,
        })
    }
}

/// What a function's EMF lines said so far.
#[derive(Debug, Default)]
struct Emf {
    /// Counts, summed.
    counts: BTreeMap<String, u64>,
    /// Samples by metric: the unit and every value.
    samples: BTreeMap<String, (String, Vec<f64>)>,
}

async fn sum_emf(stdout: tokio::process::ChildStdout, metrics: Arc<Mutex<Emf>>) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(doc) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(defined) = doc
            .pointer("/_aws/CloudWatchMetrics/0/Metrics")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let mut emf = metrics.lock().unwrap();
        for metric in defined {
            let Some(name) = metric.get("Name").and_then(Value::as_str) else {
                continue;
            };
            match doc.get(name) {
                Some(Value::Array(values)) => {
                    let unit = metric["Unit"].as_str().unwrap_or("None").to_owned();
                    let (_, all) = emf
                        .samples
                        .entry(name.to_owned())
                        .or_insert_with(|| (unit, Vec::new()));
                    all.extend(values.iter().filter_map(Value::as_f64));
                }
                value => {
                    *emf.counts.entry(name.to_owned()).or_default() +=
                        value.and_then(Value::as_u64).unwrap_or(0);
                }
            }
        }
    }
}

async fn serve(listener: TcpListener, state: Arc<SandboxState>) {
    let mut connections = JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| route(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn route(
    state: Arc<SandboxState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let parts: Vec<&str> = path
        .trim_start_matches("/2018-06-01/runtime/")
        .split('/')
        .collect();
    let response = match (method, parts.as_slice()) {
        (Method::GET, ["invocation", "next"]) => {
            state
                .nexts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let Some(inv) = state.next.lock().await.recv().await else {
                return Ok(status(StatusCode::GONE));
            };
            Response::builder()
                .header("lambda-runtime-aws-request-id", inv.id)
                .header("lambda-runtime-deadline-ms", inv.deadline_ms.to_string())
                .header(
                    "lambda-runtime-invoked-function-arn",
                    state.function_arn.as_str(),
                )
                .header("lambda-runtime-trace-id", inv.trace_header)
                .body(Full::new(inv.body))
                .expect("response")
        }
        (Method::POST, ["invocation", id, outcome @ ("response" | "error")]) => {
            let body = body_bytes(req).await;
            let mut reply = state.reply.lock().unwrap();
            if reply.as_ref().is_some_and(|(pending, _)| pending == id) {
                let (_, tx) = reply.take().expect("checked");
                let result = if *outcome == "response" {
                    Ok(body)
                } else {
                    Err(String::from_utf8_lossy(&body).into_owned())
                };
                let _ = tx.send(result);
            }
            status(StatusCode::ACCEPTED)
        }
        (Method::POST, ["init", "error"]) => {
            let body = body_bytes(req).await;
            *state.init_error.lock().unwrap() = Some(String::from_utf8_lossy(&body).into_owned());
            status(StatusCode::ACCEPTED)
        }
        _ => status(StatusCode::NOT_FOUND),
    };
    Ok(response)
}

/// The whole body of a request to one of the local servers (empty if it cannot be read).
pub(crate) async fn body_bytes(req: Request<Incoming>) -> Bytes {
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()))
        .expect("response")
}
