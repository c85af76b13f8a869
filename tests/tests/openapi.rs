//! `functions/dead-letter-api/openapi.yaml` against the code: the same routes and scopes, the same
//! query parameters and bounds, the same enums, and the same fields in the letters, groups and
//! bulk operations the API sends.

use dead_letter_api::api::list_query::{
    DEFAULT_LIMIT, GROUP_PARAMETERS, LIST_PARAMETERS, MAX_LIMIT,
};
use dead_letter_api::api::{MAX_REASON_CHARS, ROUTES, Scope};
use serde_json::{Value, json};
use shared::dead_letter::{DeadLetter, ErrorKind, LetterHead};
use shared::dead_letter::{LetterSummary, ReviewStatus};
use std::collections::BTreeSet;

fn document() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../functions/dead-letter-api/openapi.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the OpenAPI document");
    serde_norway::from_str(&text).expect("valid YAML")
}

fn resolve<'a>(doc: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(reference) => doc
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling $ref {reference}")),
        None => node,
    }
}

fn strings(node: &Value) -> Vec<String> {
    node.as_array()
        .unwrap_or_else(|| panic!("not a list: {node}"))
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

fn keys(node: &Value) -> BTreeSet<String> {
    node.as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

#[test]
fn the_document_is_openapi_3_1_with_exactly_the_routes_and_scopes_of_the_code() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let scopes = strings(&operation["security"][0]["jwt"]);
            documented.insert((method.to_uppercase(), path.clone(), scopes));
        }
    }
    let in_code: BTreeSet<_> = ROUTES
        .iter()
        .map(|r| {
            (
                r.method.to_owned(),
                r.path.to_owned(),
                vec![r.scope.as_str().to_owned()],
            )
        })
        .collect();
    assert_eq!(documented, in_code);
    let granted =
        keys(&doc["components"]["securitySchemes"]["jwt"]["flows"]["clientCredentials"]["scopes"]);
    let scopes: BTreeSet<_> = [Scope::Read, Scope::Replay, Scope::Discard, Scope::Edit]
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(granted, scopes);
}

#[test]
fn parameters_bounds_and_enums_match_the_validation() {
    let doc = document();
    let list = &doc["paths"]["/v1/core/dead-letters"]["get"];
    let params: Vec<&Value> = list["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| resolve(&doc, p))
        .collect();
    let names: Vec<&str> = params.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, LIST_PARAMETERS);
    let groups = &doc["paths"]["/v1/core/dead-letter-groups"]["get"];
    let names: Vec<&str> = groups["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| resolve(&doc, p)["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, GROUP_PARAMETERS);
    let group_statuses: Vec<_> = shared::dead_letter::GroupStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .chain(["all".to_owned()])
        .collect();
    assert_eq!(
        strings(&groups["parameters"][0]["schema"]["enum"]),
        group_statuses
    );
    let limit = params.iter().find(|p| p["name"] == "limit").unwrap();
    assert_eq!(limit["schema"]["maximum"], MAX_LIMIT);
    assert_eq!(limit["schema"]["default"], DEFAULT_LIMIT);

    let schemas = &doc["components"]["schemas"];
    let statuses: Vec<_> = ReviewStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(strings(&schemas["Status"]["enum"]), statuses);
    let kinds: Vec<_> = ErrorKind::ALL
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    assert_eq!(strings(&schemas["ErrorKind"]["enum"]), kinds);

    let discard = &doc["paths"]["/v1/core/dead-letters/{id}/discard"]["post"];
    let reason =
        &discard["requestBody"]["content"]["application/json"]["schema"]["properties"]["reason"];
    assert_eq!(reason["maxLength"], MAX_REASON_CHARS);
    for route in ROUTES {
        let operation = &doc["paths"][route.path][route.method.to_lowercase()];
        let statuses = keys(&operation["responses"]);
        for status in ["200", "401", "403", "503"] {
            assert!(
                statuses.contains(status),
                "{} {} documents {status}",
                route.method,
                route.path
            );
        }
    }
}

