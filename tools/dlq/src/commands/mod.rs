//! The commands, each from the command line to what it prints and the exit status.

mod fields;
mod groups;
mod letters;

use crate::args::{Bulk, Cli, Command};
use crate::bulk::{self, Action, Ending};
use crate::client::Client;
use crate::{edit, exit};

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
            run_bulk(&client, Action::Replay, &bulk, reason, json).await
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
            run_bulk(&client, Action::Discard, &bulk, reason, json).await
        }
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

/// `dlq replay` and `dlq discard`: the bulk run, and its ending as the exit status.
async fn run_bulk(
    client: &Client,
    action: Action,
    bulk: &Bulk,
    reason: Option<String>,
    json: bool,
) -> Result<u8, String> {
    let (ending, _) = bulk::run(client, action, bulk, reason.as_deref(), json).await?;
    Ok(match ending {
        Ending::Done => exit::OK,
        Ending::SomeFailed => exit::SOME_FAILED,
        Ending::Declined => exit::DECLINED,
        Ending::Interrupted => exit::INTERRUPTED,
    })
}
