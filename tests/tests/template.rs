//! `template.yaml` checked for what cfn-lint cannot know: that it matches this code. Each
//! function's environment (Globals + its own, parameters at their defaults, deploy-time secrets
//! as placeholders) must pass that function's real configuration loader, and the queue, redrive,
//! timeouts and permissions must fit the harness's rules.

use serde_json::{Map, Value};
use shared::config::{BackstopConfig, ConsumerConfig, Env, SweeperConfig};
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

#[test]
fn every_function_builds_a_binary_of_this_workspace_with_cargo_lambda() {
    let t = template();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let names: Vec<_> = functions(&t).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["ConsumerFunction", "DlqIngesterFunction", "SweeperFunction"]
    );
    for (name, f) in functions(&t) {
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{name}");
        let binary = f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        assert!(
            root.join("functions")
                .join(binary)
                .join("src/main.rs")
                .exists(),
            "{name}: no functions/{binary}"
        );
    }
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
    let ingester_env = environment(&t, resource(&t, "DlqIngesterFunction"));
    assert_eq!(
        ingester_env["REDRIVE_MAX_RECEIVE_COUNT"],
        max_receive.to_string()
    );
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
                _ => panic!("{name} should hold no SQS permission, holds {action} on {target}"),
            }
            assert_ne!(
                action, "sqs:SendMessage",
                "{name}: only the replay path may send"
            );
        }
    }
}
