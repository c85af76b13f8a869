//! `template.yaml` checked for what cfn-lint cannot know: that it matches this code. It is read
//! with each consumer's nested template (`templates/consumer.yaml`) flattened in (`stacks`), so
//! every check covers every consumer the template declares, a new one included. Each
//! function's environment (Globals + its own, parameters at their defaults, required ones as
//! placeholders) must pass that function's real configuration loader; the queues, redrive and
//! timeouts must fit the harness's rules; a consumer is one short stanza; the schema migrates
//! before any function serves; every alarm reaches a person and the alarms cover what
//! `docs/deploy.md` lists, on metrics the code emits; the dashboard finds the consumers itself;
//! `samconfig.toml` holds whole environments. (IAM is checked on the translated template:
//! `least_privilege.rs`.)

mod stacks;

use dead_letter_api::api::ROUTES;
use serde_json::{Map, Value, json};
use shared::config::{
    ApiConfig, ConsumerConfig, DatabaseConfig, DlqIngesterConfig, Env, ScheduledConfig,
};
use shared::telemetry::LogSettings;
use shared::telemetry::otel::Tracing;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `template.yaml` with every consumer's nested template flattened in.
fn template() -> Value {
    stacks::template()
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
            let declared = &t["Parameters"][param];
            assert!(
                declared.is_object(),
                "{name} refers to {param}, no parameter"
            );
            match &declared["Default"] {
                // A required parameter (an ARN, the issuer): a value of its pattern's shape.
                Value::Null => {
                    format!("arn:aws:secretsmanager:eu-west-1:123456789012:secret:{param}")
                }
                default => resolve(t, name, default),
            }
        }
        Value::Object(o)
            if o.get("Fn::Sub")
                .and_then(Value::as_str)
                .is_some_and(|s| s.contains("{{resolve:")) =>
        {
            panic!("{name} is resolved at deploy time: secrets are read at run time")
        }
        Value::Object(o) if o.contains_key("Fn::Sub") => o["Fn::Sub"]
            .as_str()
            .unwrap()
            .replace("${AWS::StackName}", "jobs-staging"),
        Value::Object(o) if o.contains_key("Fn::GetAtt") => "attribute".into(),
        // A condition of the flattened template (a stanza's, its parameters substituted).
        Value::Object(o) if o.contains_key("Fn::If") => {
            let branches = o["Fn::If"].as_array().expect("Fn::If's three items");
            let condition = branches[0].as_str().expect("a condition's name");
            let sides = t["Conditions"][condition]["Fn::Equals"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: condition {condition} is no Fn::Equals"));
            let holds = resolve(t, name, &sides[0]) == resolve(t, name, &sides[1]);
            resolve(t, name, &branches[if holds { 1 } else { 2 }])
        }
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
    // A nested stack's functions have its own Globals applied already (`stacks`), not the root's.
    let mut all = if function.get("NestedIn").is_some() {
        Map::new()
    } else {
        vars(&t["Globals"]["Function"])
    };
    all.extend(vars(&function["Properties"]));
    all.iter()
        .map(|(k, v)| (k.clone(), resolve(t, k, v)))
        .collect()
}

/// The binary targets of the crates under `functions/`, as cargo sees them.
fn function_binaries() -> Vec<String> {
    let output = e2e::cargo()
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
        "migrate",
    ]
    .contains(&binary)
}

