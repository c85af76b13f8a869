//! `template.yaml` checked for what cfn-lint cannot know: that it matches this code. Each
//! function's environment (Globals + its own, parameters at their defaults, deploy-time secrets
//! as placeholders) must pass that function's real configuration loader, and the queue, redrive,
//! timeouts and permissions must fit the harness's rules.

use dead_letter_api::api::ROUTES;
use serde_json::{Map, Value};
use shared::config::{ApiConfig, BackstopConfig, ConsumerConfig, Env, SweeperConfig};
use shared::retry::RetryPolicy;
use std::collections::BTreeMap;
use std::path::Path;

fn template() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
    let text = std::fs::read_to_string(&path).expect("template.yaml at the repository root");
    serde_norway::from_str(&text).expect("template.yaml is YAML with long-form intrinsics")
}

fn resource<'a>(t: &'a Value, name: &str) -> &'a Value {
    t["Resources"]
        .get(name)
        .unwrap_or_else(|| panic!("resource {name} missing"))
}

fn functions(t: &Value) -> Vec<(String, &Value)> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Serverless::Function")
        .map(|(n, r)| (n.clone(), r))
        .collect()
}

/// A template value as the function would see it: parameters at their defaults, a secret or an
/// attribute as a placeholder of the right shape.
fn resolve(t: &Value, name: &str, v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(o) if o.contains_key("Ref") => {
            let param = o["Ref"].as_str().unwrap();
            let default = &t["Parameters"][param]["Default"];
            assert!(
                !default.is_null(),
                "{name} refers to parameter {param}, which has no default"
            );
            resolve(t, name, default)
        }
        Value::Object(o)
            if o.get("Fn::Sub")
                .and_then(Value::as_str)
                .is_some_and(|s| s.contains("{{resolve:secretsmanager")) =>
        {
            if name == "DATABASE_URL" {
                "postgres://resolved-at-deploy/db".into()
            } else {
                "resolved-at-deploy".into()
            }
        }
        Value::Object(o) if o.contains_key("Fn::GetAtt") => "attribute".into(),
        Value::Object(o) if o.contains_key("Fn::If") => panic!("{name}: conditional value"),
        other => panic!("{name}: unexpected value {other}"),
    }
}

fn environment(t: &Value, function: &Value) -> BTreeMap<String, String> {
    let vars = |v: &Value| {
        v["Environment"]["Variables"]
            .as_object()
            .cloned()
            .unwrap_or_else(Map::new)
    };
    let mut all = vars(&t["Globals"]["Function"]);
    all.extend(vars(&function["Properties"]));
    all.iter()
        .map(|(k, v)| (k.clone(), resolve(t, k, v)))
        .collect()
}

/// The binary targets of the crates under `functions/`, as cargo sees them.
fn function_binaries() -> Vec<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut bins = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        if !package["manifest_path"]
            .as_str()
            .unwrap()
            .contains("/functions/")
        {
            continue;
        }
        for target in package["targets"].as_array().unwrap() {
            if target["kind"] == serde_json::json!(["bin"]) {
                bins.push(target["name"].as_str().unwrap().to_owned());
            }
        }
    }
    bins.sort();
    bins
}

fn binary(f: &Value) -> &str {
    f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap()
}

#[test]
fn every_function_builds_a_binary_of_this_workspace_with_cargo_lambda() {
    let t = template();
    let names: Vec<_> = functions(&t).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "ConsumerFunction",
            "DeadLettersDiscardFunction",
            "DeadLettersReadFunction",
            "DeadLettersReplayFunction",
            "DlqIngesterFunction",
            "SweeperFunction"
        ]
    );
    let mut deployed: Vec<String> = Vec::new();
    for (name, f) in functions(&t) {
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{name}");
        deployed.push(binary(f).to_owned());
    }
    deployed.sort();
    assert_eq!(
        deployed,
        function_binaries(),
        "every function binary deployed, each once"
    );
    let globals = &t["Globals"]["Function"];
    assert_eq!(
        (globals["Runtime"].as_str(), globals["Handler"].as_str()),
        (Some("provided.al2023"), Some("bootstrap"))
    );
    assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
}

#[test]
fn each_functions_environment_passes_its_own_configuration() {
    let t = template();
    for (name, f) in functions(&t) {
        let env = environment(&t, f);
        let lookup = Env::from_fn(|k| env.get(k).cloned());
        let checked = match name.as_str() {
            "ConsumerFunction" => ConsumerConfig::from_env(&lookup).map(drop),
            "DlqIngesterFunction" => BackstopConfig::from_env(&lookup).map(drop),
            "SweeperFunction" => SweeperConfig::from_env(&lookup).map(drop),
            "DeadLettersReadFunction"
            | "DeadLettersReplayFunction"
            | "DeadLettersDiscardFunction" => {
                assert!(
                    !env.contains_key("BETTERSTACK_API_TOKEN"),
                    "{name} has no use for the BetterStack token"
                );
                ApiConfig::from_env(&lookup).map(drop)
            }
            other => panic!("no configuration known for {other}"),
        };
        checked.unwrap_or_else(|e| panic!("{name} would not start: {e}"));
    }
}

