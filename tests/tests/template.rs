//! `template.yaml` checked for what cfn-lint cannot know: that it matches this code. Each
//! function's environment (Globals + its own, parameters at their defaults, deploy-time secrets
//! as placeholders) must pass that function's real configuration loader, and the queue, redrive,
//! timeouts and permissions must fit the harness's rules.

use dead_letter_api::api::ROUTES;
use serde_json::{Map, Value};
use shared::config::{ApiConfig, ConsumerConfig, DlqIngesterConfig, Env, ScheduledConfig};
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

/// The binaries that are queue consumers (everything in `functions/` but the platform's own).
fn is_consumer_binary(binary: &str) -> bool {
    ![
        "dlq-ingester",
        "scheduled",
        "dead-letters-read",
        "dead-letters-replay",
        "dead-letters-discard",
    ]
    .contains(&binary)
}

/// Every consumer stanza: (consumer function, its ingester, its job queue, its DLQ), by the
/// consumer's SQS event and the queue's redrive target.
fn consumers(t: &Value) -> Vec<(String, String, String, String)> {
    let mut found = Vec::new();
    for (name, f) in functions(t) {
        if !is_consumer_binary(binary(f)) {
            continue;
        }
        let queue = f["Properties"]["Events"]["Jobs"]["Properties"]["Queue"]["Fn::GetAtt"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: a consumer has an SQS event `Jobs` on its queue"))
            .to_owned();
        let dlq =
            resource(t, &queue)["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"]
                [0]
            .as_str()
            .unwrap_or_else(|| panic!("{queue} redrives to a DLQ of this stack"))
            .to_owned();
        let ingesters: Vec<String> = functions(t)
            .into_iter()
            .filter(|(_, g)| {
                binary(g) == "dlq-ingester"
                    && g["Properties"]["Events"]["DeadLetters"]["Properties"]["Queue"]["Fn::GetAtt"]
                        [0]
                        == dlq.as_str()
            })
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            ingesters.len(),
            1,
            "{name}: exactly one ingester reads {dlq}"
        );
        found.push((name, ingesters[0].clone(), queue, dlq));
    }
    found
}

#[test]
fn every_function_builds_a_binary_of_this_workspace_with_cargo_lambda() {
    let t = template();
    let mut deployed: Vec<String> = Vec::new();
    for (name, f) in functions(&t) {
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{name}");
        deployed.push(binary(f).to_owned());
    }
    deployed.sort();
    deployed.dedup();
    assert_eq!(
        deployed,
        function_binaries(),
        "every function binary deployed, and nothing else"
    );
    assert_eq!(consumers(&t).len(), 2, "award-points and redeem-reward");
    let globals = &t["Globals"]["Function"];
    assert_eq!(
        (globals["Runtime"].as_str(), globals["Handler"].as_str()),
        (Some("provided.al2023"), Some("bootstrap"))
    );
    assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
    assert!(
        globals["Environment"]["Variables"]
            .get("CONSUMER_NAME")
            .is_none(),
        "CONSUMER_NAME is per function, never inherited"
    );
}

#[test]
fn each_functions_environment_passes_its_own_configuration() {
    let t = template();
    for (name, f) in functions(&t) {
        let env = environment(&t, f);
        let lookup = Env::from_fn(|k| env.get(k).cloned());
        let checked = match binary(f) {
            "dlq-ingester" => DlqIngesterConfig::from_env(&lookup).map(drop),
            "scheduled" => ScheduledConfig::from_env(&lookup).map(drop),
            "dead-letters-read" | "dead-letters-replay" | "dead-letters-discard" => {
                assert!(
                    !env.contains_key("BETTERSTACK_API_TOKEN"),
                    "{name} has no use for the BetterStack token"
                );
                ApiConfig::from_env(&lookup).map(drop)
            }
            _ => ConsumerConfig::from_env(&lookup).map(drop),
        };
        checked.unwrap_or_else(|e| panic!("{name} would not start: {e}"));
    }
}