/// The binaries whose functions page BetterStack (and so read its token).
fn pages(binary: &str) -> bool {
    is_consumer_binary(binary) || ["dlq-ingester", "scheduled"].contains(&binary)
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
    assert_eq!(
        consumers(&t).len(),
        stacks::applications(&t).len(),
        "one consumer per consumer application"
    );
    assert!(!consumers(&t).is_empty());
    let award = environment(&t, resource(&t, "AwardPointsFunction"));
    assert_eq!(
        award["COMMIT_MODE"], "batch",
        "the reference consumer commits per batch"
    );
    let globals = &t["Globals"]["Function"];
    assert_eq!(
        (globals["Runtime"].as_str(), globals["Handler"].as_str()),
        (Some("provided.al2023"), Some("bootstrap"))
    );
    assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
    assert_eq!(
        globals["Environment"]["Variables"]["RUST_LOG"]["Ref"], "LogLevel",
        "every function logs at its environment's LogLevel"
    );
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
        assert_eq!(
            env.contains_key("BETTERSTACK_TOKEN_SECRET_ARN"),
            pages(binary(f)),
            "{name}: the BetterStack token only where something pages"
        );
        assert!(
            !env.contains_key("DATABASE_URL") && !env.contains_key("BETTERSTACK_API_TOKEN"),
            "{name}: deployed functions read their secrets at run time, never from the environment"
        );
        let checked = match binary(f) {
            "dlq-ingester" => DlqIngesterConfig::from_env(&lookup).map(drop),
            "scheduled" => ScheduledConfig::from_env(&lookup).map(drop),
            "dead-letters-read" | "dead-letters-replay" | "dead-letters-discard" => {
                ApiConfig::from_env(&lookup).map(drop)
            }
            "migrate" => DatabaseConfig::from_env(&lookup).map(drop),
            _ => ConsumerConfig::from_env(&lookup).map(drop),
        };
        checked.unwrap_or_else(|e| panic!("{name} would not start: {e}"));
        LogSettings::from_env(&lookup).unwrap_or_else(|e| panic!("{name} would not start: {e}"));
        assert_eq!(
            Tracing::from_env(&lookup),
            Ok(Tracing::Disabled),
            "{name}: not traced by default"
        );
    }
}

#[test]
fn tracing_is_one_parameter_off_by_default_that_every_function_and_role_follows() {
    let root = stacks::root_source();
    assert_eq!(root["Parameters"]["Tracing"]["Default"], "Disabled");
    assert_eq!(
        root["Metadata"]["ConsumerParameters"]["Tracing"]["Ref"], "Tracing",
        "each consumer's nested stack is traced as its stack is"
    );
    assert_eq!(
        root["Metadata"]["ConsumerParameters"]["TracingCollectorLayer"]["Ref"],
        "TracingCollectorLayer",
        "and exports to the same collector layer"
    );
    let sources = std::iter::once(("template.yaml".to_owned(), root.clone()))
        .chain(stacks::nested_sources(&root));
    for (file, source) in sources {
        assert_eq!(
            source["Conditions"]["Traced"],
            serde_json::json!({"Fn::Equals": [{"Ref": "Tracing"}, "Active"]}),
            "{file}"
        );
        let globals = &source["Globals"]["Function"];
        assert_eq!(
            globals["Tracing"],
            serde_json::json!({"Fn::If": ["Traced", "Active", "PassThrough"]}),
            "{file}: Lambda traces the function when the stack is traced"
        );
        assert_eq!(
            globals["Environment"]["Variables"]["TRACING"]["Ref"], "Tracing",
            "{file}: and the function exports its invocation, job and statement spans"
        );
        assert_eq!(
            globals["Layers"],
            serde_json::json!({"Fn::If": ["Traced",
                [{"Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:901920570463:layer:${TracingCollectorLayer}"}],
                {"Ref": "AWS::NoValue"}]}),
            "{file}: to ADOT's collector layer, only when traced"
        );
        assert_eq!(
            globals["Environment"]["Variables"]["OTEL_EXPORTER_OTLP_ENDPOINT"],
            "http://localhost:4318",
            "{file}: where the collector layer listens"
        );
    }
    for (name, f) in functions(&template()) {
        assert!(
            f["Properties"].get("Tracing").is_none()
                || f["Properties"]["Tracing"]
                    == serde_json::json!({"Fn::If": ["Traced", "Active", "PassThrough"]}),
            "{name} follows the stack's Tracing"
        );
    }
}

