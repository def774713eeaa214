//! Metric rows and each key's summary (`metric_summary`): the rows a run's writing thread
//! writes in batches, and a value recorded afterwards in a run that may have ended
//! ([`Store::add_metric`](crate::Store::add_metric)).

use std::path::Path;

use rusqlite::{params, TransactionBehavior};

use crate::error::{Result, SqlContext};

/// Inserts metric rows `(step, key, value, time)` of run `id` and merges each key's summary
/// over them into `metric_summary`, inside the caller's transaction.
pub(crate) fn insert_metrics(
    tx: &rusqlite::Transaction,
    path: &Path,
    id: i64,
    rows: &[(i64, String, f64, f64)],
) -> Result<()> {
    let mut m = tx
        .prepare_cached("INSERT INTO metrics (run_id, step, key, value, time) VALUES (?1, ?2, ?3, ?4, ?5)")
        .at(path)?;
    for (step, key, value, time) in rows {
        m.execute(params![id, step, key, value, time]).at(path)?;
    }
    // the run's summary of each key: the batch's own (its rows come after every row already
    // written), merged into the stored one
    let mut u = tx
        .prepare_cached(
            "INSERT INTO metric_summary (run_id, key, last, last_step, min, max, count)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (run_id, key) DO UPDATE SET
               last = CASE WHEN excluded.last_step >= last_step THEN excluded.last ELSE last END,
               last_step = MAX(last_step, excluded.last_step),
               min = MIN(min, excluded.min), max = MAX(max, excluded.max),
               count = count + excluded.count",
        )
        .at(path)?;
    for (key, s) in batch_summary(rows) {
        u.execute(params![id, key, s.last, s.last_step, s.min, s.max, s.count])
            .at(path)?;
    }
    Ok(())
}

impl crate::Store {
    /// Records `key = value` at `step` in run `id`, which may have ended (a value computed
    /// afterwards, as a pipeline's evaluate step does): the row and the run's summary of the key
    /// in one transaction. A value the run already has for `key` at `step` is replaced (an
    /// evaluation made again), not added beside it. An unknown run or a value that is not finite
    /// is refused.
    pub fn add_metric(&mut self, id: i64, step: i64, key: &str, value: f64) -> Result<()> {
        if !value.is_finite() {
            return Err(crate::Error::Invalid(format!(
                "run {id}: metric {key} = {value} is not a finite number"
            )));
        }
        if !self.has_run(id)? {
            return Err(crate::Error::UnknownRun(format!(
                "{}: no run with id {id}",
                self.path.display()
            )));
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let replaced = tx
            .execute(
                "DELETE FROM metrics WHERE run_id = ?1 AND key = ?2 AND step = ?3",
                params![id, key, step],
            )
            .at(&path)?;
        insert_metrics(&tx, &path, id, &[(step, key.to_string(), value, crate::now())])?;
        if replaced > 0 {
            // the merged summary counted the replaced rows: made again from the rows
            tx.execute("DELETE FROM metric_summary WHERE run_id = ?1", params![id])
                .at(&path)?;
            tx.execute(crate::resume::FILL_RUN_SUMMARY, params![id]).at(&path)?;
        }
        tx.commit().at(&path)
    }
}

/// One key's summary over a batch of metric rows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct KeySummary {
    last: f64,
    last_step: i64,
    min: f64,
    max: f64,
    count: i64,
}

/// Each key's summary over `rows` (`(step, key, value, time)` in the order written): the value
/// at its largest step (the last written of that step), min, max (no NaN is recorded) and count.
fn batch_summary(rows: &[(i64, String, f64, f64)]) -> Vec<(&str, KeySummary)> {
    let mut out: Vec<(&str, KeySummary)> = Vec::new();
    let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (step, key, value, _) in rows {
        let (step, value) = (*step, *value);
        match at.get(key.as_str()) {
            Some(&i) => {
                let s = &mut out[i].1;
                if step >= s.last_step {
                    s.last = value;
                    s.last_step = step;
                }
                s.min = s.min.min(value);
                s.max = s.max.max(value);
                s.count += 1;
            }
            None => {
                at.insert(key, out.len());
                out.push((
                    key,
                    KeySummary {
                        last: value,
                        last_step: step,
                        min: value,
                        max: value,
                        count: 1,
                    },
                ));
            }
        }
    }
    out
}