#[test]
fn every_queue_is_named_after_the_stack() {
    let t = template();
    for (name, r) in t["Resources"].as_object().unwrap() {
        if r["Type"] == "AWS::SQS::Queue" {
            let queue_name = r["Properties"]["QueueName"]["Fn::Sub"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: QueueName is Fn::Sub on the stack name"));
            assert!(
                queue_name.starts_with("${AWS::StackName}-")
                    && (queue_name.ends_with("-jobs") || queue_name.ends_with("-dlq")),
                "{name}: {queue_name}"
            );
        }
    }
}

#[test]
fn each_consumer_stanza_wires_its_queue_redrive_ingester_and_timeouts() {
    let t = template();
    let mut names = Vec::new();
    for (consumer, ingester, queue, dlq) in consumers(&t) {
        let env = environment(&t, resource(&t, &consumer));
        let config = ConsumerConfig::from_env(&Env::from_fn(|k| env.get(k).cloned())).unwrap();
        names.push(config.consumer_name.as_str().to_owned());
        let q = &resource(&t, &queue)["Properties"];
        let max_receive = q["RedrivePolicy"]["maxReceiveCount"].as_u64().unwrap();
        assert!(
            max_receive > u64::from(config.fence.policy.max_attempts()),
            "{consumer}: the redrive must not pre-empt the retries"
        );
        assert_eq!(
            u64::from(config.fence.max_receive_count),
            max_receive,
            "{consumer}: REDRIVE_MAX_RECEIVE_COUNT is the queue's"
        );
        let ingester_env = environment(&t, resource(&t, &ingester));
        assert_eq!(
            ingester_env["CONSUMER_NAME"], env["CONSUMER_NAME"],
            "{ingester}"
        );
        assert_eq!(
            ingester_env["REDRIVE_MAX_RECEIVE_COUNT"],
            max_receive.to_string(),
            "{ingester}"
        );
        assert_eq!(
            resource(&t, &ingester)["Properties"]["Environment"]["Variables"]["JOB_QUEUE_NAME"]["Fn::GetAtt"]
                [0],
            queue.as_str(),
            "{ingester}: its letters name the job queue, where a replay goes"
        );
        let visibility = q["VisibilityTimeout"].as_u64().unwrap();
        let timeout = resource(&t, &consumer)["Properties"]["Timeout"]
            .as_u64()
            .unwrap();
        assert!(
            visibility >= 6 * timeout,
            "{queue}: visibility {visibility} s < 6 x timeout {timeout} s"
        );
        assert!(resource(&t, &dlq)["Type"] == "AWS::SQS::Queue");
    }
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "consumer names are unique: {names:?}");
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
fn each_function_touches_only_its_own_queues_and_only_the_replay_path_sends() {
    let t = template();
    let job_queues =
        "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-*-jobs";
    let grants = |f: &Value| -> Vec<(String, String)> {
        let mut out = Vec::new();
        for policy in f["Properties"]["Policies"].as_array().into_iter().flatten() {
            for st in policy["Statement"].as_array().into_iter().flatten() {
                let target = st["Resource"]["Fn::GetAtt"][0]
                    .as_str()
                    .or_else(|| st["Resource"]["Fn::Sub"].as_str())
                    .unwrap_or("*")
                    .to_owned();
                for action in st["Action"].as_array().into_iter().flatten() {
                    out.push((action.as_str().unwrap().to_owned(), target.clone()));
                }
            }
        }
        out
    };
    let stanzas = consumers(&t);
    for (name, f) in functions(&t) {
        let own = stanzas.iter().find(|(c, i, _, _)| *c == name || *i == name);
        for (action, target) in grants(f) {
            assert!(
                action.starts_with("sqs:"),
                "{name} holds {action}: nothing but SQS is granted at runtime"
            );
            match (binary(f), own) {
                ("dlq-ingester", Some((_, _, _, dlq))) => assert!(
                    target == *dlq && action != "sqs:ChangeMessageVisibility",
                    "{name}: {action} on {target}"
                ),
                ("dead-letters-replay" | "scheduled", _) => assert!(
                    target == job_queues
                        && ["sqs:SendMessage", "sqs:GetQueueUrl"].contains(&action.as_str()),
                    "{name}: {action} on {target}"
                ),
                (_, Some((_, _, queue, _))) => {
                    assert_eq!(target, *queue, "{name}: {action}");
                    assert_ne!(action, "sqs:SendMessage", "{name} may not send");
                }
                _ => panic!("{name} should hold no SQS permission, holds {action} on {target}"),
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
