//! The commands, each from the command line to what it prints and the exit status.

mod fields;
mod groups;
mod letters;
mod operations;

use crate::args::{Cli, Command};
use crate::bulk::{self, Action};
use crate::client::Client;
use crate::edit;

/// Runs the command `cli` names; `Ok` holds the exit status, `Err` what stopped it (a usage
/// error).
pub(crate) async fn run(cli: Cli) -> Result<u8, String> {
    let client = connect(cli.api, cli.token)?;
    let json = cli.json;
    match cli.command {
        Command::List {
            filter,
            status,
            limit,
        } => letters::list(&client, &filter, status, limit, json).await,
        Command::Show { id } => letters::show(&client, id, json).await,
        Command::Groups {
            status,
            queue,
            consumer,
            kind,
            limit,
        } => {
            let query = groups::query(status, queue, consumer, kind, limit);
            groups::list(&client, &query, json).await
        }
        Command::Group { id } => groups::show(&client, id, json).await,
        Command::Replay { bulk, reason } => {
            bulk::run(&client, Action::Replay, &bulk, reason.as_deref(), json).await
        }
        Command::Edit {
            id,
            reason,
            file,
            dry_run,
            yes,
        } => {
            let id = letters::resolve_letter(&client, id).await?;
            let how = edit::How {
                reason,
                file,
                dry_run,
                yes,
            };
            edit::run(&client, id, &how, json).await
        }
        Command::Discard { bulk, reason } => {
            bulk::run(&client, Action::Discard, &bulk, reason.as_deref(), json).await
        }
        Command::Operations => operations::list(&client, json).await,
        Command::Operation {
            id,
            follow,
            progress,
        } => operations::show(&client, id, follow, progress, json).await,
        Command::Cancel { id, reason } => operations::cancel(&client, id, &reason, json).await,
    }
}

/// The API client the command line configures: an API URL and a token, both required.
fn connect(api: Option<String>, token: Option<String>) -> Result<Client, String> {
    let api = api.ok_or(
        "no API: pass --api or set DLQ_API_URL (the stack's DeadLetterApiUrl output; locally \
         `bash scripts/stack.sh env` prints it)",
    )?;
    let token = token.ok_or(
        "no token: set DLQ_TOKEN (or pass --token) to an access token with the scopes you need \
         (docs/operations.md says how to get one)",
    )?;
    Client::new(&api, token)
}
