//! Whom each queue's incidents page: a BetterStack escalation policy and/or team per queue.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Whom a queue's incidents page: a BetterStack escalation policy and/or team.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The escalation policy's id.
    pub policy_id: Option<String>,
    /// The team that owns the incident (needed with a global API token).
    pub team_name: Option<String>,
}

/// Whom each queue pages: a route per queue, else the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// For queues without a route of their own.
    pub default: Route,
    /// By queue name.
    pub by_queue: BTreeMap<String, Route>,
    /// Escalations of unreviewed letters, if they page someone else.
    pub escalation: Option<Route>,
}

impl Routes {
    /// The route of `queue`.
    pub(crate) fn for_queue(&self, queue: &str) -> &Route {
        self.by_queue.get(queue).unwrap_or(&self.default)
    }
}

/// Sets `route`'s policy and team on an incident body.
pub(crate) fn with_route(body: &mut Value, route: &Route) {
    if let Some(policy) = &route.policy_id {
        body["policy_id"] = json!(policy);
    }
    if let Some(team) = &route.team_name {
        body["team_name"] = json!(team);
    }
}
