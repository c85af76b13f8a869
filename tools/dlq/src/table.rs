//! Readable tables for a terminal: columns as wide as their widest cell (long cells clipped),
//! every cell one line and shown inert ([`crate::terminal::shown`]).

use crate::terminal::{Newlines, shown};

/// A table of text cells under a header.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// The widest a cell is shown.
const MAX_CELL: usize = 72;

impl Table {
    /// A table with these column names.
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.rows
            .push(cells.into_iter().map(|c| clip(&c)).collect());
    }

    /// The table as lines, each indented by `indent` spaces.
    pub fn lines(&self, indent: usize) -> Vec<String> {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| {
                std::iter::once(&self.header[i])
                    .chain(self.rows.iter().map(|r| &r[i]))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        std::iter::once(&self.header)
            .chain(&self.rows)
            .map(|cells| {
                let line: Vec<String> = cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                format!("{}{}", " ".repeat(indent), line.join("  ").trim_end())
            })
            .collect()
    }

    /// Prints it on stdout, indented.
    pub fn print_indented(&self, indent: usize) {
        for line in self.lines(indent) {
            println!("{line}");
        }
    }
}

fn clip(cell: &str) -> String {
    let one_line = shown(&cell.replace(['\n', '\r', '\t'], " "), Newlines::Escape);
    if one_line.chars().count() <= MAX_CELL {
        return one_line;
    }
    let mut clipped: String = one_line.chars().take(MAX_CELL - 1).collect();
    clipped.push('…');
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_long_cells_are_clipped() {
        let mut t = Table::new(["id", "error"]);
        t.row(["7".into(), "short".into()]);
        t.row(["12".into(), "x".repeat(100)]);
        let lines = t.lines(0);
        assert_eq!(lines[0], "id  error");
        assert_eq!(lines[1], "7   short");
        assert!(lines[2].starts_with("12  xxx") && lines[2].ends_with('…'));
        assert_eq!(lines[2].chars().count(), 4 + MAX_CELL);
    }
}
