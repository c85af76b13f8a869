//! A body as the editor shows it: as received, only its whitespace laid out.

use serde_json::Value;
use std::iter::Peekable;
use std::str::Chars;

/// A body as the editor shows it: JSON pretty-printed, a body that was not JSON as it came.
pub(super) fn as_text(body: &Value) -> String {
    match body {
        Value::String(raw) => raw.clone(),
        json => serde_json::to_string_pretty(json).unwrap_or_default() + "\n",
    }
}

/// A JSON body laid out one value a line, two spaces an indent, as `serde_json` pretty-prints,
/// but from its text: its keys in their order, its numbers and string escapes as written. A
/// body that is not JSON comes back as it is.
pub fn laid_out(body: &str) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(body).is_err() {
        return body.to_owned();
    }
    let mut layout = Layout {
        out: String::with_capacity(body.len() * 2),
        depth: 0,
        in_string: false,
        escaped: false,
    };
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if layout.in_string {
            layout.in_string_char(c);
        } else {
            layout.structure_char(c, &mut chars);
        }
    }
    layout.out.push('\n');
    layout.out
}

/// The text laid out so far, and where in the body it is.
struct Layout {
    out: String,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Layout {
    /// A character of a string: kept as written; an unescaped quote ends the string.
    fn in_string_char(&mut self, c: char) {
        self.out.push(c);
        match (self.escaped, c) {
            (true, _) => self.escaped = false,
            (false, '\\') => self.escaped = true,
            (false, '"') => self.in_string = false,
            _ => {}
        }
    }

    /// A character outside strings: its whitespace dropped, a line break after each opening
    /// bracket and comma and before each closing one, a space after each colon.
    fn structure_char(&mut self, c: char, rest: &mut Peekable<Chars<'_>>) {
        match c {
            '"' => {
                self.in_string = true;
                self.out.push(c);
            }
            '{' | '[' => self.open(c, rest),
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                self.newline();
                self.out.push(c);
            }
            ',' => {
                self.out.push(c);
                self.newline();
            }
            ':' => self.out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => self.out.push(c),
        }
    }

    /// An opening bracket: an empty object or array stays on its line (`{}`, `[]`); any other
    /// goes one indent deeper.
    fn open(&mut self, c: char, rest: &mut Peekable<Chars<'_>>) {
        self.out.push(c);
        while rest.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            rest.next();
        }
        if rest.peek().is_some_and(|&n| n == '}' || n == ']') {
            self.out.extend(rest.next());
        } else {
            self.depth += 1;
            self.newline();
        }
    }

    fn newline(&mut self) {
        self.out.push('\n');
        self.out.push_str(&"  ".repeat(self.depth));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_laid_out_key_for_key_and_number_for_number() {
        let received =
            r#"{"job_id":"j","payload":{"z":1.50,"a":[1e2, {}, []],"s":"a,b:{\"c\"}"},"b":-0}"#;
        assert_eq!(
            laid_out(received),
            "{\n  \"job_id\": \"j\",\n  \"payload\": {\n    \"z\": 1.50,\n    \"a\": [\n      1e2,\n      {},\n      []\n    ],\n    \"s\": \"a,b:{\\\"c\\\"}\"\n  },\n  \"b\": -0\n}\n"
        );
        let value: Value = serde_json::from_str(received).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&laid_out(received)).unwrap(),
            value
        );
        let sorted = serde_json::to_string(&value).unwrap();
        assert_eq!(
            laid_out(&sorted),
            as_text(&value),
            "as serde_json pretty-prints"
        );
        assert_eq!(laid_out("not json {"), "not json {");
    }
}
