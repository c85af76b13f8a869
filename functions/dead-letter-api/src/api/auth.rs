//! Who is calling and what they may do: the scopes of the JWT the gateway's authorizer verified.
//!
//! Invariant: fail closed. The gateway checks each route's scope already; the handler checks
//! again, so a route deployed without its authorizer, or with the wrong scope, still refuses.
//! No authorizer context → 401; a missing scope → 403; a write without a subject → 401.

use super::error::ApiError;
use std::fmt;

/// A permission, as an OAuth scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `core.dead_letters.read`: list and get.
    Read,
    /// `core.dead_letters.replay`: republish a letter.
    Replay,
    /// `core.dead_letters.discard`: close a letter with a reason.
    Discard,
    /// `core.dead_letters.edit`: replay a letter with an edited body (more than a replay: the
    /// operator decides what runs).
    Edit,
}

impl Scope {
    /// The scope string in tokens, `template.yaml` and the OpenAPI document.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "core.dead_letters.read",
            Self::Replay => "core.dead_letters.replay",
            Self::Discard => "core.dead_letters.discard",
            Self::Edit => "core.dead_letters.edit",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the JWT authorizer passed on about the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The `sub` claim: who reviews, recorded on replay and discard.
    pub subject: Option<String>,
    /// Granted scopes: the authorizer's `scopes` and the token's `scope`/`scp` claims.
    pub scopes: Vec<String>,
}

impl Caller {
    /// A caller from the authorizer's claims (string values, as API Gateway passes them) and
    /// its `scopes` list, if any.
    pub fn from_claims<'a>(
        claims: impl IntoIterator<Item = (&'a str, &'a str)>,
        scopes: Option<&[String]>,
    ) -> Self {
        let mut caller = Caller {
            subject: None,
            scopes: scopes.map(<[String]>::to_vec).unwrap_or_default(),
        };
        for (name, value) in claims {
            match name {
                "sub" if !value.trim().is_empty() => caller.subject = Some(value.to_owned()),
                // `scope` is space-separated (RFC 8693); `scp` may arrive as "[a b]".
                "scope" | "scp" => caller.scopes.extend(
                    value
                        .trim_matches(|c| c == '[' || c == ']')
                        .split([' ', ','])
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                ),
                _ => {}
            }
        }
        caller
    }

    fn has(&self, scope: Scope) -> bool {
        self.scopes.iter().any(|s| s == scope.as_str())
    }
}

/// Checks that `caller` may use a route that needs `scope`; a write also needs a subject.
pub fn authorize(caller: Option<&Caller>, scope: Scope) -> Result<Option<&str>, ApiError> {
    let caller = caller.ok_or_else(|| {
        ApiError::unauthenticated("no verified token came with the request; sign in and retry")
    })?;
    if !caller.has(scope) {
        return Err(ApiError::forbidden(format!(
            "this needs the scope `{scope}`, which the token does not grant"
        )));
    }
    if scope != Scope::Read {
        let Some(subject) = caller.subject.as_deref() else {
            return Err(ApiError::unauthenticated(
                "the token has no `sub` claim, and a review must record who made it",
            ));
        };
        if subject.chars().count() > MAX_SUBJECT_CHARS || subject.chars().any(char::is_control) {
            return Err(ApiError::unauthenticated(format!(
                "the token's `sub` claim is not a name a review can record (at most \
                 {MAX_SUBJECT_CHARS} printable characters)"
            )));
        }
    }
    Ok(caller.subject.as_deref())
}

/// The longest `sub` claim a review records as its reviewer.
pub const MAX_SUBJECT_CHARS: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_come_from_the_list_and_the_claims() {
        let caller = Caller::from_claims(
            [("sub", "ops-1"), ("scope", "openid core.dead_letters.read")],
            Some(&["core.dead_letters.replay".to_owned()]),
        );
        assert_eq!(caller.subject.as_deref(), Some("ops-1"));
        assert!(caller.has(Scope::Read) && caller.has(Scope::Replay));
        assert!(!caller.has(Scope::Discard));
        let bracketed = Caller::from_claims([("scp", "[core.dead_letters.discard other]")], None);
        assert!(bracketed.has(Scope::Discard));
    }

    #[test]
    fn fails_closed() {
        assert_eq!(authorize(None, Scope::Read).unwrap_err().status, 401);
        let reader = Caller::from_claims([("scope", "core.dead_letters.read")], None);
        assert_eq!(authorize(Some(&reader), Scope::Read).unwrap(), None);
        assert_eq!(
            authorize(Some(&reader), Scope::Replay).unwrap_err().status,
            403
        );
        let anonymous_replayer = Caller::from_claims([("scope", "core.dead_letters.replay")], None);
        let err = authorize(Some(&anonymous_replayer), Scope::Replay).unwrap_err();
        assert_eq!((err.status, err.code), (401, "unauthenticated"));
        let long = "s".repeat(MAX_SUBJECT_CHARS + 1);
        for sub in ["ops\u{0}1", "ops\u{1b}[2J", long.as_str()] {
            let odd =
                Caller::from_claims([("sub", sub), ("scope", "core.dead_letters.discard")], None);
            let err = authorize(Some(&odd), Scope::Discard).unwrap_err();
            assert_eq!((err.status, err.code), (401, "unauthenticated"), "{sub:?}");
        }
    }
}
