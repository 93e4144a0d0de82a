//! What happened to an object, for `describe`: the API's events, or a timeline made from the
//! times the objects themselves record.

use serde_json::Value;

use super::output::{self, Table, col, state_cell, text};

/// Something that happened: when, what kind, to which object, and in words.
pub struct Event {
    at: Value,
    warning: bool,
    reason: String,
    object: String,
    /// Who decided (`scheduler`, `agent/gpu-01`), when the API says.
    from: String,
    message: String,
    count: i64,
}

impl Event {
    pub fn new(at: &Value, reason: &str, object: String, message: String) -> Event {
        let warning = reason == "Failed" || reason == "NotReady";
        Event {
            at: at.clone(),
            warning,
            reason: reason.into(),
            object,
            from: String::new(),
            message,
            count: 1,
        }
    }
}

/// An event as the API records it: `type`, `reason`, `message`, `count`, `last_at`, its object.
pub fn recorded(e: &Value) -> Event {
    let object = match (text(&e["object_kind"]), text(&e["object_name"])) {
        (k, n) if !k.is_empty() => format!("{k}/{n}"),
        _ => String::new(),
    };
    Event {
        at: e["last_at"].clone(),
        warning: text(&e["type"]) == "Warning",
        reason: text(&e["reason"]),
        object,
        from: text(&e["source"]),
        message: text(&e["message"]),
        count: e["count"].as_i64().unwrap_or(1),
    }
}

pub fn text_of(mut events: Vec<Event>) -> String {
    events.retain(|e| !e.at.is_null());
    events.sort_by_key(|e| output::timestamp(&e.at));
    if events.is_empty() {
        return "Events:       <none>\n".into();
    }
    let with_from = events.iter().any(|e| !e.from.is_empty());
    let mut columns = vec![col("AGE", 8), col("TYPE", 9), col("REASON", 11), col("OBJECT", 30)];
    if with_from {
        columns.push(col("FROM", 14));
    }
    columns.push(col("MESSAGE", 0));
    let mut t = Table::new(columns);
    t.indent = 2;
    // The newest 20, oldest first.
    let skip = events.len().saturating_sub(20);
    for e in events.into_iter().skip(skip) {
        let age =
            if e.count > 1 { format!("{} (x{})", output::age(&e.at), e.count) } else { output::age(&e.at) };
        let kind = if e.warning { state_cell("Warning".into()) } else { "Normal".into() };
        let mut row = vec![age.into(), kind, e.reason.into(), e.object.into()];
        if with_from {
            row.push(e.from.into());
        }
        row.push(e.message.into());
        t.push(row);
    }
    format!("Events:\n{}", t.render(output::tty() && console::colors_enabled(), None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recorded_events_show_who_decided_and_how_often() {
        let e = json!({"object_kind": "worker", "object_name": "x-0", "type": "Warning", "reason": "NoImage",
            "message": "image is not pulled", "source": "agent/gpu-01", "count": 3,
            "first_at": "2025-01-01T00:00:00Z", "last_at": "2025-01-01T00:00:00Z"});
        let text = text_of(vec![recorded(&e)]);
        let row = text.lines().nth(2).unwrap();
        assert!(row.contains("(x3)") && row.contains("Warning") && row.contains("worker/x-0"), "{row}");
        assert!(row.contains("agent/gpu-01") && row.ends_with("image is not pulled"), "{row}");
        assert_eq!(text_of(vec![]), "Events:       <none>\n");
    }
}
