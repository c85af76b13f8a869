//! Least privilege, proven on what really deploys (issue 16): `template.yaml` and each
//! consumer's nested template translated offline by SAM's own translator
//! (`tests/sam/translate.py`, in the SAM CLI's venv), flattened into one (`stacks`), and every
//! IAM statement of the result checked: no managed policy at all; no SQS, Secrets Manager, KMS,
//! CloudWatch or Logs action on `*` (only the VPC network interfaces, which EC2 cannot scope,
//! and only in a VPC, and X-Ray's two write actions, which take no resource, and only where the
//! stack is traced); each function limited to its own queues, its own log group and the
//! secrets it uses (the BetterStack token only where something pages), the grants a consumer's
//! nested stack attaches to the replay and scheduled roles (`AWS::IAM::Policy`) counted as
//! theirs; and every alarm reaching the alarm topic. Mutations of the templates (a wildcard, a
//! managed policy, an alarm without actions, a token where it is not needed, a send grant on
//! the wrong queue or role) make the checks fail.

mod stacks;

use serde_json::Value;
use stacks::repository;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

/// The SAM CLI venv's Python (`SAM_PYTHON` overrides): `bash scripts/test.sh` installs it.
fn sam_python() -> PathBuf {
    let python = std::env::var_os("SAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repository().join(".tools/sam-venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: the SAM CLI's venv is installed by `bash scripts/test.sh` (ensure_sam_cli), \
         or set SAM_PYTHON to a Python with aws-sam-translator",
        python.display()
    );
    python
}

/// What deploys, as written: `template.yaml` and the nested templates it uses (by `Location`).
#[derive(Clone)]
struct Sources {
    root: Value,
    nested: BTreeMap<String, Value>,
}

impl Sources {
    fn read() -> Self {
        let root = stacks::root_source();
        let nested = stacks::nested_sources(&root);
        Sources { root, nested }
    }

    /// The source as one template: the nested resources flattened in.
    fn flattened(&self) -> Value {
        stacks::flatten(&self.root, &self.nested)
    }

    /// The nested template every consumer uses (they share one).
    fn consumer(&mut self) -> &mut Value {
        self.nested
            .get_mut("templates/consumer.yaml")
            .expect("the consumers' nested template")
    }