#[test]
fn every_queue_is_named_after_the_stack() {
    let t = template();
    for (name, r) in t["Resources"].as_object().unwrap() {
        if r["Type"] == "AWS::SQS::Queue" {
            let sub = &r["Properties"]["QueueName"]["Fn::Sub"];
            // A consumer's queues: `[name, {Suffix: .fifo or nothing}]` (its Fifo parameter).
            let queue_name = sub
                .as_str()
                .or_else(|| sub[0].as_str())
                .unwrap_or_else(|| panic!("{name}: QueueName is Fn::Sub on the stack name"));
            let stem = queue_name.strip_suffix("${Suffix}").unwrap_or(queue_name);
            assert!(
                stem.starts_with("${AWS::StackName}-")
                    && (stem.ends_with("-jobs") || stem.ends_with("-dlq")),
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
        let max_receive: u64 = resolve(&t, &queue, &q["RedrivePolicy"]["maxReceiveCount"])
            .parse()
            .unwrap();
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
        for (event, e) in f["Properties"]["Events"].as_object().into_iter().flatten() {
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

/// Issue 36: as deployed, a consumer and its DLQ ingester settle a storm's letters with the
/// settle due docs/performance.md measures (`SETTLE_DUE`, the nested template's
/// `LetterSettleDueMs`), both the same, and no longer than the operations schedule that settles
/// a storm's last rows (`LETTER_SETTLE_DUE_MS` is refused above a minute).
#[test]
fn a_consumer_and_its_ingester_settle_a_storms_letters_with_the_measured_due() {
    let t = template();
    let config = |function: &str| {
        let env = environment(&t, resource(&t, function));
        (env.get("LETTER_SETTLE_DUE_MS").cloned(), env)
    };
    let consumers = consumers(&t);
    assert!(!consumers.is_empty());
    for (consumer, ingester, _, _) in consumers {
        let (due, env) = config(&consumer);
        let (ingester_due, ingester_env) = config(&ingester);
        assert_eq!(due, ingester_due, "{consumer} and {ingester}");
        let lookup = |env: &BTreeMap<String, String>| {
            let env = env.clone();
            Env::from_fn(move |k| env.get(k).cloned())
        };
        let settle_due = ConsumerConfig::from_env(&lookup(&env)).unwrap().settle_due;
        assert_eq!(
            settle_due,
            shared::dead_letter::SETTLE_DUE,
            "{consumer}: the measured due, as deployed"
        );
        assert_eq!(
            DlqIngesterConfig::from_env(&lookup(&ingester_env))
                .unwrap()
                .settle_due,
            settle_due,
            "{ingester}"
        );
    }
}

/// Issue 22: the DLQ kept a copy 14 days, the fence lived 7, and the functions' floor
/// counted only the job queue. Each stanza's queue and DLQ retentions are now the values every
/// function is told (so its start-up floor counts them), and the fence TTL the functions get is
/// at or above the floor of what the queues really keep, redrive back to the source included.
#[test]
fn every_queues_retention_is_what_its_functions_floor_counts() {
    let t = template();
    for (consumer, ingester, queue, dlq) in consumers(&t) {
        let kept = |name: &str| -> u64 {
            let v = &resource(&t, name)["Properties"]["MessageRetentionPeriod"];
            resolve(&t, name, v).parse().unwrap()
        };
        for function in [&consumer, &ingester] {
            let env = environment(&t, resource(&t, function));
            let fence =
                shared::config::FenceConfig::from_env(&Env::from_fn(|k| env.get(k).cloned()))
                    .unwrap();
            assert_eq!(
                fence.queue_retention.as_secs(),
                kept(&queue),
                "{function}: {queue}"
            );
            assert_eq!(
                fence.dlq_retention.as_secs(),
                kept(&dlq),
                "{function}: {dlq}"
            );
            let floor = shared::fence::ttl_floor(
                fence.queue_retention,
                fence.dlq_retention,
                &fence.policy,
                fence.fifo,
            );
            assert!(
                fence.ttl >= floor,
                "{function}: TTL {:?} < floor {floor:?}",
                fence.ttl
            );
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
        for (event, e) in f["Properties"]["Events"].as_object().into_iter().flatten() {
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

/// The scheduled function runs on two schedules: the scheduled run's (`SweepSchedule`, an
/// event the function does not take for the operations' work) and the bulk operations'
/// (`OperationsSchedule`, every minute by default), whose fixed input is the event the function
/// works the operations on. Without the second, an operation an operator starts never moves.
#[test]
fn the_scheduled_function_runs_the_scheduled_run_and_the_bulk_operations_on_their_schedules() {
    let t = template();
    let f = resource(&t, "ScheduledFunction");
    assert_eq!(binary(f), "scheduled");
    let mut schedules: BTreeMap<String, Option<Value>> = BTreeMap::new();
    for (name, e) in f["Properties"]["Events"].as_object().unwrap() {
        assert_eq!(e["Type"], "ScheduleV2", "{name}");
        let p = &e["Properties"];
        let parameter = p["ScheduleExpression"]["Ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: its expression is a parameter"));
        let declared = &t["Parameters"][parameter];
        assert!(
            declared["Default"]
                .as_str()
                .is_some_and(|d| d.starts_with("rate(") || d.starts_with("cron(")),
            "{name}: {parameter} defaults to an expression"
        );
        let input = p.get("Input").map(|i| {
            serde_json::from_str::<Value>(i.as_str().expect("Input is a JSON string"))
                .unwrap_or_else(|e| panic!("{name}: Input is not JSON: {e}"))
        });
        schedules.insert(parameter.to_owned(), input);
    }
    assert_eq!(
        schedules.keys().collect::<Vec<_>>(),
        ["OperationsSchedule", "SweepSchedule"],
        "the scheduled run and the bulk operations, each on its own parameter"
    );
    let operations = schedules["OperationsSchedule"]
        .as_ref()
        .expect("the operations schedule sends the operations event");
    assert!(
        scheduled::works_operations(operations),
        "{operations}: the event the function works the operations on"
    );
    assert_eq!(operations, &json!({"work": scheduled::OPERATIONS_WORK}));
    assert!(
        schedules["SweepSchedule"]
            .as_ref()
            .is_none_or(|input| !scheduled::works_operations(input)),
        "the scheduled run's schedule runs the scheduled run"
    );
    assert_eq!(
        t["Parameters"]["OperationsSchedule"]["Default"], "rate(1 minute)",
        "an operation waits at most a minute for its worker"
    );
    assert_eq!(
        t["Parameters"]["OperationsSchedule"]["AllowedPattern"],
        t["Parameters"]["SweepSchedule"]["AllowedPattern"]
    );
}

#[test]
fn the_functions_join_a_vpc_only_when_subnets_are_given() {
    let t = template();
    let root_vpc = &t["Globals"]["Function"]["VpcConfig"];
    for (name, f) in functions(&t) {
        // The root's Globals, or (nested) its own template's, on the root's own condition.
        let config = match f.get("NestedIn") {
            Some(_) => &f["Properties"]["VpcConfig"],
            None => root_vpc,
        };
        let vpc = &config["Fn::If"];
        assert_eq!(vpc[0], "InVpc", "{name}");
        assert_eq!(vpc[1]["SubnetIds"]["Ref"], "VpcSubnetIds", "{name}");
        assert_eq!(
            vpc[1]["SecurityGroupIds"]["Ref"], "VpcSecurityGroupIds",
            "{name}"
        );
        assert_eq!(vpc[2]["Ref"], "AWS::NoValue", "{name}");
    }
    assert_eq!(t["Parameters"]["VpcSubnetIds"]["Default"], "");
}

#[test]
fn the_schema_migrates_on_every_deploy_before_any_function_serves() {
    let t = template();
    let migration = resource(&t, "SchemaMigration");
    assert_eq!(migration["Type"], "Custom::SchemaMigration");
    let p = &migration["Properties"];
    assert_eq!(p["ServiceToken"]["Fn::GetAtt"][0], "MigrateFunction");
    assert_eq!(
        p["MigrateVersion"]["Ref"], "MigrateFunction.Version",
        "it runs again whenever the migrate function (which embeds the migrations) changes"
    );
    let migrate = resource(&t, "MigrateFunction");
    assert_eq!(binary(migrate), "migrate");
    assert!(migrate["Properties"]["AutoPublishAlias"].is_string());
    let timeout = migrate["Properties"]["Timeout"].as_u64().unwrap();
    assert!(
        timeout > migrate::ANSWER_MARGIN.as_secs() + 60,
        "time to migrate and still answer CloudFormation"
    );
    for (name, f) in functions(&t) {
        if name != "MigrateFunction" {
            assert_eq!(
                f["DependsOn"], "SchemaMigration",
                "{name} is updated only after the schema is migrated"
            );
        }
    }
}

#[test]
fn every_function_has_a_role_and_a_log_group_of_its_own() {
    let t = template();
    let mut roles = Vec::new();
    for (name, f) in functions(&t) {
        let role = f["Properties"]["Role"]["Fn::GetAtt"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has a role of this stack"));
        assert_eq!(resource(&t, role)["Type"], "AWS::IAM::Role");
        roles.push(role.to_owned());
        let logs = f["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} logs to a log group of this stack"));
        let group = &resource(&t, logs)["Properties"];
        assert_eq!(
            group["RetentionInDays"]["Ref"], "LogRetentionDays",
            "{name}"
        );
        // Its own environment (a nested consumer's, with its Globals applied) or the stack's.
        let level = f["Properties"]["Environment"]["Variables"]
            .get("RUST_LOG")
            .unwrap_or(&t["Globals"]["Function"]["Environment"]["Variables"]["RUST_LOG"]);
        assert_eq!(
            level["Ref"], "LogLevel",
            "{name} logs at the environment's LogLevel"
        );
        // Never Lambda's own level filter: it counts the EMF lines (no level) as INFO and would
        // drop every metric at WARN.
        assert!(
            f["Properties"]["LoggingConfig"]
                .get("ApplicationLogLevel")
                .is_none()
                && t["Globals"]["Function"]["LoggingConfig"]
                    .get("ApplicationLogLevel")
                    .is_none(),
            "{name}: no ApplicationLogLevel"
        );
        assert!(
            group["LogGroupName"]["Fn::Sub"]
                .as_str()
                .unwrap()
                .starts_with("/aws/lambda/${AWS::StackName}/"),
            "{name}: named after the stack"
        );
    }
    let unique: BTreeSet<_> = roles.iter().collect();
    assert_eq!(unique.len(), roles.len(), "no two functions share a role");
}

fn alarms(t: &Value) -> Vec<(String, &Value)> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Alarm")
        .map(|(n, r)| (n.clone(), &r["Properties"]))
        .collect()
}

/// The metric names the code emits as EMF: every consumer's and the scheduled run's.
fn emitted_metrics() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = shared::metrics::Metric::ALL
        .iter()
        .map(|m| m.name().to_owned())
        .chain([shared::metrics::JOB_DURATION, shared::metrics::MESSAGE_AGE].map(String::from))
        .collect();
    let report = shared::upkeep::ScheduledReport {
        settled: Ok(0),
        alerts: Default::default(),
        escalation: Ok(Default::default()),
        unsent_replays: Ok(Default::default()),
        sweep: Err("none".into()),
        replays: Ok(Default::default()),
        waiting: Ok(Default::default()),
        heartbeat: None,
    };
    let emf = report.emf("JobHarness", chrono::Utc::now());
    for metric in emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
    {
        names.insert(metric["Name"].as_str().unwrap().to_owned());
    }
    names
}

#[test]
fn every_alarm_reaches_a_person_and_the_alarms_cover_the_flow() {
    let t = template();
    let topic = resource(&t, "AlarmTopic");
    assert_eq!(topic["Type"], "AWS::SNS::Topic");
    let subscription = resource(&t, "AlarmEmailSubscription");
    assert_eq!(subscription["Properties"]["Endpoint"]["Ref"], "AlarmEmail");
    assert_eq!(subscription["Condition"], "HasAlarmEmail");
    let namespace =
        t["Globals"]["Function"]["Environment"]["Variables"]["METRICS_NAMESPACE"]["Fn::Sub"]
            .as_str()
            .unwrap();
    assert_eq!(
        namespace, "JobHarness/${AWS::StackName}",
        "one namespace per stack"
    );
    let emitted = emitted_metrics();
    let mut watched: BTreeSet<(String, String)> = BTreeSet::new();
    for (name, alarm) in alarms(&t) {
        for key in ["AlarmActions", "OKActions"] {
            assert_eq!(
                alarm[key],
                serde_json::json!([{"Ref": "AlarmTopic"}]),
                "{name}: {key}"
            );
        }
        let description = alarm["AlarmDescription"]
            .as_str()
            .or_else(|| alarm["AlarmDescription"]["Fn::Sub"].as_str())
            .unwrap_or_else(|| panic!("{name} has a description"));
        assert!(description.len() > 40, "{name} says what to do");
        let metric = alarm["MetricName"].as_str().unwrap().to_owned();
        let dimension = alarm["Dimensions"][0]["Value"].clone();
        let on = dimension["Ref"]
            .as_str()
            .or_else(|| dimension["Fn::GetAtt"][0].as_str())
            .or_else(|| dimension.as_str())
            .unwrap()
            .to_owned();
        if alarm["Namespace"]["Fn::Sub"].as_str() == Some(namespace) {
            assert!(
                emitted.contains(&metric),
                "{name}: {metric} is emitted by the code"
            );
        }
        watched.insert((metric, on));
    }
    let has = |metric: &str, on: &str| watched.contains(&(metric.to_owned(), on.to_owned()));
    for (name, _) in functions(&t) {
        if name != "MigrateFunction" {
            assert!(has("Errors", &name), "{name} has an errors alarm");
        }
    }
    for (consumer, _, queue, dlq) in consumers(&t) {
        assert!(has("ApproximateAgeOfOldestMessage", &queue), "{queue}");
        assert!(has("ApproximateNumberOfMessagesVisible", &dlq), "{dlq}");
        let env = environment(&t, resource(&t, &consumer));
        assert!(
            has("DeadLetterWriteFailed", &env["CONSUMER_NAME"]),
            "{consumer}"
        );
    }
    for metric in [
        "LettersPendingReview",
        "OldestPendingLetterAgeSeconds",
        "AlertsRejected",
        "OldestUndeliveredAlertSeconds",
        "AlertDeliveriesFailed",
        "SweepBacklogSeconds",
        "ScheduledStepsFailed",
        "QueuedReplaysOverdue",
        "LettersSetAside",
        "OldestReceivedLetterSeconds",
    ] {
        assert!(has(metric, "scheduled"), "an alarm on {metric}");
    }
    // A scheduler that stopped: watched on the run's own report (a metric every run emits),
    // since the operations schedule keeps invoking the function without it.
    let stopped = alarms(&t)
        .into_iter()
        .find(|(_, a)| a["TreatMissingData"] == "breaching")
        .expect("an alarm for a scheduler that stopped");
    assert_eq!(
        (
            stopped.1["MetricName"].as_str(),
            stopped.1["Statistic"].as_str(),
            stopped.1["ComparisonOperator"].as_str()
        ),
        (
            Some("ScheduledStepsFailed"),
            Some("SampleCount"),
            Some("LessThanThreshold")
        ),
        "{}: counts the scheduled run's reports, not the function's invocations",
        stopped.0
    );
    let scheduled = environment(&t, resource(&t, "ScheduledFunction"));
    assert!(scheduled.contains_key("BETTERSTACK_HEARTBEAT_URL"));
    assert_eq!(
        t["Parameters"]["BetterStackHeartbeatUrl"]["NoEcho"], true,
        "the heartbeat URL is a secret of sorts"
    );
}

/// The metric a dashboard entry shows: `[namespace, name, ...]`, or the `MetricName="..."` of a
/// `SEARCH` expression (which finds every consumer by itself).
fn shown_metric(entry: &Value) -> String {
    if let Some(expression) = entry[0]["expression"].as_str() {
        let (_, rest) = expression
            .split_once("MetricName=\"")
            .unwrap_or_else(|| panic!("{expression}: a SEARCH for one metric"));
        assert!(expression.starts_with("SEARCH("), "{expression}");
        return rest.split('"').next().unwrap().to_owned();
    }
    entry[1].as_str().unwrap().to_owned()
}

#[test]
fn the_dashboard_is_valid_json_and_shows_the_flow() {
    let t = template();
    let body = resource(&t, "Dashboard")["Properties"]["DashboardBody"]["Fn::Sub"]
        .as_str()
        .unwrap();
    let substituted = body
        .replace("${AWS::Region}", "eu-west-1")
        .replace("${AWS::StackName}", "jobs-staging");
    assert!(
        !substituted.contains("${"),
        "the dashboard names no resource of a consumer: it finds them by SEARCH"
    );
    for (consumer, ..) in consumers(&t) {
        let env = environment(&t, resource(&t, &consumer));
        assert!(
            !body.contains(&format!("\"{}\"", env["CONSUMER_NAME"])),
            "the dashboard names no consumer ({consumer}): a new one shows up with no edit"
        );
    }
    let dashboard: Value = serde_json::from_str(&substituted).expect("JSON once substituted");
    let entries: Vec<Value> = dashboard["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["properties"]["metrics"].as_array().unwrap().clone())
        .collect();
    for entry in &entries {
        if let Some(expression) = entry[0]["expression"].as_str()
            && expression.contains("Consumer}")
        {
            assert!(
                expression.contains("{\"JobHarness/jobs-staging\",Consumer}"),
                "{expression}: consumers are searched in this stack's namespace"
            );
        }
    }
    let shown: BTreeSet<String> = entries.iter().map(shown_metric).collect();
    for metric in [
        "NumberOfMessagesReceived",
        "Processed",
        "DuplicateSkipped",
        "Retried",
        "DeadLetteredExhausted",
        "LettersPendingReview",
        "FencesDeleted",
        "SweepBacklogSeconds",
        "MessageAge",
        "JobDuration",
    ] {
        assert!(shown.contains(metric), "the dashboard shows {metric}");
    }
    let emitted = emitted_metrics();
    for metric in &shown {
        assert!(
            emitted.contains(metric) || metric == "NumberOfMessagesReceived",
            "{metric} is emitted"
        );
    }
}

/// The lines of `template.yaml` that declare resource `name` (its key to its last line).
fn stanza_lines(text: &str, name: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == format!("  {name}:"))
        .unwrap_or_else(|| panic!("{name} is a resource of template.yaml"));
    let mut stanza: Vec<String> = vec![lines[start].to_owned()];
    for line in &lines[start + 1..] {
        let top_level = !line.starts_with(' ') && !line.is_empty();
        let next_resource = line.starts_with("  ") && !line.starts_with("   ");
        if top_level || next_resource {
            break;
        }
        stanza.push((*line).to_owned());
    }
    while stanza.last().is_some_and(|l| l.trim().is_empty()) {
        stanza.pop();
    }
    stanza
}

/// Issue 23: a new consumer is its crate and one short stanza. Each consumer of the template is
/// an application on the one nested template, waits for the schema, passes the harness's own
/// settings as the root's parameters of the same name (so an override reaches every consumer),
/// and is under 25 lines of `template.yaml`.
#[test]
fn a_consumer_is_one_stanza_of_under_25_lines_on_the_nested_template() {
    let root = stacks::root_source();
    let text = std::fs::read_to_string(stacks::repository().join("template.yaml")).unwrap();
    let apps = stacks::applications(&root);
    assert!(!apps.is_empty(), "the template declares its consumers");
    let nested = stacks::nested_sources(&root);
    for (app, location) in &apps {
        assert_eq!(location, "templates/consumer.yaml", "{app}");
        let stanza = &root["Resources"][app];
        assert_eq!(stanza["Type"], "AWS::Serverless::Application", "{app}");
        assert_eq!(stanza["DependsOn"], "SchemaMigration", "{app}");
        let given = &stanza["Properties"]["Parameters"];
        for (name, declared) in nested[location]["Parameters"].as_object().unwrap() {
            if declared.get("Default").is_some() {
                continue; // what differs between consumers
            }
            if root["Parameters"].get(name).is_some() {
                let passed = &given[name];
                assert!(
                    passed["Ref"] == name.as_str() || passed["Fn::Join"][1]["Ref"] == name.as_str(),
                    "{app}: {name} is the root's {name}, not {passed}"
                );
            } else {
                assert!(given.get(name).is_some(), "{app} passes {name}");
            }
        }
        let lines = stanza_lines(&text, app);
        assert!(
            lines.len() < 25,
            "{app}: {} lines of template.yaml:\n{}",
            lines.len(),
            lines.join("\n")
        );
    }
    // Every consumer function of the flattened template lives in a consumer application.
    let t = template();
    for (consumer, ingester, queue, dlq) in consumers(&t) {
        for name in [&consumer, &ingester, &queue, &dlq] {
            assert!(
                resource(&t, name)["NestedIn"].is_string(),
                "{name} is declared by a consumer stanza, not by hand"
            );
        }
    }
}

#[test]
fn samconfig_holds_a_staging_and_a_production_environment_each_whole() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../samconfig.toml");
    let config: toml::Table = std::fs::read_to_string(path)
        .expect("samconfig.toml at the repository root")
        .parse()
        .expect("TOML");
    let t = template();
    let required: Vec<&String> = t["Parameters"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["Default"].is_null())
        .map(|(name, _)| name)
        .collect();
    let mut stacks = BTreeSet::new();
    for env in ["staging", "production"] {
        let deploy = &config[env]["deploy"]["parameters"];
        let stack = deploy["stack_name"].as_str().unwrap();
        stacks.insert(stack.to_owned());
        assert!(
            deploy["capabilities"]
                .as_str()
                .unwrap()
                .contains("CAPABILITY_IAM")
        );
        let overrides = deploy["parameter_overrides"].as_str().unwrap();
        assert!(overrides.contains("LogLevel="), "{env} says its log level");
        assert!(
            overrides.contains("Tracing="),
            "{env} says whether it is traced"
        );
        for name in &required {
            assert!(
                overrides.contains(&format!("{name}=")),
                "{env} gives the required parameter {name}"
            );
        }
    }
    assert_eq!(stacks.len(), 2, "one stack per environment");
}

/// Issue 25: a stanza declares its job queue FIFO with one line (`Fifo: "true"`), and then its
/// job queue and its DLQ are both FIFO queues (SQS requires it), named `….fifo`, with
/// content-based deduplication on the job queue; without it, both stay standard queues.
#[test]
fn a_stanza_declares_its_queues_fifo_with_one_line() {
    let mut root = stacks::root_source();
    root["Resources"]["RedeemReward"]["Properties"]["Parameters"]["Fifo"] = json!("true");
    let nested = stacks::nested_sources(&root);
    let t = stacks::flatten(&root, &nested);
    let fifo_condition = |app: &str| {
        let props = &resource(&t, &format!("{app}JobQueue"))["Properties"];
        let condition = props["FifoQueue"]["Fn::If"][0].as_str().unwrap().to_owned();
        let dlq = &resource(&t, &format!("{app}DeadLetterQueue"))["Properties"];
        for p in [props, dlq] {
            assert_eq!(p["FifoQueue"]["Fn::If"][0], condition.as_str(), "{app}");
            assert_eq!(
                p["QueueName"]["Fn::Sub"][1]["Suffix"]["Fn::If"][0],
                condition.as_str()
            );
            assert_eq!(p["QueueName"]["Fn::Sub"][1]["Suffix"]["Fn::If"][1], ".fifo");
        }
        assert_eq!(
            props["ContentBasedDeduplication"]["Fn::If"][0],
            condition.as_str()
        );
        t["Conditions"][&condition]["Fn::Equals"].clone()
    };
    // The stanza's one line holds the condition true; the other consumer's is false.
    assert_eq!(fifo_condition("RedeemReward"), json!(["true", "true"]));
    assert_eq!(fifo_condition("AwardPoints"), json!(["false", "true"]));
    // The FIFO consumer's event source takes batches of at most 10 (SQS FIFO's limit) and
    // reports batch item failures, which the harness answers per message group.
    let events =
        &resource(&t, "RedeemRewardFunction")["Properties"]["Events"]["Jobs"]["Properties"];
    assert_eq!(
        events["FunctionResponseTypes"],
        json!(["ReportBatchItemFailures"])
    );
    assert!(events.get("MaximumBatchingWindowInSeconds").is_none());
    let max_batch = t["Parameters"]["ConsumerBatchSize"]["MaxValue"]
        .as_u64()
        .unwrap();
    assert!(
        max_batch <= 10,
        "a FIFO event source takes at most 10 records a batch"
    );
    // Issue 34, items 3 and 4: at the FIFO defaults every function of the stanza starts (its
    // fence TTL above the FIFO floor, each DLQ stay counted from the move), and the queue
    // redrives no record held back behind its group's head: batch size x (attempts + 2).
    let queue = &resource(&t, "RedeemRewardJobQueue")["Properties"];
    let redrive: u32 = resolve(
        &t,
        "maxReceiveCount",
        &queue["RedrivePolicy"]["maxReceiveCount"],
    )
    .parse()
    .unwrap();
    let batch: u32 = resolve(&t, "BatchSize", &events["BatchSize"])
        .parse()
        .unwrap();
    for function in ["RedeemRewardFunction", "RedeemRewardDlqIngesterFunction"] {
        let env = environment(&t, resource(&t, function));
        let fence = shared::config::FenceConfig::from_env(&Env::from_fn(|k| env.get(k).cloned()))
            .unwrap_or_else(|e| panic!("{function}: {e}"));
        assert!(fence.fifo, "{function}");
        let floor = shared::fence::ttl_floor(
            fence.queue_retention,
            fence.dlq_retention,
            &fence.policy,
            true,
        );
        assert!(
            fence.ttl >= floor,
            "{function}: {:?} < {floor:?}",
            fence.ttl
        );
        assert_eq!(fence.max_receive_count, redrive, "{function}");
        let attempts = fence.policy.max_attempts();
        assert!(
            redrive >= shared::config::least_receive_count(true, batch, attempts),
            "{function}: {redrive} receives"
        );
    }
    // The standard stanza keeps the standard redrive.
    let standard = &resource(&t, "AwardPointsJobQueue")["Properties"];
    assert_eq!(
        resolve(
            &t,
            "maxReceiveCount",
            &standard["RedrivePolicy"]["maxReceiveCount"]
        ),
        "7"
    );
}
