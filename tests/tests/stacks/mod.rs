//! `template.yaml` and the nested templates its consumers use, seen as one template, so the
//! template tests (`template.rs`, `least_privilege.rs`) check every resource that deploys,
//! wherever it is written. Each consumer is an `AWS::Serverless::Application` whose `Location`
//! is a local template (`templates/consumer.yaml`); [`flatten`] copies that template's resources
//! into the root under the application's logical id (`AwardPoints` + `Role` = `AwardPointsRole`),
//! with each of its parameters replaced by what the stanza passes (a root parameter, a root
//! resource, or a literal) and its conditions by the root's equal ones. The copies carry
//! `"NestedIn": "<application>"`. It works on the source (`AWS::Serverless::Application`,
//! nested `Globals` applied as SAM applies them) and on SAM's translation
//! (`AWS::CloudFormation::Stack`) alike.

#![allow(dead_code)] // each test file uses its part

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The repository root (where `template.yaml` is).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A template file as JSON, YAML merge keys (`<<: *anchor`) applied as SAM CLI applies them.
pub fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut yaml: serde_norway::Value = serde_norway::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is YAML with long-form intrinsics: {e}", path.display()));
    yaml.apply_merge().expect("merge keys resolve");
    serde_json::to_value(yaml).expect("a template is JSON-shaped")
}

/// `template.yaml` as written.
pub fn root_source() -> Value {
    read(&repository().join("template.yaml"))
}

/// The root's consumer applications: (logical id, the nested template's `Location`), for the
/// source (`AWS::Serverless::Application`) or the translation (`AWS::CloudFormation::Stack`).
pub fn applications(root: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, r) in root["Resources"].as_object().expect("Resources") {
        let location = match r["Type"].as_str() {
            Some("AWS::Serverless::Application") => &r["Properties"]["Location"],
            Some("AWS::CloudFormation::Stack") => &r["Properties"]["TemplateURL"],
            _ => continue,
        };
        let location = location
            .as_str()
            .unwrap_or_else(|| panic!("{name}: a local nested template, not {location}"));
        assert!(
            !location.contains("://"),
            "{name}: nested templates are local files of this repository, not {location}"
        );
        out.push((name.clone(), location.to_owned()));
    }
    out
}

/// Every nested template the root uses, by `Location`, as written.
pub fn nested_sources(root: &Value) -> BTreeMap<String, Value> {
    applications(root)
        .into_iter()
        .map(|(_, location)| {
            let t = read(&repository().join(&location));
            (location, t)
        })
        .collect()
}

/// `template.yaml` with each consumer's nested template flattened in (the source view).
pub fn template() -> Value {
    let root = root_source();
    let nested = nested_sources(&root);
    flatten(&root, &nested)
}

/// `root` with the resources of each application's nested template (`nested`, by `Location`)
/// flattened in.
pub fn flatten(root: &Value, nested: &BTreeMap<String, Value>) -> Value {
    let mut out = root.clone();
    for (app, location) in applications(root) {
        let child = nested
            .get(&location)
            .unwrap_or_else(|| panic!("{app}: no nested template {location}"));
        let mut copy = Nested::new(root, &app, child);
        let resources = copy.resources();
        let conditions = std::mem::take(&mut copy.new_conditions);
        let r = out["Resources"].as_object_mut().unwrap();
        for (name, resource) in resources {
            assert!(
                r.insert(name.clone(), resource).is_none(),
                "{name} of {app} collides with a resource of the root"
            );
        }
        if !conditions.is_empty() {
            let c = out
                .as_object_mut()
                .unwrap()
                .entry("Conditions")
                .or_insert_with(|| json!({}));
            for (name, condition) in conditions {
                c[name] = condition;
            }
        }
    }
    out
}

/// One application's nested template, being copied into the root.
struct Nested<'a> {
    app: String,
    child: &'a Value,
    /// The nested template's parameters, by name: the value the application gives each.
    values: BTreeMap<String, Value>,
    /// The nested template's conditions, by name: the root's condition they equal, or a new one.
    conditions: BTreeMap<String, String>,
    new_conditions: Vec<(String, Value)>,
    /// What the application's resource waits for, which every copied resource then waits for.
    depends_on: Vec<Value>,
}

