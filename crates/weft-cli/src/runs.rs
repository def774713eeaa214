//! `weft runs`: the runs recorded in a run store (docs/tracking.md): list, show, compare,
//! delete, export.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{json, Value};
use weft_track::filter::{sort_runs, Filter};
use weft_track::{RunDetail, Store};

use crate::print_out;

/// Where the store is.
#[derive(clap::Args)]
pub struct DirArg {
    /// The run store's folder (default: `WEFT_TRACK_DIR`, else `weft-runs`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

impl DirArg {
    fn open(&self) -> Result<Store, String> {
        let dir = match (&self.dir, std::env::var_os("WEFT_TRACK_DIR")) {
            (Some(d), _) => d.clone(),
            (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
            _ => PathBuf::from("weft-runs"),
        };
        Store::open_existing(&dir).map_err(|e| e.to_string())
    }
}

#[derive(clap::Subcommand)]
pub enum RunsCommand {
    /// Lists runs: id, experiment, name, status, start, duration and last loss.
    List(ListArgs),
    /// Shows one run: status, command, git, host, layout, params, tags, metrics, inputs, artifacts.
    Show(ShowArgs),
    /// Compares runs: the params that differ, and each metric's last/min/max side by side.
    Compare(CompareArgs),
    /// Deletes runs with their records (not the checkpoints they name).
    Delete(DeleteArgs),
    /// Writes one run's metrics: CSV (`step,key,value,time`, time in seconds since the Unix
    /// epoch) or a TensorBoard event file.
    Export(ExportArgs),
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Only runs of this experiment.
    #[arg(long)]
    experiment: Option<String>,
    /// Comparisons joined by `and`: `optim.lr < 1e-3 and status = 'finished'` (keys: params,
    /// metrics.<key> (last value), tags.<key>, status, name, experiment, id; a key or part of
    /// one in backquotes may hold any character: ``tags.`my team` ``).
    #[arg(long, value_name = "EXPR")]
    filter: Option<String>,
    /// Sort by a key (as in --filter); a leading `-` sorts descending. Default: id.
    #[arg(long, value_name = "KEY", allow_hyphen_values = true)]
    sort: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The run: its id, its name, or EXPERIMENT/NAME.
    run: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The runs (ids or names), two or more.
    #[arg(num_args = 2.., required = true)]
    runs: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The runs (ids or names).
    #[arg(required = true)]
    runs: Vec<String>,
    /// Also delete runs that are still live (`running` with a heartbeat under a minute old):
    /// their trainers go on, and what they log afterwards is not recorded.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The run (id or name).
    run: String,
    /// `csv` (to standard output) or `tensorboard` (an `events.out.tfevents.*` file in --output).
    #[arg(long, default_value = "csv")]
    format: String,
    /// The folder the TensorBoard event file goes to (default: the current directory).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

pub fn run(what: RunsCommand) -> Result<(), String> {
    match what {
        RunsCommand::List(a) => list(&a),
        RunsCommand::Show(a) => show(&a),
        RunsCommand::Compare(a) => compare(&a),
        RunsCommand::Delete(a) => delete(&a),
        RunsCommand::Export(a) => export(&a),
    }
}

use weft_track::ui::json::{detail as detail_json, num, summary as summary_json};

fn list(a: &ListArgs) -> Result<(), String> {
    // the filter is checked before the store is opened
    let filter = a
        .filter
        .as_deref()
        .map(Filter::parse)
        .transpose()
        .map_err(|e| e.to_string())?;
    let store = a.dir.open()?;
    let mut runs = store.list_runs(a.experiment.as_deref()).map_err(|e| e.to_string())?;
    if let Some(f) = &filter {
        runs.retain(|r| f.matches(r));
    }
    if let Some(key) = &a.sort {
        sort_runs(&mut runs, key);
    }
    if a.json {
        let all: Vec<Value> = runs.iter().map(summary_json).collect();
        return print_out(&format!("{}\n", Value::Array(all)));
    }
    let mut rows = vec![["ID", "EXPERIMENT", "NAME", "STATUS", "STARTED (UTC)", "SECONDS", "LOSS"].map(String::from)];
    for r in &runs {
        rows.push([
            r.id.to_string(),
            r.experiment.clone(),
            r.name.clone(),
            r.status.clone(),
            utc(r.start_time),
            r.end_time.map_or("-".into(), |e| format!("{:.1}", e - r.start_time)),
            r.last.get("loss").map_or("-".into(), |l| format!("{l:.4}")),
        ]);
    }
    print_out(&table(&rows))
}

fn show(a: &ShowArgs) -> Result<(), String> {
    let store = a.dir.open()?;
    let id = store.find_run(&a.run).map_err(|e| e.to_string())?;
    let d = store.run_detail(id).map_err(|e| e.to_string())?;
    if a.json {
        return print_out(&format!("{}\n", detail_json(&d)));
    }
    let s = &d.summary;
    let mut out = format!(
        "run {} ({}/{}): {}\n",
        s.id,
        shown(&s.experiment),
        shown(&s.name),
        shown(&s.status)
    );
    if let Some(e) = &d.error {
        out += &format!("  error: {}\n", shown(e));
    }
    out += &format!("  started: {} UTC", utc(s.start_time));
    if let Some(end) = s.end_time {
        out += &format!(", ended after {:.1} s", end - s.start_time);
    }
    out += &format!(
        "\n  command: {}\n  host: {}\n  layout: {}\n",
        shown(&d.command),
        shown(&d.host),
        shown(&d.layout)
    );
    if let Some(c) = &d.git_commit {
        let dirty = if d.git_dirty == Some(true) {
            " (with changes)"
        } else {
            ""
        };
        out += &format!("  git: {c}{dirty}\n");
    }
    out += "params:\n";
    for (k, v) in &s.params {
        out += &format!("  {} = {}\n", shown(k), shown(v));
    }
    if !s.tags.is_empty() {
        out += "tags:\n";
        for (k, v) in &s.tags {
            out += &format!("  {} = {}\n", shown(k), shown(v));
        }
    }
    out += "metrics (last at step, min, max, values):\n";
    for (k, m) in &d.metrics {
        out += &format!(
            "  {}: {} at {}, {}, {}, {}\n",
            shown(k),
            m.last,
            m.last_step,
            m.min,
            m.max,
            m.count
        );
    }
    for i in &d.inputs {
        out += &format!("input {}\n", shown(&input_line(i)));
    }
    for (kind, p) in &d.artifacts {
        out += &format!("artifact {}: {}\n", shown(kind), shown(p));
    }
    print_out(&out)
}

/// `KIND: URI [DIGEST] [(from run N)]`: one input of a run, as `runs show` and `models lineage`
/// print it.
pub(crate) fn input_line(i: &weft_track::RunInput) -> String {
    let mut line = format!("{}: {}", i.kind, i.uri);
    if let Some(d) = &i.digest {
        line += &format!(" {d}");
    }
    if let Some(r) = i.source_run {
        line += &format!(" (from run {r})");
    }
    line
}

fn compare(a: &CompareArgs) -> Result<(), String> {
    let store = a.dir.open()?;
    let details: Vec<RunDetail> = a
        .runs
        .iter()
        .map(|r| store.find_run(r).and_then(|id| store.run_detail(id)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let keys: BTreeSet<&String> = details.iter().flat_map(|d| d.summary.params.keys()).collect();
    let differing: BTreeMap<&String, Vec<Option<&String>>> = keys
        .into_iter()
        .map(|k| (k, details.iter().map(|d| d.summary.params.get(k)).collect::<Vec<_>>()))
        .filter(|(_, vs)| vs.iter().any(|v| v != &vs[0]))
        .collect();
    let metric_keys: BTreeSet<&String> = details.iter().flat_map(|d| d.metrics.keys()).collect();
    if a.json {
        let runs: Vec<Value> = details
            .iter()
            .map(|d| json!({"id": d.summary.id, "name": d.summary.name, "status": d.summary.status}))
            .collect();
        let params: serde_json::Map<String, Value> =
            differing.iter().map(|(k, vs)| (k.to_string(), json!(vs))).collect();
        let metrics: serde_json::Map<String, Value> = metric_keys
            .iter()
            .map(|k| {
                let per_run: Vec<Value> = details
                    .iter()
                    .map(|d| {
                        d.metrics.get(*k).map_or(
                            Value::Null,
                            |m| json!({"last": num(m.last), "min": num(m.min), "max": num(m.max)}),
                        )
                    })
                    .collect();
                (k.to_string(), Value::Array(per_run))
            })
            .collect();
        let all = json!({"runs": runs, "params": params, "metrics": metrics});
        return print_out(&format!("{all}\n"));
    }
    let mut head = vec![String::new()];
    head.extend(details.iter().map(|d| format!("{} ({})", d.summary.name, d.summary.id)));
    let mut rows = vec![head];
    for (k, vs) in &differing {
        let mut row = vec![k.to_string()];
        row.extend(vs.iter().map(|v| v.cloned().unwrap_or_else(|| "-".into())));
        rows.push(row);
    }
    for k in metric_keys {
        let mut row = vec![format!("{k} last/min/max")];
        row.extend(details.iter().map(|d| {
            d.metrics.get(k).map_or("-".into(), |m| {
                format!("{} / {} / {}", short(m.last), short(m.min), short(m.max))
            })
        }));
        rows.push(row);
    }
    print_out(&table(&rows))
}

fn delete(a: &DeleteArgs) -> Result<(), String> {
    let mut store = a.dir.open()?;
    // every run is found before any is deleted
    let ids: Vec<i64> = a
        .runs
        .iter()
        .map(|r| store.find_run(r))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if !a.force {
        let mut live = Vec::new();
        for (id, name) in ids.iter().zip(&a.runs) {
            if store.run_is_live(*id).map_err(|e| e.to_string())? {
                live.push(format!("{id} ({name})"));
            }
        }
        if !live.is_empty() {
            return Err(format!(
                "run {} still running (its heartbeat is under a minute old): deleting it would lose \
                 what it logs from now on; stop it first, or give --force (nothing was deleted)",
                live.join(", ")
            ));
        }
    }
    for (id, name) in ids.iter().zip(&a.runs) {
        store.delete_run(*id).map_err(|e| e.to_string())?;
        weft_core::errln!("weft: deleted run {id} ({name})");
    }
    Ok(())
}

fn export(a: &ExportArgs) -> Result<(), String> {
    if !["csv", "tensorboard"].contains(&a.format.as_str()) {
        return Err(format!(
            "--format: {:?} is not supported (csv and tensorboard are)",
            a.format
        ));
    }
    if a.format == "csv" && a.output.is_some() {
        return Err("--output: only for --format tensorboard (csv goes to standard output)".into());
    }
    let store = a.dir.open()?;
    let id = store.find_run(&a.run).map_err(|e| e.to_string())?;
    if a.format == "tensorboard" {
        let out = a.output.clone().unwrap_or_else(|| PathBuf::from("."));
        let file = weft_track::tensorboard::export_run(&store, id, &out).map_err(|e| e.to_string())?;
        return print_out(&format!("{}\n", file.display()));
    }
    let mut out = String::from("step,key,value,time\n");
    for (step, key, value, time) in store.metric_rows(id).map_err(|e| e.to_string())? {
        out += &format!("{step},{key},{value},{time:.3}\n");
    }
    print_out(&out)
}

/// A number in at most 6 significant digits.
fn short(x: f64) -> String {
    let s = format!("{x:.6}");
    if x.abs() >= 1e6 || (x != 0.0 && x.abs() < 1e-4) {
        format!("{x:.4e}")
    } else {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`), as the tables and `show` print
/// what runs recorded: a stored newline would split a row, an escape sequence would reach the
/// terminal. (`weft train` refuses them in names and tag keys; older stores, tag values, params
/// and errors may hold them.)
fn shown(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Rows as left-aligned columns, control characters escaped.
fn table(rows: &[impl AsRef<[String]>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.as_ref().iter().map(|c| shown(c)).collect())
        .collect();
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) fn utc(t: f64) -> String {
    let secs = t.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_in_tables() {
        let rows = vec![
            ["NAME".to_string(), "TAG".to_string()],
            ["\u{1b}[31mRED\u{1b}[0m".to_string(), "a\nb\u{7}".to_string()],
        ];
        let out = super::table(&rows);
        assert_eq!(out.lines().count(), 2, "{out:?}");
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(out.contains("\\u{1b}[31mRED") && out.contains("a\\nb\\u{7}"), "{out:?}");
        assert_eq!(super::shown("naïve run"), "naïve run");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0.0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_709_210_096.0), "2024-02-29 12:34:56");
    }
}