#[test]
fn the_letter_schemas_have_exactly_the_fields_the_api_sends() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let head = LetterHead {
        id: shared::ids::DeadLetterId(uuid::Uuid::nil()),
        job_id: None,
        tenant_id: None,
        consumer: shared::ids::ConsumerName::new("c").unwrap(),
        queue: "q".into(),
        message_id: "m".into(),
        attempts: 1,
        error_kind: shared::dead_letter::ErrorKind::Poison,
        last_error: "e".into(),
        correlation_id: None,
        replay_of: None,
        status: shared::dead_letter::ReviewStatus::PendingReview,
        discard_reason: None,
        reviewed_by: None,
        reviewed_at: None,
        created_at: chrono::Utc::now(),
        replay_outcome: None,
        group_id: None,
    };
    let letter = DeadLetter {
        head: head.clone(),
        payload: Value::Null,
        body: None,
        job_digest: None,
        digest_fields: None,
        replay_message_id: None,
        replay_sent_at: None,
        replay_reason: None,
        replay_body: None,
        message_group: None,
        replay_withdrawn_by: None,
        replay_withdrawn_at: None,
        replay_withdraw_reason: None,
        operation_id: None,
        trace_parent: None,
    };
    let sent = serde_json::to_value(&letter).unwrap();
    assert_eq!(keys(&schemas["DeadLetter"]["properties"]), keys(&sent));
    let summary = LetterSummary {
        head,
        last_error_truncated: false,
        fence_exists: None,
    };
    let listed = serde_json::to_value(&summary).unwrap();
    assert_eq!(keys(&schemas["LetterSummary"]["properties"]), keys(&listed));
}

#[test]
fn the_group_schema_has_exactly_the_fields_the_api_sends() {
    use shared::dead_letter::{Group, GroupStatus, Incident};
    let doc = document();
    let schema = &doc["components"]["schemas"]["Group"];
    let now = chrono::Utc::now();
    let group = Group {
        id: shared::ids::GroupId(7),
        status: GroupStatus::Open,
        consumer: shared::ids::ConsumerName::new("c").unwrap(),
        queue: "q".into(),
        error_kind: ErrorKind::Exhausted,
        pattern: "timeout after <n>".into(),
        sample_error: "timeout after 3 s".into(),
        last_error: "timeout after 4 s".into(),
        sample_letter_id: shared::ids::DeadLetterId(uuid::Uuid::nil()),
        sample_job_id: None,
        sample_correlation_id: None,
        letter_count: 2,
        pending_count: 2,
        first_letter_at: now,
        last_letter_at: now,
        resolved_at: None,
        incident: Some(Incident {
            id: "1".into(),
            opened_at: now,
            count: 1,
            updated_at: None,
            resolved_at: None,
        }),
        delivery_failures: 0,
        last_delivery_error: None,
    };
    let sent = serde_json::to_value(&group).unwrap();
    assert_eq!(keys(&schema["properties"]), keys(&sent));
    let incident = &schema["properties"]["incident"]["oneOf"][1];
    assert_eq!(keys(&incident["properties"]), keys(&sent["incident"]));
    let statuses: Vec<_> = GroupStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    assert_eq!(strings(&schema["properties"]["status"]["enum"]), statuses);
}

/// Issue 22, item 7: the bounds the document states are the ones the API enforces, and the
/// throttle it names is the template's, which the dlq tool's polling stays well within.
#[test]
fn the_documented_bounds_are_the_ones_the_api_and_the_tool_enforce() {
    use dead_letter_api::api::MAX_BODY_BYTES;
    use dead_letter_api::api::list_query::{MAX_CURSOR_CHARS, MAX_QUEUE_CHARS, MAX_TEXT_BYTES};
    let doc = document();
    let param = |path: &str, name: &str| -> Value {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| resolve(&doc, p))
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{path} documents {name}"))["schema"]
            .clone()
    };
    for path in ["/v1/core/dead-letters", "/v1/core/dead-letter-groups"] {
        assert_eq!(param(path, "queue")["maxLength"], MAX_QUEUE_CHARS, "{path}");
        assert_eq!(
            param(path, "consumer")["maxLength"],
            128,
            "{path}: as ConsumerName"
        );
        assert_eq!(
            param(path, "cursor")["maxLength"],
            MAX_CURSOR_CHARS,
            "{path}"
        );
    }
    for name in ["correlation_id", "message_id"] {
        assert_eq!(
            param("/v1/core/dead-letters", name)["maxLength"],
            MAX_TEXT_BYTES
        );
    }
    assert_eq!(
        param("/v1/core/dead-letters", "group_id")["maximum"],
        i64::MAX
    );
    for route in ["replay", "discard"] {
        let operation = &doc["paths"][format!("/v1/core/dead-letters/{{id}}/{route}")]["post"];
        let reason = &operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
            ["reason"];
        assert_eq!(reason["maxLength"], MAX_REASON_CHARS, "{route}");
        assert!(keys(&operation["responses"]).contains("413"), "{route}");
    }
    let too_large = doc["components"]["responses"]["TooLarge"]["description"]
        .as_str()
        .unwrap();
    assert!(
        too_large.contains(&MAX_BODY_BYTES.to_string()),
        "{too_large}"
    );
    let template =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
    let throttle: f64 = template
        .lines()
        .find_map(|l| l.trim().strip_prefix("ThrottlingRateLimit:"))
        .expect("the API's throttle in template.yaml")
        .trim()
        .parse()
        .unwrap();
    assert!(
        1.0 / dlq::bulk::POLL.as_secs_f64() <= throttle / 10.0,
        "dlq's polling of an operation it follows stays well within the throttle"
    );
    let description = doc["info"]["description"].as_str().unwrap();
    assert!(
        description.contains(&format!("{throttle} requests/s")),
        "{description}"
    );
}