impl<'a> Nested<'a> {
    fn new(root: &Value, app: &str, child: &'a Value) -> Self {
        let application = &root["Resources"][app];
        let given = &application["Properties"]["Parameters"];
        let mut values = BTreeMap::new();
        for (name, declared) in child["Parameters"].as_object().into_iter().flatten() {
            let value = match (given.get(name), declared.get("Default")) {
                (Some(v), _) => v.clone(),
                (None, Some(default)) => default.clone(),
                (None, None) => panic!("{app} does not pass {name}, which has no default"),
            };
            let value = match (declared["Type"].as_str(), value) {
                // A list passed as one string: `Fn::Join: [",", <list>]` gives the list back.
                (Some("CommaDelimitedList"), Value::Object(o))
                    if o.get("Fn::Join").is_some_and(|j| j[0] == ",") =>
                {
                    o["Fn::Join"][1].clone()
                }
                (Some("CommaDelimitedList"), Value::String(s)) => {
                    Value::Array(s.split(',').map(|p| json!(p)).collect())
                }
                (_, Value::Number(n)) => Value::String(n.to_string()),
                (_, v) => v,
            };
            values.insert(name.clone(), value);
        }
        for name in given.as_object().into_iter().flatten().map(|(k, _)| k) {
            assert!(
                values.contains_key(name),
                "{app} passes {name}, which the nested template does not declare"
            );
        }
        let depends_on = match &application["DependsOn"] {
            Value::Null => Vec::new(),
            Value::Array(a) => a.clone(),
            one => vec![one.clone()],
        };
        let mut nested = Nested {
            app: app.to_owned(),
            child,
            values,
            conditions: BTreeMap::new(),
            new_conditions: Vec::new(),
            depends_on,
        };
        for (name, definition) in child["Conditions"].as_object().into_iter().flatten() {
            let rewritten = nested.rewrite(definition);
            let same = root["Conditions"]
                .as_object()
                .into_iter()
                .flatten()
                .find(|(_, d)| **d == rewritten)
                .map(|(n, _)| n.clone());
            let mapped = same.unwrap_or_else(|| {
                let new = format!("{app}{name}");
                nested.new_conditions.push((new.clone(), rewritten));
                new
            });
            nested.conditions.insert(name.clone(), mapped);
        }
        nested
    }

    fn is_resource(&self, name: &str) -> bool {
        self.child["Resources"].get(name).is_some()
    }

    fn renamed(&self, name: &str) -> String {
        format!("{}{name}", self.app)
    }

    fn condition(&self, name: &Value) -> Value {
        let name = name.as_str().expect("a condition name");
        json!(
            self.conditions
                .get(name)
                .unwrap_or_else(|| panic!("{}: no condition {name}", self.app))
        )
    }

    /// The copied resources, renamed, with the nested `Globals` applied to its functions.
    fn resources(&mut self) -> Vec<(String, Value)> {
        let globals = &self.child["Globals"]["Function"];
        let mut out = Vec::new();
        for (name, resource) in self.child["Resources"].as_object().expect("Resources") {
            let mut resource = resource.clone();
            if resource["Type"] == "AWS::Serverless::Function" && globals.is_object() {
                apply_globals(&mut resource["Properties"], globals);
            }
            let mut copy = self.rewrite(&resource);
            let o = copy.as_object_mut().unwrap();
            if let Some(c) = o.get("Condition").cloned() {
                o.insert("Condition".into(), self.condition(&c));
            }
            let mut depends_on = self.depends_on.clone();
            match o.remove("DependsOn") {
                Some(Value::Array(a)) => depends_on.extend(a.iter().map(|d| self.dependency(d))),
                Some(one) => depends_on.push(self.dependency(&one)),
                None => {}
            }
            match depends_on.len() {
                0 => {}
                1 => {
                    o.insert("DependsOn".into(), depends_on.remove(0));
                }
                _ => {
                    o.insert("DependsOn".into(), Value::Array(depends_on));
                }
            }
            o.insert("NestedIn".into(), json!(self.app));
            out.push((self.renamed(name), copy));
        }
        out
    }

    fn dependency(&self, d: &Value) -> Value {
        json!(self.renamed(d.as_str().expect("DependsOn names a resource")))
    }

