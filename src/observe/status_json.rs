//! The global status as JSON (`GET /status` with `Accept:
//! application/json` or `?format=json`): the fields and names of Python's
//! `reconq.status()` dicts (both follow the walk in `observe::fields`), so
//! a script reads either the same way. Times are Unix timestamps in
//! seconds, durations seconds; hanging keys are their `Debug` text.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::fields::{Field, Visit, Walk};
use super::status::StatusEntry;

/// `entries` as a JSON array of objects, one per entry.
pub fn to_json(entries: &[StatusEntry]) -> String {
    Value::Array(entries.iter().map(|e| Value::Object(to_object(e))).collect()).to_string()
}

fn to_object(shape: &impl Walk) -> Map<String, Value> {
    let mut object = Map::new();
    let Ok(()) = shape.walk(&mut object);
    object
}

impl Visit for Map<String, Value> {
    type Error = Infallible;

    fn field(&mut self, name: &'static str, value: Field<'_>) -> Result<(), Infallible> {
        self.insert(name.into(), to_value(value));
        Ok(())
    }
}

fn to_value(field: Field<'_>) -> Value {
    match field {
        Field::Count(n) => json!(n),
        Field::MaybeCount(n) => json!(n),
        Field::Flag(b) => json!(b),
        Field::Text(text) => json!(text),
        Field::Time(t) => t.map_or(Value::Null, timestamp),
        Field::Seconds(d) => d.map_or(Value::Null, |d| json!(d.as_secs_f64())),
        Field::Hanging(keys) => keys.iter().map(|h| (h.key.clone(), json!(h.running.as_secs_f64()))).collect(),
        Field::ByPriority(ready) => ready.iter().map(|(priority, n)| (priority.to_string(), json!(n))).collect(),
    }
}

fn timestamp(t: SystemTime) -> Value {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => json!(d.as_secs_f64()),
        Err(e) => json!(-e.duration().as_secs_f64()),
    }
}