    /// Each template as SAM translates it, on its own, flattened into one.
    fn translated(&self) -> Value {
        let dir = std::env::temp_dir().join(format!("templates-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = vec![dir.join("template.json")];
        // JSON is YAML: the translator reads it as it reads template.yaml.
        std::fs::write(&files[0], serde_json::to_vec(&self.root).unwrap()).unwrap();
        let locations: Vec<&String> = self.nested.keys().collect();
        for (i, location) in locations.iter().enumerate() {
            let file = dir.join(format!("nested-{i}.json"));
            std::fs::write(&file, serde_json::to_vec(&self.nested[*location]).unwrap()).unwrap();
            files.push(file);
        }
        let out = Command::new(sam_python())
            .arg(repository().join("tests/sam/translate.py"))
            .args(&files)
            .output()
            .expect("the translator runs");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "SAM's translator refused a template: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let translated: Value = serde_json::from_slice(&out.stdout).expect("CloudFormation JSON");
        let all = match translated {
            Value::Array(all) => all,
            one => vec![one],
        };
        let nested = locations
            .into_iter()
            .cloned()
            .zip(all[1..].iter().cloned())
            .collect();
        stacks::flatten(&all[0], &nested)
    }
}

/// A resource reference as the template writes it: `Ref`, or the logical id of `Fn::GetAtt`.
fn target(v: &Value) -> String {
    if let Some(r) = v.get("Ref").and_then(Value::as_str) {
        return format!("Ref:{r}");
    }
    if let Some(g) = v.get("Fn::GetAtt").and_then(Value::as_array) {
        return format!("GetAtt:{}", g[0].as_str().unwrap_or_default());
    }
    v.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| v.to_string())
}

fn list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// One allowed statement: its actions on its resources, with the condition it depends on.
#[derive(Debug, Clone)]
struct Grant {
    actions: Vec<String>,
    resources: Vec<String>,
    /// The condition name of an `Fn::If` the statement sits in (`None`: always).
    condition: Option<String>,
}

/// Every `Allow` statement of role `name`: its inline policies and the policies attached to it
/// (`AWS::IAM::Policy`, as a consumer's nested stack attaches its send grant), `Fn::If`s opened.
fn grants(resources: &serde_json::Map<String, Value>, name: &str) -> Vec<Grant> {
    let mut documents: Vec<Value> = list(&resources[name]["Properties"]["Policies"])
        .iter()
        .map(|p| p["PolicyDocument"].clone())
        .collect();
    for r in resources.values() {
        if r["Type"] == "AWS::IAM::Policy"
            && list(&r["Properties"]["Roles"])
                .iter()
                .any(|role| role["Ref"] == name)
        {
            documents.push(r["Properties"]["PolicyDocument"].clone());
        }
    }
    let mut out = Vec::new();
    for document in documents {
        for statement in list(&document["Statement"]) {
            let (statement, condition) = match statement.get("Fn::If") {
                Some(branches) => (
                    branches[1].clone(),
                    Some(branches[0].as_str().unwrap().to_owned()),
                ),
                None => (statement, None),
            };
            if statement.is_null() || statement.get("Ref").is_some() {
                continue; // AWS::NoValue
            }
            assert_eq!(statement["Effect"], "Allow", "{statement}");
            out.push(Grant {
                actions: list(&statement["Action"])
                    .iter()
                    .map(|a| a.as_str().unwrap().to_owned())
                    .collect(),
                resources: list(&statement["Resource"]).iter().map(target).collect(),
                condition,
            });
        }
    }
    out
}

/// What each function may do, by its binary, in the template's terms.
struct Expected {
    sqs: BTreeSet<(String, String)>,
    secrets: BTreeSet<String>,
}

/// The consumer stanzas: (consumer function, its ingester, job queue, DLQ).
fn stanzas(t: &Value) -> Vec<(String, String, String, String)> {
    let resources = t["Resources"].as_object().unwrap();
    let mut out = Vec::new();
    for (name, r) in resources {
        if r["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let Some(queue) =
            r["Properties"]["Events"]["Jobs"]["Properties"]["Queue"]["Fn::GetAtt"][0].as_str()
        else {
            continue;
        };
        let dlq =
            resources[queue]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
                .as_str()
                .unwrap()
                .to_owned();
        let ingester = resources
            .iter()
            .find(|(_, g)| {
                g["Properties"]["Events"]["DeadLetters"]["Properties"]["Queue"]["Fn::GetAtt"][0]
                    == dlq.as_str()
            })
            .map(|(n, _)| n.clone())
            .expect("an ingester on the DLQ");
        out.push((name.clone(), ingester, queue.to_owned(), dlq));
    }
    out
}

/// What the least-privilege rules say each function may do.
fn expected(source: &Value) -> BTreeMap<String, Expected> {
    let stanzas = stanzas(source);
    let job_queues: Vec<String> = stanzas.iter().map(|s| format!("GetAtt:{}", s.2)).collect();
    let db = "Ref:DatabaseSecretArn".to_owned();
    let token = "Ref:BetterStackTokenSecretArn".to_owned();
    let mut out = BTreeMap::new();
    for (name, r) in source["Resources"].as_object().unwrap() {
        if r["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let binary = r["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        let own = stanzas.iter().find(|s| s.0 == *name || s.1 == *name);
        let mut sqs = BTreeSet::new();
        let mut on = |actions: &[&str], queue: String| {
            for a in actions {
                sqs.insert((a.to_string(), queue.clone()));
            }
        };
        let pages = match (binary, own) {
            ("dlq-ingester", Some(s)) => {
                on(
                    &[
                        "sqs:ReceiveMessage",
                        "sqs:DeleteMessage",
                        "sqs:GetQueueAttributes",
                    ],
                    format!("GetAtt:{}", s.3),
                );
                true
            }
            ("scheduled" | "dead-letters-replay", _) => {
                for q in &job_queues {
                    on(&["sqs:GetQueueUrl", "sqs:SendMessage"], q.clone());
                }
                binary == "scheduled"
            }
            ("dead-letters-read" | "dead-letters-discard" | "migrate", _) => false,
            (_, Some(s)) => {
                on(
                    &[
                        "sqs:ReceiveMessage",
                        "sqs:DeleteMessage",
                        "sqs:GetQueueAttributes",
                        "sqs:ChangeMessageVisibility",
                    ],
                    format!("GetAtt:{}", s.2),
                );
                true
            }
            (other, None) => panic!("{name}: a function of unknown kind {other}"),
        };
        let mut secrets = BTreeSet::from([db.clone()]);
        if pages {
            secrets.insert(token.clone());
        }
        out.insert(name.clone(), Expected { sqs, secrets });
    }
    out
}

/// The EC2 actions a function in a VPC needs for its network interfaces: they cannot be scoped
/// to a resource, so these alone may be on `*`, and only under `InVpc`.
const VPC_ACTIONS: [&str; 5] = [
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
];

/// X-Ray's write actions, which take no resource: on `*`, and only under `Traced`.
const XRAY_ACTIONS: [&str; 2] = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"];

/// Every way the translated template `t` breaks least privilege or leaves an alarm silent,
/// judged against what `source` says each function is.
fn violations(source: &Value, t: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let resources = t["Resources"].as_object().unwrap();
    let expected = expected(source);
    // Which role is which function's.
    let mut role_of: BTreeMap<String, String> = BTreeMap::new();
    for (name, r) in resources {
        if r["Type"] == "AWS::Lambda::Function" {
            match r["Properties"]["Role"]["Fn::GetAtt"][0].as_str() {
                Some(role) => {
                    role_of.insert(role.to_owned(), name.clone());
                }
                None => found.push(format!("{name}: its role is not a role of this stack")),
            }
        }
    }
    for (name, r) in resources {
        if r["Type"] != "AWS::IAM::Role" {
            continue;
        }
        let managed = list(&r["Properties"]["ManagedPolicyArns"]);
        if !managed.is_empty() {
            found.push(format!("{name} holds managed policies {managed:?}"));
        }
        let function = role_of.get(name);
        for grant in grants(resources, name) {
            for action in &grant.actions {
                let service = action.split(':').next().unwrap_or_default();
                if action.contains('*') {
                    found.push(format!("{name}: a wildcard action {action}"));
                }
                if grant.resources.iter().any(|res| res == "*") {
                    let vpc = VPC_ACTIONS.contains(&action.as_str())
                        && grant.condition.as_deref() == Some("InVpc");
                    let xray = XRAY_ACTIONS.contains(&action.as_str())
                        && grant.condition.as_deref() == Some("Traced");
                    if !vpc && !xray {
                        found.push(format!("{name}: {action} on *"));
                    }
                }
                let Some(function) = function else {
                    // A role SAM made for a service (the scheduler's): it may only invoke.
                    if action != "lambda:InvokeFunction" {
                        found.push(format!("{name}: a service role holding {action}"));
                    }
                    continue;
                };
                let want = &expected[function];
                for res in &grant.resources {
                    let allowed = match service {
                        "sqs" => want.sqs.contains(&(action.clone(), res.clone())),
                        "secretsmanager" => {
                            action == "secretsmanager:GetSecretValue" && want.secrets.contains(res)
                        }
                        "kms" => action == "kms:Decrypt" && res == "Ref:SecretsKmsKeyArn",
                        "logs" => {
                            ["logs:CreateLogStream", "logs:PutLogEvents"].contains(&action.as_str())
                                && res.starts_with("GetAtt:")
                                && resources
                                    .get(res.trim_start_matches("GetAtt:"))
                                    .is_some_and(|g| g["Type"] == "AWS::Logs::LogGroup")
                                && resources[function]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
                                    == res.trim_start_matches("GetAtt:")
                        }
                        "ec2" => VPC_ACTIONS.contains(&action.as_str()),
                        "xray" => XRAY_ACTIONS.contains(&action.as_str()),
                        _ => false,
                    };
                    if !allowed {
                        found.push(format!("{function} ({name}): {action} on {res}"));
                    }
                }
            }
        }
        if let Some(function) = function {
            let granted: BTreeSet<String> = grants(resources, name)
                .iter()
                .filter(|g| {
                    g.actions
                        .iter()
                        .any(|a| a == "secretsmanager:GetSecretValue")
                })
                .flat_map(|g| g.resources.clone())
                .collect();
            if granted != expected[function].secrets {
                found.push(format!(
                    "{function}: reads the secrets {granted:?}, needs {:?}",
                    expected[function].secrets
                ));
            }
            // And every queue grant it needs is there (a sender missing a consumer's job
            // queue could not replay to it): the grants attached by the nested stacks count.
            let sqs: BTreeSet<(String, String)> = grants(resources, name)
                .iter()
                .flat_map(|g| {
                    g.actions
                        .iter()
                        .filter(|a| a.starts_with("sqs:"))
                        .flat_map(|a| g.resources.iter().map(move |r| (a.clone(), r.clone())))
                        .collect::<Vec<_>>()
                })
                .collect();
            for missing in expected[function].sqs.difference(&sqs) {
                found.push(format!("{function}: lacks {} on {}", missing.0, missing.1));
            }
        }
    }
    // A policy attached to something other than a role of this stack would escape the checks.
    for (name, r) in resources {
        if r["Type"] == "AWS::IAM::Policy" {
            for role in list(&r["Properties"]["Roles"]) {
                let ours = role["Ref"]
                    .as_str()
                    .and_then(|n| resources.get(n))
                    .is_some_and(|x| x["Type"] == "AWS::IAM::Role");
                if !ours {
                    found.push(format!(
                        "{name}: attached to {role}, not a role of this stack"
                    ));
                }
            }
        }
    }
    for (name, r) in resources {
        if r["Type"] == "AWS::CloudWatch::Alarm" {
            for key in ["AlarmActions", "OKActions"] {
                let actions: Vec<String> = list(&r["Properties"][key]).iter().map(target).collect();
                if actions != ["Ref:AlarmTopic"] {
                    found.push(format!("{name}: {key} {actions:?}, not the alarm topic"));
                }
            }
        }
    }
    found
}

#[test]
fn the_translated_template_grants_each_function_exactly_what_it_needs() {
    let sources = Sources::read();
    let translated = sources.translated();
    let roles = translated["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["Type"] == "AWS::IAM::Role")
        .count();
    assert!(
        roles >= 10,
        "a role per function (and the scheduler's): {roles}"
    );
    let stanzas = stanzas(&sources.flattened());
    assert_eq!(
        stanzas.len(),
        stacks::applications(&sources.root).len(),
        "every consumer application is checked"
    );
    let found = violations(&sources.flattened(), &translated);
    assert!(
        found.is_empty(),
        "least privilege broken:\n{}",
        found.join("\n")
    );
}

/// Each mutation of the templates must be caught, else the check above proves nothing. Most
/// change what is written (the root, or the consumers' nested template, which every consumer
/// then shares); one changes a single consumer's translation, which no shared template can.
#[test]
fn a_wildcard_a_managed_policy_a_silent_alarm_or_an_unneeded_token_is_caught() {
    type Mutation = (&'static str, fn(&mut Sources), &'static str);
    let mutations: [Mutation; 9] = [
        (
            "a wildcard resource on the replay role",
            |s| {
                s.root["Resources"]["DeadLettersReplayRole"]["Properties"]["Policies"][0]["PolicyDocument"]
                    ["Statement"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"}));
            },
            "sqs:SendMessage on *",
        ),
        (
            "X-Ray's actions on the read role whether or not the stack is traced",
            |s| {
                s.root["Resources"]["DeadLettersReadRole"]["Properties"]["Policies"][0]["PolicyDocument"]
                    ["Statement"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"Effect": "Allow", "Action": "xray:PutTraceSegments", "Resource": "*"}));
            },
            "xray:PutTraceSegments on *",
        ),
        (
            "an alarm of the consumers without actions",
            |s| {
                let alarm = s.consumer()["Resources"]["ErrorsAlarm"]["Properties"]
                    .as_object_mut()
                    .unwrap();
                alarm.remove("AlarmActions");
            },
            "AwardPointsErrorsAlarm: AlarmActions",
        ),
        (
            "the consumer back on SAM's generated role (SAM attaches AWSLambdaSQSQueueExecutionRole)",
            |s| {
                let f = s.consumer()["Resources"]["Function"]["Properties"]
                    .as_object_mut()
                    .unwrap();
                f.remove("Role");
            },
            "AWSLambdaSQSQueueExecutionRole",
        ),
        (
            "the BetterStack token given to the read API",
            |s| {
                s.root["Resources"]["DeadLettersReadRole"]["Properties"]["Policies"][0]["PolicyDocument"]
                    ["Statement"][1]["Resource"] = serde_json::json!([
                    {"Ref": "DatabaseSecretArn"}, {"Ref": "BetterStackTokenSecretArn"}]);
            },
            "DeadLettersReadFunction",
        ),
        (
            "the replays' send grant on the DLQ instead of the job queue",
            |s| {
                s.consumer()["Resources"]["SenderPolicy"]["Properties"]["PolicyDocument"]["Statement"]
                    [0]["Resource"] = serde_json::json!({"Fn::GetAtt": ["DeadLetterQueue", "Arn"]});
            },
            "DeadLettersReplayFunction (DeadLettersReplayRole): sqs:SendMessage on GetAtt:AwardPointsDeadLetterQueue",
        ),
        (
            "the send grant attached to a role that must not send (a stanza's SenderRoleNames)",
            |s| {
                s.root["Resources"]["RedeemReward"]["Properties"]["Parameters"]["SenderRoleNames"] = serde_json::json!({"Fn::Join": [",", [
                        {"Ref": "DeadLettersReplayRole"}, {"Ref": "ScheduledRole"}, {"Ref": "DeadLettersReadRole"}]]});
            },
            "DeadLettersReadFunction (DeadLettersReadRole): sqs:SendMessage on GetAtt:RedeemRewardJobQueue",
        ),
        (
            "no send grant for the replays (the nested stack's policy gone)",
            |s| {
                s.consumer()["Resources"]
                    .as_object_mut()
                    .unwrap()
                    .remove("SenderPolicy");
            },
            "DeadLettersReplayFunction: lacks sqs:SendMessage on GetAtt:AwardPointsJobQueue",
        ),
        (
            "a consumer's DLQ ingester allowed its job queue",
            |s| {
                s.consumer()["Resources"]["DlqIngesterRole"]["Properties"]["Policies"][0]["PolicyDocument"]
                    ["Statement"][1]["Resource"] =
                    serde_json::json!({"Fn::GetAtt": ["JobQueue", "Arn"]});
            },
            "AwardPointsDlqIngesterFunction",
        ),
    ];
    let sources = Sources::read();
    for (what, mutate, expected) in mutations {
        let mut mutated = sources.clone();
        mutate(&mut mutated);
        let found = violations(&mutated.flattened(), &mutated.translated());
        assert!(
            found.iter().any(|v| v.contains(expected)),
            "{what}: not caught ({found:#?})"
        );
    }
    // One consumer allowed another consumer's queue: only its translation can differ.
    let mut translated = sources.translated();
    translated["Resources"]["RedeemRewardRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
        [1]["Resource"] = serde_json::json!({"Fn::GetAtt": ["AwardPointsJobQueue", "Arn"]});
    let found = violations(&sources.flattened(), &translated);
    assert!(
        found.iter().any(|v| v.contains("RedeemRewardFunction")),
        "a consumer allowed another consumer's queue: not caught ({found:#?})"
    );
}
