//! Naming a run from outside (a command line, a URL): by id, by name, or as `EXPERIMENT/NAME`;
//! and whether a run is live.

use rusqlite::{params, OptionalExtension};

use crate::error::{quoted, Error, Result, SqlContext};
use crate::read::{naming_run, RunOf};
use crate::Store;

/// Whether `what` is a run id as `weft runs` takes one: plain decimal digits, without a sign or
/// leading zeros (`7`, not `+7` or `007`, which may be names), that fit an `i64`.
fn as_id(what: &str) -> Option<i64> {
    let digits = !what.is_empty() && what.bytes().all(|b| b.is_ascii_digit());
    let padded = what.len() > 1 && what.starts_with('0');
    if digits && !padded {
        what.parse().ok()
    } else {
        None
    }
}

/// How a candidate run matched.
#[derive(PartialEq)]
enum By {
    Id,
    Name,
}

impl Store {
    /// Resolves a run named on the command line (or in a URL): its id (plain decimal digits:
    /// `7`, never `+7` or `007`), its name (unique across experiments), or `EXPERIMENT/NAME`
    /// (every `/` is tried as the split, so an experiment or a run whose name holds `/` can be
    /// named). A string that names more than one run (an id and another run's name, a name in
    /// two experiments, two splits) is refused as ambiguous, listing the runs and how to name
    /// one; none is [`Error::UnknownRun`].
    pub fn find_run(&self, what: &str) -> Result<i64> {
        let p = &self.path;
        // every run's `EXPERIMENT/NAME`, read whatever its columns hold
        let label = |r: &rusqlite::Row| -> rusqlite::Result<String> {
            Ok(String::from_utf8_lossy(r.get_ref(1)?.as_bytes_or_null()?.unwrap_or_default()).into_owned())
        };
        let mut found: Vec<(i64, String, By)> = Vec::new();
        if let Some(id) = as_id(what) {
            let run = self
                .conn
                .query_row(
                    "SELECT r.id, CAST(e.name AS BLOB) || '/' || CAST(r.name AS BLOB)
                     FROM runs r LEFT JOIN experiments e ON e.id = r.experiment_id WHERE r.id = ?1",
                    params![id],
                    |r| Ok((r.get::<_, i64>(0)?, label(r)?)),
                )
                .optional()
                .at(p)?;
            if let Some((id, label)) = run {
                found.push((id, label, By::Id));
            }
        }
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.id, CAST(e.name AS BLOB) || '/' || CAST(r.name AS BLOB)
                 FROM runs r JOIN experiments e ON e.id = r.experiment_id
                 WHERE r.name = ?1 OR e.name || '/' || r.name = ?1 ORDER BY r.id",
            )
            .at(p)?;
        let by_name = stmt
            .query_map(params![what], |r| Ok((r.get::<_, i64>(0)?, label(r)?)))
            .at(p)?;
        for run in by_name {
            let (id, label) = run.at(p)?;
            if !found.iter().any(|(seen, _, _)| *seen == id) {
                found.push((id, label, By::Name));
            }
        }
        let what_q = quoted(what);
        match found.as_slice() {
            [(id, _, _)] => Ok(*id),
            [] => {
                // `+7`, `007`: not ids (they may be names), and no run has that name
                let plain = what.strip_prefix('+').unwrap_or(what).trim_start_matches('0');
                let plain = if plain.is_empty() { "0" } else { plain };
                let hint = if as_id(what).is_none() && as_id(plain).is_some() {
                    format!(" (no run has that name; a run id is written in plain digits, without a sign or leading zeros: {plain})")
                } else {
                    String::new()
                };
                Err(Error::UnknownRun(format!("{}: no run {what_q}{hint}", p.display())))
            }
            many => {
                let list: Vec<String> = many
                    .iter()
                    .map(|(id, label, by)| match by {
                        By::Id => format!("run {id} ({}, by its id)", quoted(label)),
                        By::Name => format!("run {id} ({}, by its name)", quoted(label)),
                    })
                    .collect();
                let by_id = many.iter().any(|(_, _, by)| *by == By::Id);
                let how = if by_id {
                    "name the one meant as EXPERIMENT/NAME (as listed)"
                } else {
                    "name the one meant as EXPERIMENT/NAME (as listed) or by its id"
                };
                Err(Error::UnknownRun(format!(
                    "{}: {what_q} is ambiguous: it names {} runs: {}; {how}",
                    p.display(),
                    many.len(),
                    list.join(", ")
                )))
            }
        }
    }

    /// Whether run `id` is live: `running` with a heartbeat younger than the store's
    /// [`OpenOptions::stale_after`](crate::OpenOptions::stale_after) (60 s), as the dashboard
    /// and a resumed run judge it; a process recording it may still write to it. A `running`
    /// run whose heartbeat stopped is not live (the next open of the store marks it `killed`).
    /// An unknown run is [`Error::UnknownRun`]. For `weft runs delete`, which should not delete
    /// a live run without being told to: its writer loses everything it logs afterwards.
    pub fn run_is_live(&self, id: i64) -> Result<bool> {
        match self.status_and_heartbeat(id)? {
            Some((status, heartbeat)) => Ok(status == "running" && heartbeat >= self.stale_before()),
            None => Err(Error::UnknownRun(format!(
                "{}: no run with id {id}",
                self.path.display()
            ))),
        }
    }

    /// Run `id`'s `status` and `heartbeat` columns, `None` when there is no such run; a damaged
    /// row is an error naming the run, the table and the column.
    pub(crate) fn status_and_heartbeat(&self, id: i64) -> Result<Option<(String, f64)>> {
        self.conn
            .query_row(
                "SELECT status, heartbeat FROM runs WHERE id = ?1",
                params![id],
                naming_run("runs", RunOf::Id(id), |r| Ok((r.get(0)?, r.get(1)?))),
            )
            .optional()
            .at(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::as_id;

    #[test]
    fn ids_are_plain_digits() {
        assert_eq!(as_id("7"), Some(7));
        assert_eq!(as_id("0"), Some(0));
        assert_eq!(as_id("120"), Some(120));
        for not in [
            "007",
            "+7",
            "-7",
            " 7",
            "7 ",
            "",
            "1e3",
            "0x7",
            "٣",
            "99999999999999999999",
        ] {
            assert_eq!(as_id(not), None, "{not:?}");
        }
    }
}
