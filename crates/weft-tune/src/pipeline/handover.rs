//! Handing a sweep step's best values to a later train step (`from_sweep = "SWEEP_STEP"`).
//!
//! A sweep step's output records its sweep's best finished trial and that trial's values
//! ([`sweep_output`]); a train step naming the sweep step in `from_sweep` reads them back
//! ([`best_sets`]) as `--set key=value` overrides given before its own `set`, so the layers are:
//! the train step's config file, then the best trial's values, then the step's `set`. The values
//! are part of the sweep step's output, and each dependency's output enters a step's cache key,
//! so a sweep whose best changed runs the train step again.

/// The best finished trial of a sweep, as a sweep step's output records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Best {
    /// The trial's number.
    pub trial: u64,
    /// Its run's name.
    pub run: String,
    /// The last value of the sweep's metric.
    pub value: f64,
    /// The swept keys (`section.key`) and the trial's values.
    pub params: toml::Table,
}

/// The output of a sweep step whose sweep is named `name`: `sweep=NAME best=none` when no trial
/// finished, else `sweep=NAME best=trial-N run=RUN value=V params={ "key" = value, ... }` (the
/// values as an inline TOML table, last on the line).
pub fn sweep_output(name: &str, best: Option<&Best>) -> String {
    match best {
        None => format!("sweep={name} best=none"),
        Some(b) => format!(
            "sweep={name} best=trial-{} run={} value={} params={}",
            b.trial,
            b.run,
            b.value,
            toml::Value::Table(b.params.clone())
        ),
    }
}

/// The `--set key=value` overrides that a train step with `from_sweep = from` takes from the
/// output of sweep step `from` (`None`: that step has no output, as when it did not run): the
/// best trial's values, in key order. An error (one line, naming the sweep step; the caller
/// names the train step) when the sweep finished no trial, or the output holds no values (an
/// output recorded before sweep steps handed values over: run the sweep step again with
/// `--from`).
pub fn best_sets(from: &str, output: Option<&str>) -> Result<Vec<String>, String> {
    let culprit = |why: String| format!("from_sweep {from:?}: {why}");
    let output = output.ok_or_else(|| culprit("that step has no output (it did not finish)".into()))?;
    let Some((_, params)) = output.split_once(" params=") else {
        return Err(culprit(if output.contains(" best=none") {
            "its sweep finished no trial: there are no best values to hand over".into()
        } else {
            format!("its output {output:?} records no best values (run it again: weft pipeline run FILE --from {from})")
        }));
    };
    let table = format!("p = {params}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("p"))
        .and_then(|p| match p {
            toml::Value::Table(t) => Some(t),
            _ => None,
        })
        .ok_or_else(|| culprit(format!("its output's values {params:?} are not a TOML table")))?;
    if table.is_empty() {
        return Err(culprit("its best trial records no values".into()));
    }
    Ok(table.iter().map(|(k, v)| format!("{k}={v}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best() -> Best {
        let mut params = toml::Table::new();
        params.insert("optim.lr".into(), toml::Value::Float(0.0123456789012345));
        params.insert("model.n_layer".into(), toml::Value::Integer(2));
        params.insert("optim.kind".into(), toml::Value::String("adamw".into()));
        params.insert("train.w".into(), toml::Value::Float(0.0));
        Best {
            trial: 3,
            run: "tune-trial-3".into(),
            value: 1.25,
            params,
        }
    }

    #[test]
    fn the_best_values_go_through_the_output_unchanged() {
        let out = sweep_output("tune", Some(&best()));
        assert!(!out.contains('\n'), "{out}");
        assert!(
            out.starts_with("sweep=tune best=trial-3 run=tune-trial-3 value=1.25 params="),
            "{out}"
        );
        let sets = best_sets("tune", Some(&out)).unwrap();
        assert_eq!(
            sets,
            [
                "model.n_layer=2",
                "optim.kind=\"adamw\"",
                "optim.lr=0.0123456789012345",
                "train.w=0.0"
            ]
        );
        // each override parses back to the very value handed over
        for (set, (_, want)) in sets
            .iter()
            .zip(best().params.iter().collect::<std::collections::BTreeMap<_, _>>())
        {
            let (_, text) = set.split_once('=').unwrap();
            let got: toml::Table = format!("v = {text}").parse().unwrap();
            assert_eq!(&got["v"], want, "{set}");
        }
    }

    #[test]
    fn no_best_trial_and_old_outputs_are_one_line_errors_naming_the_sweep_step() {
        let cases = [
            (Some(sweep_output("tune", None)), "its sweep finished no trial"),
            (Some("sweep=sweep.toml".to_string()), "records no best values"),
            (None, "has no output"),
            (
                Some("sweep=t best=trial-0 run=r value=1 params=[1]".into()),
                "not a TOML table",
            ),
            (
                Some("sweep=t best=trial-0 run=r value=1 params={}".into()),
                "records no values",
            ),
        ];
        for (out, want) in cases {
            let e = best_sets("tune", out.as_deref()).unwrap_err();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
            assert!(e.starts_with("from_sweep \"tune\": "), "{e}");
        }
    }
}
