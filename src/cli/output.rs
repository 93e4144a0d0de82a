//! How results are printed: kubectl-style tables with fixed columns, JSON as the API sent it,
//! `kind/name`, and the small formatters (ages, bytes, states) they share.

use std::io::{IsTerminal, Write};

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use console::Style;
use serde_json::Value;

use super::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Columns, for people.
    Table,
    /// More columns.
    Wide,
    /// The API's JSON, unchanged.
    Json,
    /// `kind/name`, one a line.
    Name,
}

/// Whether stdout is a person's terminal: colours, truncation and bars only then.
pub fn tty() -> bool {
    std::io::stdout().is_terminal()
}

/// Writes to stdout; a closed pipe ends the command quietly.
pub fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The API object as it came, pretty-printed for `jq`.
pub fn json(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// A JSON value as text: strings without quotes, `null` as empty.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `<none>` for empty text, as kubectl shows it.
pub fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

pub fn name_of(v: &Value) -> String {
    text(&v["metadata"]["name"])
}

/// Decimal units with one decimal, as the API's reasons write them (`6.0 GB`).
pub fn bytes(v: &Value) -> String {
    v.as_u64()
        .or_else(|| v.as_i64().map(|i| i.max(0) as u64))
        .map(crate::domain::quantity::human_bytes)
        .unwrap_or_default()
}

pub fn timestamp(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str().and_then(|s| DateTime::parse_from_rfc3339(s).ok()).map(|t| t.with_timezone(&Utc))
}

/// `45s`, `12m`, `5h`, `3d`, as kubectl's AGE column.
pub fn age_since(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (now - t).num_seconds().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A span of `seconds`, written as [`age_since`] writes ages.
pub fn span(seconds: u64) -> String {
    let now = Utc::now();
    age_since(now - chrono::Duration::seconds(seconds.min(i64::MAX as u64 / 1000) as i64), now)
}

pub fn age(v: &Value) -> String {
    timestamp(v).map(|t| age_since(t, Utc::now())).unwrap_or_default()
}

/// `2025-01-02T03:04:05Z (5m ago)`.
pub fn when(v: &Value) -> String {
    match timestamp(v) {
        Some(t) => format!(
            "{} ({} ago)",
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            age_since(t, Utc::now())
        ),
        None => "<none>".into(),
    }
}

/// States read at a glance on a terminal: green when well, yellow while waiting, red when not.
pub fn state_style(state: &str) -> Style {
    match state {
        "Running" | "Completed" | "Ready" | "Complete" => Style::new().green(),
        "Pending" | "Preparing" | "Filling" | "Ready,Cordoned" | "Ready,Draining" => Style::new().yellow(),
        "Failed" | "NotReady" => Style::new().red(),
        _ => Style::new(),
    }
}

/// One cell: its text and how it is coloured on a terminal.
pub struct Cell {
    pub text: String,
    pub style: Option<Style>,
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell { text, style: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell { text: text.to_owned(), style: None }
    }
}

pub fn state_cell(state: String) -> Cell {
    let style = state_style(&state);
    Cell { text: state, style: Some(style) }
}

/// A column: its header and the least width it takes, separator included.
pub struct Column {
    pub header: &'static str,
    pub min: usize,
}

pub const fn col(header: &'static str, min: usize) -> Column {
    Column { header, min }
}

/// A table laid out like the recipe's: each column padded to its width (at least `min`, and two
/// more than its longest cell), the last one unpadded.
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Cell>>,
    /// Left margin, for tables inside `describe`.
    pub indent: usize,
}

impl Table {
    pub fn new(columns: Vec<Column>) -> Table {
        Table { columns, rows: Vec::new(), indent: 0 }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }

    /// The text of the table. `styled` colours the cells; `width` cuts lines to a terminal's width.
    pub fn render(&self, styled: bool, width: Option<usize>) -> String {
        let n = self.columns.len();
        let widths: Vec<usize> = (0..n)
            .map(|i| {
                let longest = self.rows.iter().filter_map(|r| r.get(i)).map(|c| measure(&c.text)).max();
                let longest = longest.unwrap_or(0).max(measure(self.columns[i].header));
                self.columns[i].min.max(longest + 2)
            })
            .collect();
        let mut out = String::new();
        let header: Vec<Cell> = self.columns.iter().map(|c| Cell::from(c.header)).collect();
        for row in std::iter::once(&header).chain(self.rows.iter()) {
            let mut line = " ".repeat(self.indent);
            let mut used = self.indent;
            for (i, cell) in row.iter().enumerate().take(n) {
                let last = i + 1 == n;
                let mut text = cell.text.clone();
                if let (true, Some(w)) = (last, width) {
                    text = console::truncate_str(&text, w.saturating_sub(used).max(8), "…").into_owned();
                }
                let len = measure(&text);
                match (&cell.style, styled) {
                    (Some(style), true) => line.push_str(&style.apply_to(&text).to_string()),
                    _ => line.push_str(&text),
                }
                if !last {
                    line.push_str(&" ".repeat(widths[i].saturating_sub(len)));
                    used += widths[i].max(len);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Renders for stdout: coloured and cut to the terminal on a terminal, plain otherwise.
    pub fn print(&self) -> Result<()> {
        let tty = tty();
        let width = tty.then(|| console::Term::stdout().size_checked().map(|(_, w)| w as usize)).flatten();
        emit(&self.render(tty && console::colors_enabled(), width))
    }
}

fn measure(s: &str) -> usize {
    console::measure_text_width(s)
}

/// `Label:` and its value, aligned like `kubectl describe`.
pub fn field(out: &mut String, label: &str, value: impl AsRef<str>) {
    let label = format!("{label}:");
    let value = value.as_ref();
    let value = if value.is_empty() { "<none>" } else { value };
    // A label too long for the column still leaves a space before its value.
    out.push_str(&format!("{label:<13} {value}\n"));
}

/// `done` as a share of `total`, in whole percent (0 when there is no total).
pub fn percent(done: u64, total: u64) -> u32 {
    if total == 0 { 0 } else { ((done as f64 / total as f64).clamp(0.0, 1.0) * 100.0).round() as u32 }
}

/// A text bar of `done` against `total`, e.g. `[#####---------------]  25%`.
pub fn bar(done: u64, total: u64, cells: usize) -> String {
    let ratio = if total == 0 { 0.0 } else { (done as f64 / total as f64).clamp(0.0, 1.0) };
    let full = (ratio * cells as f64).round() as usize;
    format!("[{}{}] {:>3}%", "#".repeat(full), "-".repeat(cells - full), percent(done, total))
}

/// `1`, `0.5`: cores without a trailing `.0`.
pub fn cores(v: &Value) -> String {
    match v.as_f64() {
        Some(c) if c.fract() == 0.0 => format!("{c:.0}"),
        Some(c) => c.to_string(),
        None => text(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_table_matches_the_recipe_byte_for_byte() {
        let mut t = Table::new(vec![col("NAME", 30), col("CLUSTER", 14), col("STATE", 12), col("REASON", 0)]);
        t.push(vec![
            "fill-food101-gpu-01".into(),
            "main".into(),
            state_cell("Running".into()),
            "1 of 1 workers running".into(),
        ]);
        t.push(vec![
            "inspect-food101".into(),
            "main".into(),
            state_cell("Pending".into()),
            "Waiting for workers to start".into(),
        ]);
        assert_eq!(
            t.render(false, None),
            "NAME                          CLUSTER       STATE       REASON\n\
             fill-food101-gpu-01           main          Running     1 of 1 workers running\n\
             inspect-food101               main          Pending     Waiting for workers to start\n"
        );
    }

    #[test]
    fn a_long_name_widens_its_column_and_keeps_two_spaces() {
        let mut t = Table::new(vec![col("NAME", 6), col("STATE", 0)]);
        t.push(vec!["a-very-long-name".into(), "Running".into()]);
        assert_eq!(t.render(false, None), "NAME              STATE\na-very-long-name  Running\n");
    }

    #[test]
    fn on_a_narrow_terminal_only_the_last_column_is_cut() {
        let mut t = Table::new(vec![col("NAME", 10), col("REASON", 0)]);
        t.push(vec!["x".into(), "Waiting for workers to start".into()]);
        assert_eq!(t.render(false, Some(20)).lines().nth(1), Some("x         Waiting f…"));
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = Utc::now();
        // 90 s is under 2 minutes: seconds; 3 h = 180 minutes: hours; 3 days: days.
        assert_eq!(age_since(now - chrono::Duration::seconds(90), now), "90s");
        assert_eq!(age_since(now - chrono::Duration::hours(3), now), "3h");
        assert_eq!(age_since(now - chrono::Duration::days(3), now), "3d");
    }

    #[test]
    fn a_bar_fills_in_proportion() {
        // 3 of 12 = 25%: 5 of 20 cells.
        assert_eq!(bar(3, 12, 20), "[#####---------------]  25%");
        assert_eq!(bar(0, 0, 4), "[----]   0%");
    }
}
