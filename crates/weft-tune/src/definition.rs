//! A sweep's definition: what decides which trials it runs and how they are judged (its search
//! space, metric and goal, sampler and pruner settings) and the base config its trials start
//! from, as flat params. Recorded when the sweep starts ([`crate::record`]); `--resume` refuses
//! a file whose definition differs from the recorded one, in one line naming what changed,
//! except for the changes that leave the recorded trials valid: `trials` (not below the trials
//! already recorded) and `parallel`. `weft sweep status` reads the trials with the search space,
//! metric and goal they were run with ([`as_started`]).

use std::collections::BTreeSet;

use toml::{Table, Value as Toml};
use weft_track::Store;

use crate::error::{Error, Result};
use crate::record;
use crate::space::{Distribution, Param, Space};
use crate::spec::{PrunerKind, SweepSpec};
use crate::trials::TrialRecord;

/// The `[sweep]` keys compared as they are (besides `trials`, `parallel`, the parameters, the
/// pruner and the base config).
const SCALARS: [&str; 9] = [
    "metric",
    "goal",
    "method",
    "nproc_per_trial",
    "seed",
    "startup_trials",
    "multivariate",
    "gamma",
    "constant_liar",
];

/// Parameter `p` as a `[sweep.parameters]` entry.
fn entry(p: &Param) -> Toml {
    let mut t = Table::new();
    let f = Toml::Float;
    match &p.dist {
        Distribution::Uniform { min, max, q } => {
            t.insert("distribution".into(), "uniform".into());
            t.insert("min".into(), f(*min));
            t.insert("max".into(), f(*max));
            if let Some(q) = q {
                t.insert("q".into(), f(*q));
            }
        }
        Distribution::LogUniform { min, max } => {
            t.insert("distribution".into(), "log_uniform".into());
            t.insert("min".into(), f(*min));
            t.insert("max".into(), f(*max));
        }
        Distribution::IntUniform { min, max, q } => {
            t.insert("distribution".into(), "int_uniform".into());
            t.insert("min".into(), Toml::Integer(*min));
            t.insert("max".into(), Toml::Integer(*max));
            t.insert("q".into(), Toml::Integer(*q));
        }
        Distribution::Values(v) => {
            t.insert("values".into(), Toml::Array(v.clone()));
        }
    }
    Toml::Table(t)
}

/// The definition of `spec`'s sweep whose trials start from a base config with the flat params
/// `base` (`section.key` -> value text, as runs record them; the swept keys left out).
pub fn of(spec: &SweepSpec, base: &[(String, String)]) -> Table {
    let mut t = Table::new();
    t.insert("metric".into(), spec.metric.clone().into());
    t.insert("goal".into(), spec.goal.as_str().into());
    t.insert("method".into(), format!("{:?}", spec.method).to_lowercase().into());
    t.insert("trials".into(), Toml::Integer(spec.trials as i64));
    t.insert("parallel".into(), Toml::Integer(spec.parallel as i64));
    t.insert("nproc_per_trial".into(), Toml::Integer(spec.nproc_per_trial as i64));
    t.insert("seed".into(), Toml::Integer(spec.seed as i64));
    t.insert("startup_trials".into(), Toml::Integer(spec.startup_trials as i64));
    t.insert("multivariate".into(), spec.multivariate.into());
    t.insert("gamma".into(), spec.gamma.into());
    t.insert("constant_liar".into(), spec.constant_liar.into());
    let mut pruner = Table::new();
    let kind = match spec.pruner.kind {
        PrunerKind::Asha => "asha",
        PrunerKind::Hyperband => "hyperband",
        PrunerKind::Median => "median",
        PrunerKind::None => "none",
    };
    pruner.insert("kind".into(), kind.into());
    if spec.pruner.kind != PrunerKind::None {
        pruner.insert("min_steps".into(), Toml::Integer(spec.pruner.min_steps as i64));
        pruner.insert(
            "reduction_factor".into(),
            Toml::Integer(spec.pruner.reduction_factor as i64),
        );
    }
    t.insert("pruner".into(), Toml::Table(pruner));
    let params: Table = spec.space.params.iter().map(|p| (p.key.clone(), entry(p))).collect();
    t.insert("parameters".into(), Toml::Table(params));
    let swept: BTreeSet<&str> = spec.space.params.iter().map(|p| p.key.as_str()).collect();
    let base: Table = base
        .iter()
        .filter(|(k, _)| !swept.contains(k.as_str()))
        .map(|(k, v)| (k.clone(), Toml::String(v.clone())))
        .collect();
    t.insert("base".into(), Toml::Table(base));
    t
}