/// Issue 36: the bulk operations' schemas have exactly the fields the API sends (a real
/// `shared::operations::Operation`, its progress and its selection with every filter set, and a
/// plan), the enums are the code's, the request's filter takes the letter list's parameters but
/// those an operation refuses, and each operation route answers with these schemas.
#[test]
fn the_operation_schemas_have_exactly_the_fields_the_api_sends() {
    use shared::dead_letter::ListFilter;
    use shared::ids::{GroupId, JobId, TenantId};
    use shared::operations::{Action, Operation, Plan, Progress, Status};
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let now = chrono::Utc::now();
    let nil = uuid::Uuid::nil();
    let selection = ListFilter {
        status: None,
        queue: Some("q".into()),
        consumer: Some("c".into()),
        error_kind: Some(ErrorKind::Exhausted),
        created_from: Some(now),
        created_before: Some(now),
        job_id: Some(JobId(nil)),
        correlation_id: Some("order-1".into()),
        tenant_id: Some(TenantId(nil)),
        message_id: Some("m".into()),
        group_id: Some(GroupId(7)),
        id_range: Some((nil, nil)),
    };
    let operation = Operation {
        id: nil,
        action: Action::Replay,
        selection,
        reason: "partner back".into(),
        requested_by: "oncall".into(),
        created_at: now,
        through: now,
        planned: 3,
        status: Status::Running,
        progress: Progress::default(),
        cancelled_by: None,
        cancel_reason: None,
        finished_at: None,
        updated_at: now,
        failures: 0,
        last_error: None,
    };
    let sent = serde_json::to_value(&operation).unwrap();
    let schema = &schemas["Operation"];
    assert_eq!(keys(&schema["properties"]), keys(&sent));
    let required: BTreeSet<String> = strings(&schema["required"]).into_iter().collect();
    assert_eq!(
        required,
        keys(&sent),
        "every field is always sent (null when unset)"
    );
    assert_eq!(
        keys(&schemas["OperationProgress"]["properties"]),
        keys(&sent["progress"])
    );
    assert_eq!(
        keys(&schemas["Selection"]["properties"]),
        keys(&sent["selection"]),
        "every filter an operation keeps (status never: it takes pending letters)"
    );
    let plan = serde_json::to_value(Plan::default()).unwrap();
    assert_eq!(keys(&schemas["Plan"]["properties"]), keys(&plan));
    let actions: Vec<_> = Action::ALL.iter().map(|a| a.as_str().to_owned()).collect();
    assert_eq!(strings(&schemas["OperationAction"]["enum"]), actions);
    let statuses: Vec<_> = Status::ALL.iter().map(|s| s.as_str().to_owned()).collect();
    assert_eq!(strings(&schema["properties"]["status"]["enum"]), statuses);

    let request = &schemas["OperationRequest"]["properties"];
    let filters: BTreeSet<String> = LIST_PARAMETERS
        .iter()
        .filter(|p| !["status", "limit", "cursor"].contains(p))
        .map(|p| p.to_string())
        .collect();
    assert_eq!(keys(&request["filter"]["properties"]), filters);
    assert_eq!(request["reason"]["maxLength"], MAX_REASON_CHARS);

    let answer = |path: &str, method: &str, status: &str| -> Value {
        let response = &doc["paths"][path][method]["responses"][status];
        resolve(
            &doc,
            &resolve(&doc, response)["content"]["application/json"]["schema"],
        )
        .clone()
    };
    let operation_ref = json!({"$ref": "#/components/schemas/Operation"});
    for action in ["replay", "discard"] {
        let path = format!("/v1/core/dead-letter-operations/{action}");
        assert_eq!(
            answer(&path, "post", "202")["properties"]["operation"],
            operation_ref
        );
        let planned = answer(&path, "post", "200");
        assert_eq!(
            planned["properties"]["plan"],
            json!({"$ref": "#/components/schemas/Plan"}),
            "{path}: a dry run answers the plan"
        );
    }
    let one = "/v1/core/dead-letter-operations/{id}";
    assert_eq!(
        answer(one, "get", "200")["properties"]["operation"],
        operation_ref
    );
    let cancel = "/v1/core/dead-letter-operations/{id}/cancel";
    assert_eq!(
        answer(cancel, "post", "200")["properties"]["operation"],
        operation_ref
    );
    assert!(keys(&doc["paths"][cancel]["post"]["responses"]).contains("409"));
    let listed = answer("/v1/core/dead-letter-operations", "get", "200");
    assert_eq!(listed["properties"]["items"]["items"], operation_ref);
}