    /// `v` in the root's terms.
    fn rewrite(&self, v: &Value) -> Value {
        match v {
            Value::Array(items) => Value::Array(items.iter().map(|i| self.rewrite(i)).collect()),
            Value::Object(o) if o.len() == 1 => {
                let (key, inner) = o.iter().next().unwrap();
                match key.as_str() {
                    "Ref" => {
                        let name = inner.as_str().expect("Ref names something");
                        if let Some(value) = self.values.get(name) {
                            value.clone()
                        } else if self.is_resource(name) {
                            json!({"Ref": self.renamed(name)})
                        } else {
                            assert!(
                                name.starts_with("AWS::") && name != "AWS::StackName",
                                "{}: Ref {name} (names derive from HarnessStackName)",
                                self.app
                            );
                            v.clone()
                        }
                    }
                    "Fn::GetAtt" => {
                        let (target, attribute) = match inner {
                            Value::Array(a) => (
                                a[0].as_str().unwrap().to_owned(),
                                a[1].as_str().unwrap().to_owned(),
                            ),
                            Value::String(s) => {
                                let (t, a) = s.split_once('.').expect("GetAtt X.Attr");
                                (t.to_owned(), a.to_owned())
                            }
                            other => panic!("{}: GetAtt {other}", self.app),
                        };
                        assert!(self.is_resource(&target), "{}: GetAtt {target}", self.app);
                        json!({"Fn::GetAtt": [self.renamed(&target), attribute]})
                    }
                    "Fn::Sub" => match inner {
                        Value::String(s) => json!({"Fn::Sub": self.substitute(s, &[])}),
                        Value::Array(a) => {
                            let locals: Vec<&str> = a[1]
                                .as_object()
                                .into_iter()
                                .flatten()
                                .map(|(k, _)| k.as_str())
                                .collect();
                            json!({"Fn::Sub": [
                                self.substitute(a[0].as_str().unwrap(), &locals),
                                self.rewrite(&a[1])
                            ]})
                        }
                        other => panic!("{}: Fn::Sub {other}", self.app),
                    },
                    "Fn::If" => {
                        let a = inner.as_array().expect("Fn::If [condition, then, else]");
                        json!({"Fn::If": [self.condition(&a[0]), self.rewrite(&a[1]), self.rewrite(&a[2])]})
                    }
                    "Condition" if inner.is_string() => json!({"Condition": self.condition(inner)}),
                    _ => {
                        let mut m = Map::new();
                        m.insert(key.clone(), self.rewrite(inner));
                        Value::Object(m)
                    }
                }
            }
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), self.rewrite(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// An `Fn::Sub` string in the root's terms: `${Parameter}` becomes what the application
    /// passes (a literal, or `${RootName}`), `${Resource}` its renamed copy; the `Fn::Sub`'s own
    /// variables (`locals`) stay.
    fn substitute(&self, s: &str, locals: &[&str]) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find('}').expect("a closed ${...}") + start;
            let name = &rest[start + 2..end];
            let (target, attribute) = match name.split_once('.') {
                Some((t, a)) => (t, Some(a)),
                None => (name, None),
            };
            let replaced = if locals.contains(&name) {
                format!("${{{name}}}")
            } else if let Some(value) = self.values.get(target) {
                match value {
                    Value::String(literal) => literal.clone(),
                    Value::Object(o) if o.contains_key("Ref") => {
                        format!("${{{}}}", o["Ref"].as_str().unwrap())
                    }
                    Value::Object(o) if o.contains_key("Fn::GetAtt") => {
                        let g = &o["Fn::GetAtt"];
                        format!("${{{}.{}}}", g[0].as_str().unwrap(), g[1].as_str().unwrap())
                    }
                    other => panic!("{}: ${{{target}}} is {other}", self.app),
                }
            } else if self.is_resource(target) {
                match attribute {
                    Some(a) => format!("${{{}.{a}}}", self.renamed(target)),
                    None => format!("${{{}}}", self.renamed(target)),
                }
            } else {
                assert!(
                    target.starts_with("AWS::") && target != "AWS::StackName",
                    "{}: ${{{name}}} (names derive from HarnessStackName)",
                    self.app
                );
                format!("${{{name}}}")
            };
            out.push_str(&replaced);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// SAM's `Globals`: a function's own property wins; maps (the environment's variables) merge.
fn apply_globals(properties: &mut Value, globals: &Value) {
    for (key, global) in globals.as_object().unwrap() {
        match (properties.get_mut(key), global) {
            (None, _) => {
                properties[key] = global.clone();
            }
            (Some(own @ Value::Object(_)), Value::Object(_)) => {
                let mut merged = global.clone();
                merge(&mut merged, own);
                *own = merged;
            }
            (Some(_), _) => {}
        }
    }
}

fn merge(base: &mut Value, own: &Value) {
    match (base, own) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (base, own) => *base = own.clone(),
    }
}