/// A value as a message shows it; `unset` for none.
fn shown(v: Option<&Toml>) -> String {
    v.map_or("unset".into(), Toml::to_string)
}

/// The parameters of definition `d` by key (an entry that no longer parses stays as written).
fn parameters(d: &Table) -> Vec<(String, Option<Param>, Toml)> {
    let Some(Toml::Table(params)) = d.get("parameters") else {
        return Vec::new();
    };
    params
        .iter()
        .map(|(k, v)| {
            let one: Table = std::iter::once((k.clone(), v.clone())).collect();
            let parsed = Space::from_toml(&one, "")
                .ok()
                .and_then(|s| s.params.into_iter().next());
            (k.clone(), parsed, v.clone())
        })
        .collect()
}

/// What differs between definition `was` (recorded) and `now`, one phrase each, leaving out the
/// changes a resumed sweep takes: `parallel`, and `trials` while it is not below `recorded` (the
/// trials already recorded; 0: `trials` is not compared).
pub fn changes(was: &Table, now: &Table, recorded: u64) -> Vec<String> {
    let mut out = Vec::new();
    for key in SCALARS {
        let (a, b) = (was.get(key), now.get(key));
        if a != b {
            out.push(format!("sweep.{key} was {}, now {}", shown(a), shown(b)));
        }
    }
    if let Some(n) = now.get("trials").and_then(Toml::as_integer) {
        if (n.max(0) as u64) < recorded {
            out.push(format!(
                "sweep.trials is {n}, below the {recorded} trials already recorded"
            ));
        }
    }
    let empty = Table::new();
    let table = |d: &Table, k: &str| -> Table { d.get(k).and_then(Toml::as_table).unwrap_or(&empty).clone() };
    let (pa, pb) = (table(was, "pruner"), table(now, "pruner"));
    let keys: BTreeSet<&String> = pa.keys().chain(pb.keys()).collect();
    for k in keys {
        if pa.get(k) != pb.get(k) {
            out.push(format!(
                "sweep.pruner.{k} was {}, now {}",
                shown(pa.get(k)),
                shown(pb.get(k))
            ));
        }
    }
    let (before, after) = (parameters(was), parameters(now));
    for (k, p, v) in &before {
        match after.iter().find(|(key, _, _)| key == k) {
            None => out.push(format!("sweep.parameters.\"{k}\" is no longer swept (was {v})")),
            Some((_, q, w)) => {
                let same = match (p, q) {
                    (Some(p), Some(q)) => p == q,
                    _ => v == w,
                };
                if !same {
                    out.push(format!("sweep.parameters.\"{k}\" was {v}, now {w}"));
                }
            }
        }
    }
    for (k, _, v) in &after {
        if !before.iter().any(|(key, _, _)| key == k) {
            out.push(format!("sweep.parameters.\"{k}\" is newly swept ({v})"));
        }
    }
    let (ba, bb) = (table(was, "base"), table(now, "base"));
    let keys: BTreeSet<&String> = ba.keys().chain(bb.keys()).collect();
    for k in keys {
        // a key newly swept leaves the base, one no longer swept joins it: named above
        let swept = |d: &[(String, Option<Param>, Toml)]| d.iter().any(|(key, _, _)| key == k);
        if ba.get(k) != bb.get(k) && !swept(&before) && !swept(&after) {
            out.push(format!(
                "the base config's {k} was {}, now {}",
                shown(ba.get(k)),
                shown(bb.get(k))
            ));
        }
    }
    out
}

/// `changes` in one phrase: the first four, and how many more.
pub fn summary(changes: &[String]) -> String {
    let mut s = changes.iter().take(4).cloned().collect::<Vec<_>>().join("; ");
    if changes.len() > 4 {
        s.push_str(&format!("; and {} more", changes.len() - 4));
    }
    s
}

