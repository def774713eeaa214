//! `GET /api/sweeps`: the sweeps of a store, read from the tags their trials carry (`weft sweep`
//! tags each trial's run `sweep = NAME` and `sweep_trial = N`, and names its metric and goal in
//! `sweep_metric` and `sweep_goal`; docs/sweep.md). Nothing but the runs is read, so a sweep
//! shows here from its first trial on.

use std::collections::BTreeMap;

use rusqlite::params;
use serde_json::{json, Value};

use crate::error::SqlContext;
use crate::sweep_tags::{TAG_GOAL, TAG_METRIC, TAG_SWEEP, TAG_TRIAL};

/// The runs that count for their sweeps: a trial run again (a resumed sweep) counts by its
/// latest run, as `weft sweep status` counts it. `?1` is the sweep tag's name, `?4` the trial's
/// (the queries that use it number their other parameters around these).
const LATEST: &str = "WITH latest AS (
    SELECT max(r.id) AS id FROM tags t JOIN runs r ON r.id = t.run_id
    LEFT JOIN tags n ON n.run_id = r.id AND n.key = ?4
    WHERE t.key = ?1 GROUP BY r.experiment_id, t.value, COALESCE(n.value, 'run ' || r.id))";
use crate::{Result, Store};

/// One sweep as the dashboard lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSummary {
    pub name: String,
    pub experiment: String,
    /// Trials recorded (each by its latest run), by status (`finished`, `pruned`, `failed`,
    /// `killed`, `running`).
    pub by_status: BTreeMap<String, i64>,
    /// The metric and goal, when the trials name them (sweeps recorded before they did not).
    pub metric: Option<String>,
    pub goal: Option<String>,
    /// The finished trial with the best last value of the metric: `(run id, run name, value)`.
    pub best: Option<(i64, String, f64)>,
    /// When its first trial started, in seconds since the Unix epoch.
    pub started: f64,
}

impl Store {
    /// Every sweep recorded in the store, newest first.
    pub fn sweeps(&self) -> Result<Vec<SweepSummary>> {
        let p = &self.path;
        let sql = format!(
            "{LATEST}
             SELECT t.value, e.name, r.status, count(*), min(r.start_time),
                    max(CASE WHEN m.key = ?2 THEN m.value END), max(CASE WHEN g.key = ?3 THEN g.value END)
             FROM tags t JOIN runs r ON r.id = t.run_id JOIN experiments e ON e.id = r.experiment_id
             LEFT JOIN tags m ON m.run_id = r.id AND m.key = ?2
             LEFT JOIN tags g ON g.run_id = r.id AND g.key = ?3
             WHERE t.key = ?1 AND r.id IN (SELECT id FROM latest) GROUP BY t.value, e.name, r.status"
        );
        let mut stmt = self.conn.prepare(&sql).at(p)?;
        let rows = stmt
            .query_map(params![TAG_SWEEP, TAG_METRIC, TAG_GOAL, TAG_TRIAL], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, f64>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, Option<String>>(6)?,
                ))
            })
            .at(p)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(p)?;
        let mut sweeps: BTreeMap<(String, String), SweepSummary> = BTreeMap::new();
        for (name, experiment, status, n, started, metric, goal) in rows {
            let s = sweeps
                .entry((experiment.clone(), name.clone()))
                .or_insert_with(|| SweepSummary {
                    name,
                    experiment,
                    by_status: BTreeMap::new(),
                    metric: None,
                    goal: None,
                    best: None,
                    started,
                });
            s.by_status.insert(status, n);
            s.started = s.started.min(started);
            s.metric = s.metric.take().or(metric);
            s.goal = s.goal.take().or(goal);
        }
        let mut out: Vec<SweepSummary> = sweeps.into_values().collect();
        for s in &mut out {
            if let Some(metric) = &s.metric {
                s.best = self.best_trial(&s.experiment, &s.name, metric, s.goal.as_deref() == Some("maximize"))?;
            }
        }
        out.sort_by(|a, b| b.started.total_cmp(&a.started).then(a.name.cmp(&b.name)));
        Ok(out)
    }

    /// The finished trial of sweep `name` in `experiment` with the lowest (or, with `maximize`,
    /// highest) last value of `metric`; the lowest trial number wins a tie, and a trial whose
    /// metric ended NaN (its `nan_step` tag at or past the last value) is none (as `weft sweep
    /// status` picks).
    fn best_trial(
        &self,
        experiment: &str,
        name: &str,
        metric: &str,
        maximize: bool,
    ) -> Result<Option<(i64, String, f64)>> {
        let order = if maximize { "DESC" } else { "ASC" };
        // the parameters' numbers are LATEST's (?1 the sweep tag, ?4 the trial tag)
        let sql = format!(
            "{LATEST}
             SELECT r.id, r.name, s.last FROM tags t JOIN runs r ON r.id = t.run_id
             JOIN experiments e ON e.id = r.experiment_id
             JOIN metric_summary s ON s.run_id = r.id AND s.key = ?3
             LEFT JOIN tags n ON n.run_id = r.id AND n.key = ?4
             WHERE t.key = ?1 AND t.value = ?2 AND e.name = ?5 AND r.status = 'finished' AND s.last = s.last
               AND r.id IN (SELECT id FROM latest)
               AND NOT EXISTS (SELECT 1 FROM tags x WHERE x.run_id = r.id AND x.key = 'nan_step.' || ?3
                               AND CAST(x.value AS INTEGER) >= s.last_step)
             ORDER BY s.last {order}, CAST(n.value AS INTEGER), r.id LIMIT 1"
        );
        let p = &self.path;
        let mut stmt = self.conn.prepare(&sql).at(p)?;
        let mut rows = stmt
            .query(params![TAG_SWEEP, name, metric, TAG_TRIAL, experiment])
            .at(p)?;
        match rows.next().at(p)? {
            Some(r) => Ok(Some((r.get(0).at(p)?, r.get(1).at(p)?, r.get(2).at(p)?))),
            None => Ok(None),
        }
    }
}

