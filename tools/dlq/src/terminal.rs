//! What reaches the operator's terminal. Letters carry text a producer wrote (payloads, errors,
//! correlation ids, message ids): an escape sequence in it must be shown, never run, so that no
//! letter can clear, recolour or rewrite the screen an operator decides on, or reverse the text
//! around it. Every value `dlq` prints from the API goes through [`shown`] (text) or [`json`]
//! (`--json`).

use serde_json::Value;
use std::fmt::Write;
use std::io::{BufRead, IsTerminal, Write as _};

/// `s` with every character a terminal would act on written as `\u{…}`: C0 controls (ESC,
/// BEL, backspace, carriage return, … and newline unless `newlines` is kept), DEL, C1 controls
/// (U+0080–U+009F: U+009B alone starts a sequence on some terminals), and the invisible
/// formatting and direction marks (U+200B–U+200F, U+202A–U+202E, U+2060–U+2069, U+061C, U+FEFF).
pub fn shown(s: &str, newlines: Newlines) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\n' && newlines == Newlines::Keep {
            out.push(c);
        } else if acts_on_terminal(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether [`shown`] keeps line breaks (a multi-line error) or escapes them (a table cell, a
/// one-line field, where a newline could forge a line of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newlines {
    /// Line breaks stay line breaks.
    Keep,
    /// Line breaks are shown as `\u{a}`.
    Escape,
}

/// `value` as JSON for `--json`: the same value, with every character [`shown`] escapes
/// written as a JSON `\uXXXX` escape (serde escapes C0 controls, not DEL, C1 or the direction
/// marks), so a script reads the same strings and a terminal shows them inert. `pretty` indents.
pub fn json(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    }
    .unwrap_or_default();
    // Outside strings serde writes only ASCII structure, so every such character is in a string.
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if acts_on_terminal(c) && c != '\n' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// Asks `question` (`[y/N]`) on the terminal; without one, refuses, naming `instead` (what to
/// run to go on without a prompt).
pub fn confirmed(question: &str, instead: &str) -> Result<bool, String> {
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "not asking for confirmation without a terminal: {instead}"
        ));
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escape_sequences_controls_and_direction_marks_are_shown_not_sent() {
        let hostile = "ok\u{1b}[2J\u{1b}]0;pwned\u{7}\r\u{8}\u{7f}\u{9b}31m\u{202e}txt.exe\u{200b}";
        let out = shown(hostile, Newlines::Escape);
        assert_eq!(
            out,
            "ok\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{d}\\u{8}\\u{7f}\\u{9b}31m\\u{202e}txt.exe\\u{200b}"
        );
        assert!(!out.chars().any(acts_on_terminal));
        assert_eq!(shown("a\nb", Newlines::Escape), "a\\u{a}b");
        assert_eq!(shown("a\nb", Newlines::Keep), "a\nb");
        assert_eq!(
            shown("plain ünïcode ✓", Newlines::Escape),
            "plain ünïcode ✓"
        );
    }

    #[test]
    fn json_output_is_the_same_value_with_nothing_a_terminal_acts_on() {
        let value = json!({"error": "x\u{1b}[31m\u{9b}\u{7f}\u{202e}\u{feff}y", "n": [1, "\n"]});
        for pretty in [false, true] {
            let out = json(&value, pretty);
            assert!(
                !out.chars().any(|c| acts_on_terminal(c) && c != '\n'),
                "{out}"
            );
            assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), value);
        }
        assert!(!json(&value, false).contains('\n'));
    }
}