/// `spec` with the search space, metric and goal of recorded definition `was`, as its trials
/// were run (a parameter the file changed since is read as it was drawn): what `weft sweep
/// status` reads the trials with. `spec` as it is when `was` does not parse.
pub fn as_started(spec: &SweepSpec, was: &Table) -> SweepSpec {
    let mut s = spec.clone();
    if let Some(params) = was.get("parameters").and_then(Toml::as_table) {
        if let Ok(space) = Space::from_toml(params, &spec.source) {
            s.space = space;
        }
    }
    if let Some(m) = was.get("metric").and_then(Toml::as_str) {
        s.metric = m.to_string();
    }
    match was.get("goal").and_then(Toml::as_str) {
        Some("maximize") => s.goal = crate::spec::Goal::Maximize,
        Some("minimize") => s.goal = crate::spec::Goal::Minimize,
        _ => {}
    }
    s
}

/// The recorded definition of `spec`'s sweep, parsed.
fn recorded(store: &Store, spec: &SweepSpec) -> Result<Option<Table>> {
    let Some(text) = record::definition(store, spec)? else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|e| {
        Error::State(format!(
            "{}: the recorded definition of sweep {:?} does not parse: {e}",
            store.path().display(),
            spec.name
        ))
    })
}

/// Before a sweep runs its trials: with trials `records` in the store (a resumed sweep), refuses
/// in one line a definition (`spec` and the base config's flat params `base`) that differs from
/// the recorded one, but for [`changes`]' exceptions; a sweep that began before definitions were
/// recorded has its trials' values checked against the space instead. Then records this one.
pub fn check_and_record(
    store: &Store,
    spec: &SweepSpec,
    base: &[(String, String)],
    records: &[TrialRecord],
) -> Result<()> {
    let now = of(spec, base);
    if !records.is_empty() {
        let given = records.iter().map(|r| r.number + 1).max().unwrap_or(0);
        let anew = "give the sweep another name (sweep.name, or --name) to start it anew";
        match recorded(store, spec)? {
            Some(was) => {
                let c = changes(&was, &now, given);
                if !c.is_empty() {
                    return Err(Error::State(format!(
                        "{}: --resume: sweep {:?} was started with another definition: {}; a resumed sweep may change only \
                         sweep.trials (not below the trials it has) and sweep.parallel: undo the change, or {anew}",
                        spec.source,
                        spec.name,
                        summary(&c)
                    )));
                }
            }
            None => {
                for r in records {
                    for (i, p) in spec.space.params.iter().enumerate() {
                        let text = r.params.get(i).cloned().flatten();
                        let takes = text
                            .as_deref()
                            .and_then(|t| p.parse_text(t))
                            .is_some_and(|v| p.contains(v));
                        if !takes {
                            return Err(Error::State(format!(
                                "{}: --resume: trial {} ({}) has {} = {}, which sweep.parameters.\"{}\" does not take now \
                                 (the sweep began before weft recorded a sweep's definition, so only its trials' values are \
                                 compared): undo the change, or {anew}",
                                spec.source,
                                r.number,
                                r.run_name,
                                p.key,
                                text.as_deref().unwrap_or("nothing"),
                                p.key
                            )));
                        }
                    }
                }
            }
        }
    }
    let text =
        toml::to_string(&now).map_err(|e| Error::State(format!("sweep {:?}: its definition: {e}", spec.name)))?;
    record::set_definition(store, spec, &text)
}