/// A sweep as the API returns it.
pub fn json(s: &SweepSummary) -> Value {
    json!({
        "name": s.name,
        "experiment": s.experiment,
        "trials": s.by_status.values().sum::<i64>(),
        "by_status": s.by_status,
        "metric": s.metric,
        "goal": s.goal,
        "best": s.best.as_ref().map(|(id, name, value)| json!({
            "run": id, "name": name, "value": super::json::num(*value)
        })),
        "started": s.started,
    })
}

#[cfg(test)]
mod tests {
    use crate::{NewRun, RunWriter, Status, Store, WriterOptions};

    fn trial(dir: &std::path::Path, sweep: &str, n: u64, loss: Option<f64>, status: Status, tagged: bool) {
        let mut tags = vec![
            ("sweep".to_string(), sweep.to_string()),
            ("sweep_trial".to_string(), n.to_string()),
        ];
        if tagged {
            tags.push(("sweep_metric".into(), "val_loss".into()));
            tags.push(("sweep_goal".into(), "minimize".into()));
        }
        let run = NewRun {
            experiment: "tune".into(),
            name: Some(format!("{sweep}-trial-{n}")),
            tags,
            ..Default::default()
        };
        let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
        if let Some(l) = loss {
            w.log(1, "val_loss", l + 1.0);
            w.log(2, "val_loss", l);
        }
        w.end(status, None).unwrap();
    }

    #[test]
    fn sweeps_are_read_from_their_trials_tags() {
        let dir = std::env::temp_dir().join(format!("weft-sweeps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        trial(&dir, "a", 0, Some(2.0), Status::Finished, true);
        trial(&dir, "a", 1, Some(1.5), Status::Finished, true);
        // pruned lower than the best finished: not the best
        trial(&dir, "a", 2, Some(1.0), Status::Killed, true);
        trial(&dir, "a", 3, None, Status::Failed, true);
        // trial 2 run again by a resumed sweep: its latest run counts
        trial(&dir, "a", 2, Some(1.7), Status::Finished, true);
        // an older sweep without metric tags
        trial(&dir, "b", 0, Some(0.5), Status::Finished, false);
        let untagged = RunWriter::start(&dir, NewRun::default(), WriterOptions::default()).unwrap();
        untagged.end(Status::Finished, None).unwrap();
        let s = Store::open(&dir).unwrap().sweeps().unwrap();
        assert_eq!(s.len(), 2);
        let a = s.iter().find(|s| s.name == "a").unwrap();
        assert_eq!(a.experiment, "tune");
        assert_eq!(a.by_status.get("finished"), Some(&3));
        assert_eq!(a.by_status.get("killed"), None);
        assert_eq!(a.by_status.get("failed"), Some(&1));
        assert_eq!(a.metric.as_deref(), Some("val_loss"));
        assert_eq!(a.goal.as_deref(), Some("minimize"));
        let (_, name, value) = a.best.clone().unwrap();
        assert_eq!((name.as_str(), value), ("a-trial-1", 1.5));
        let b = s.iter().find(|s| s.name == "b").unwrap();
        assert_eq!((b.metric.as_ref(), b.best.as_ref()), (None, None));
        // newest first
        assert_eq!(s[0].name, "b");
        let j = super::json(a);
        assert_eq!(j["trials"], 4, "trial 2's two runs count once");
        assert_eq!(j["best"]["value"], 1.5);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
