//! The operator's editor on a private working file, and the diff of what they changed.

use crate::terminal::{Newlines, shown};

/// Opens `text` in `$VISUAL`, else `$EDITOR`, else `vi`, and returns what was saved. The file
/// is created new, with a name no one can guess, readable and writable by its owner only.
pub(super) fn in_editor(id: uuid::Uuid, text: &str) -> Result<String, String> {
    use std::io::Write as _;
    let editor = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.trim().is_empty()))
        .unwrap_or_else(|| "vi".to_owned());
    let mut file = tempfile::Builder::new()
        .prefix(&format!("dlq-edit-{}-", &id.simple().to_string()[..8]))
        .suffix(".json")
        .tempfile()
        .map_err(|e| format!("creating the working file: {e}"))?;
    let path = file.path().to_owned();
    file.write_all(text.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    // Through the shell, as git runs its editor: `$EDITOR` may carry arguments (`code -w`).
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .map_err(|e| format!("running the editor {editor}: {e}"))?;
    let saved = std::fs::read_to_string(&path);
    // Removed with the handle (an editor that saved by renaming left a file at the path too).
    drop(file);
    let _ = std::fs::remove_file(&path);
    if !status.success() {
        return Err(format!(
            "the editor {editor} exited with {status}; nothing was sent"
        ));
    }
    saved.map_err(|e| format!("reading back {}: {e}", path.display()))
}

/// The line diff of the body received and the edit, every line escaped for the terminal.
pub(super) fn print_diff(original: &str, edited: &str) {
    let diff = similar::TextDiff::from_lines(original, edited);
    println!("--- received\n+++ edited");
    for change in diff.iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
            similar::ChangeTag::Equal => ' ',
        };
        let line = change.value().trim_end_matches('\n');
        println!("{sign}{}", shown(line, Newlines::Escape));
    }
}