/// What `weft sweep status` reads `spec`'s trials with: the spec as the sweep was started
/// ([`as_started`]) and what differs in the file now (base config included; empty when nothing
/// does, or no definition was recorded).
pub fn for_status(store: &Store, spec: &SweepSpec, base: &[(String, String)]) -> Result<(SweepSpec, Vec<String>)> {
    match recorded(store, spec)? {
        Some(was) => Ok((as_started(spec, &was), changes(&was, &of(spec, base), 0))),
        None => Ok((spec.clone(), Vec::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A sweep file with `extra` in `[sweep]` (its keys replacing the defaults `metric =
    /// "val_loss"` and `trials = 6`) and `params` as its parameters.
    fn spec(extra: &str, params: &str) -> SweepSpec {
        let defaults: String = [("metric", "\"val_loss\""), ("trials", "6")]
            .iter()
            .filter(|(k, _)| !extra.contains(&format!("{k} =")))
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect();
        SweepSpec::parse(
            &format!("[sweep]\nname = \"s\"\nbase = \"r.toml\"\n{defaults}{extra}\n[sweep.parameters]\n{params}\n"),
            "s.toml",
            "s",
            Path::new("."),
        )
        .unwrap()
    }

    fn base(steps: &str) -> Vec<(String, String)> {
        vec![
            ("train.steps".into(), steps.into()),
            ("optim.lr".into(), "0.1".into()),
            ("optim.weight_decay".into(), "0.1".into()),
        ]
    }

    const LR: &str = "\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-1 }";

    #[test]
    fn a_definition_written_and_read_back_is_the_same() {
        let s = spec("parallel = 2", &format!("{LR}\n\"model.n_embd\" = {{ values = [32, 64] }}\n\"model.n_layer\" = {{ distribution = \"int_uniform\", min = 1, max = 4 }}\n\"optim.weight_decay\" = {{ distribution = \"uniform\", min = 0.0, max = 0.2, q = 0.05 }}"));
        let d = of(&s, &base("600"));
        let text = toml::to_string(&d).unwrap();
        let back: Table = text.parse().unwrap();
        assert_eq!(changes(&back, &d, 6), Vec::<String>::new());
        assert_eq!(as_started(&s, &back).space, s.space);
        // 1e-3 and 0.001 are the same bound
        let same = spec("", &LR.replace("1e-4", "0.0001"));
        assert_eq!(
            changes(&of(&spec("", LR), &base("600")), &of(&same, &base("600")), 0),
            Vec::<String>::new()
        );
    }

    #[test]
    fn changes_are_named_and_trials_and_parallel_may_change() {
        let was = of(&spec("parallel = 1", LR), &base("600"));
        // more trials, more at once: nothing to refuse
        let more = of(&spec("parallel = 4\ntrials = 9", LR), &base("600"));
        assert_eq!(changes(&was, &more, 6), Vec::<String>::new());
        // fewer trials than recorded
        let fewer = of(&spec("trials = 3", LR), &base("600"));
        assert_eq!(
            changes(&was, &fewer, 5),
            ["sweep.trials is 3, below the 5 trials already recorded"]
        );
        // the swept key changed: named once each, the base values of those keys not named
        let wd = "\"optim.weight_decay\" = { distribution = \"uniform\", min = 0.0, max = 0.2 }";
        let other = of(&spec("", wd), &base("600"));
        let c = changes(&was, &other, 6);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(
            c[0].starts_with("sweep.parameters.\"optim.lr\" is no longer swept (was {"),
            "{c:?}"
        );
        assert!(
            c[1].starts_with("sweep.parameters.\"optim.weight_decay\" is newly swept"),
            "{c:?}"
        );
        // a range, the metric, the pruner and the base config
        let c = changes(
            &was,
            &of(
                &spec(
                    "metric = \"loss\"\n[sweep.pruner]\nkind = \"asha\"",
                    &LR.replace("1e-1", "0.5"),
                ),
                &base("300"),
            ),
            6,
        );
        assert_eq!(c.len(), 6, "{c:?}");
        assert_eq!(c[0], "sweep.metric was \"val_loss\", now \"loss\"");
        assert!(
            c.iter().any(|l| l == "sweep.pruner.kind was \"none\", now \"asha\""),
            "{c:?}"
        );
        assert!(
            c.iter().any(|l| l.contains("max = 0.1") && l.contains("max = 0.5")),
            "{c:?}"
        );
        assert!(
            c.iter()
                .any(|l| l == "the base config's train.steps was \"600\", now \"300\""),
            "{c:?}"
        );
        assert!(summary(&c).ends_with("; and 2 more"), "{}", summary(&c));
    }

    #[test]
    fn the_trials_are_read_as_started() {
        let was = of(&spec("", "\"model.n_embd\" = { values = [32, 64] }"), &base("600"));
        let now = spec("goal = \"maximize\"", "\"model.n_embd\" = { values = [48] }");
        let s = as_started(&now, &was);
        assert_eq!(s.space.params[0].parse_text("32"), Some(crate::space::Value::Choice(0)));
        assert_eq!(s.goal, crate::spec::Goal::Minimize);
    }
}