#[test]
fn the_queue_redrive_and_timeouts_fit_the_harness() {
    let t = template();
    let queue = &resource(&t, "JobQueue")["Properties"];
    let consumer = &resource(&t, "ConsumerFunction")["Properties"];
    let max_receive = queue["RedrivePolicy"]["maxReceiveCount"].as_u64().unwrap();
    assert!(
        max_receive > u64::from(RetryPolicy::default().max_attempts()),
        "the redrive must not pre-empt the retries"
    );
    // Every function that checks the redrive count against the attempts is told the real one.
    for name in ["ConsumerFunction", "DlqIngesterFunction", "SweeperFunction"] {
        let env = environment(&t, resource(&t, name));
        assert_eq!(
            env["REDRIVE_MAX_RECEIVE_COUNT"],
            max_receive.to_string(),
            "{name}"
        );
    }
    let visibility = queue["VisibilityTimeout"].as_u64().unwrap();
    let timeout = consumer["Timeout"].as_u64().unwrap();
    assert!(
        visibility >= 6 * timeout,
        "visibility {visibility} s < 6 x timeout {timeout} s"
    );
    for (name, f) in functions(&t) {
        for (event, e) in f["Properties"]["Events"].as_object().unwrap() {
            if e["Type"] == "SQS" {
                assert_eq!(
                    e["Properties"]["FunctionResponseTypes"],
                    serde_json::json!(["ReportBatchItemFailures"]),
                    "{name}.{event}"
                );
            }
        }
    }
}

#[test]
fn only_the_consumer_changes_visibility_and_only_the_ingester_reads_the_dlq() {
    let t = template();
    let grants = |f: &Value| -> Vec<(String, String)> {
        let mut out = Vec::new();
        for policy in f["Properties"]["Policies"].as_array().into_iter().flatten() {
            for st in policy["Statement"].as_array().into_iter().flatten() {
                let target = st["Resource"]["Fn::GetAtt"][0]
                    .as_str()
                    .unwrap_or("*")
                    .to_owned();
                for action in st["Action"].as_array().into_iter().flatten() {
                    out.push((action.as_str().unwrap().to_owned(), target.clone()));
                }
            }
        }
        out
    };
    for (name, f) in functions(&t) {
        for (action, target) in grants(f) {
            assert!(
                action.starts_with("sqs:"),
                "{name} holds {action}: nothing but SQS is granted at runtime"
            );
            match name.as_str() {
                "ConsumerFunction" => assert_eq!(target, "JobQueue", "{name}: {action}"),
                "DlqIngesterFunction" => assert!(
                    target == "JobDeadLetterQueue" && action != "sqs:ChangeMessageVisibility",
                    "{name}: {action} on {target}"
                ),
                // The replay path: the API sends, and the scheduled run sends what a replay
                // recorded but could not send.
                "DeadLettersReplayFunction" | "SweeperFunction" => assert!(
                    target == "JobQueue"
                        && ["sqs:SendMessage", "sqs:GetQueueUrl"].contains(&action.as_str()),
                    "{name}: {action} on {target}"
                ),
                _ => panic!("{name} should hold no SQS permission, holds {action} on {target}"),
            }
            if action == "sqs:SendMessage" {
                assert!(
                    ["DeadLettersReplayFunction", "SweeperFunction"].contains(&name.as_str()),
                    "only the replay path may send, not {name}"
                );
            }
        }
    }
}

#[test]
fn every_route_is_on_its_function_behind_the_jwt_authorizer_with_its_scope() {
    let t = template();
    let api = &resource(&t, "DeadLetterApi")["Properties"]["Auth"];
    let authorizer = api["DefaultAuthorizer"]
        .as_str()
        .expect("a default authorizer");
    assert!(
        api["Authorizers"][authorizer]["JwtConfiguration"].is_object(),
        "{authorizer} is a JWT authorizer"
    );
    let mut deployed = Vec::new();
    for (name, f) in functions(&t) {
        for (event, e) in f["Properties"]["Events"].as_object().unwrap() {
            if e["Type"] != "HttpApi" {
                continue;
            }
            let p = &e["Properties"];
            assert_eq!(p["ApiId"]["Ref"], "DeadLetterApi", "{name}.{event}");
            assert_eq!(p["Auth"]["Authorizer"], authorizer, "{name}.{event}");
            let scopes: Vec<&str> = p["Auth"]["AuthorizationScopes"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}.{event} has no AuthorizationScopes"))
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect();
            deployed.push((
                binary(f).to_owned(),
                p["Method"].as_str().unwrap().to_owned(),
                p["Path"].as_str().unwrap().to_owned(),
                scopes.join(" "),
            ));
        }
    }
    let mut expected: Vec<_> = ROUTES
        .iter()
        .map(|r| {
            (
                r.function.to_owned(),
                r.method.to_owned(),
                r.path.to_owned(),
                r.scope.as_str().to_owned(),
            )
        })
        .collect();
    deployed.sort();
    expected.sort();
    assert_eq!(
        deployed, expected,
        "routes, functions and scopes as in dead_letter_api::api::ROUTES"
    );
}

#[test]
fn the_functions_join_a_vpc_only_when_subnets_are_given() {
    let t = template();
    let vpc = &t["Globals"]["Function"]["VpcConfig"]["Fn::If"];
    assert_eq!(vpc[0], "InVpc");
    assert_eq!(vpc[1]["SubnetIds"]["Ref"], "VpcSubnetIds");
    assert_eq!(vpc[2]["Ref"], "AWS::NoValue");
    assert_eq!(t["Parameters"]["VpcSubnetIds"]["Default"], "");
}
