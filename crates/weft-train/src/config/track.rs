//! `[track]`: recording the run in a run store (crate `weft-track`, docs/tracking.md).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// `[track]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackConfig {
    /// Record the run (rank 0 writes). Default: true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The store's folder. Unset: `WEFT_TRACK_DIR` when that is set, else `weft-runs` in the
    /// working directory; a relative path in a config file resolves against its folder.
    pub dir: Option<PathBuf>,
    /// The experiment the run belongs to. Default: `"default"`.
    #[serde(default = "default_experiment")]
    pub experiment: String,
    /// The run's name, unique in its experiment (unset: `run-N`; a taken name gets `-2`, ...).
    pub name: Option<String>,
    /// Tags recorded with the run (values of any TOML type, stored as text).
    #[serde(default)]
    pub tags: BTreeMap<String, toml::Value>,
    /// Also write the run's metrics as a TensorBoard event file in the run's folder of the store
    /// (`<dir>/<experiment>/<name>/events.out.tfevents.*`). Default: false.
    #[serde(default)]
    pub tensorboard: bool,
    /// Metrics reach the store at most this many milliseconds after they are logged (1 to
    /// 60000). Default: 1000. A sweep sets 100 for its trials, so that its pruner sees each
    /// evaluation promptly.
    #[serde(default = "default_flush_ms")]
    pub flush_ms: u64,
    /// The whole config as flat params (`optim.lr` -> `0.001`), as read after `--unset` and
    /// `--set` (keys left out of the file are not listed); filled in by `RunConfig::parse`.
    #[serde(skip)]
    pub params: Vec<(String, String)>,
}

impl Default for TrackConfig {
    fn default() -> Self {
        TrackConfig {
            enabled: true,
            dir: None,
            experiment: default_experiment(),
            name: None,
            tags: BTreeMap::new(),
            tensorboard: false,
            flush_ms: default_flush_ms(),
            params: Vec::new(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_flush_ms() -> u64 {
    1000
}

fn default_experiment() -> String {
    "default".to_string()
}

/// The first of `track.experiment`, `track.name` and the tag keys that is empty or holds a
/// control character (a newline would split a row of `weft runs list`, an escape sequence would
/// reach the terminal, and an empty experiment cannot be told from "all" in the dashboard), as
/// (key, why). Tag values may hold anything; the tables escape them.
pub fn check_names(track: &TrackConfig) -> Option<(String, String)> {
    let why = |text: &str| -> Option<String> {
        if text.is_empty() {
            return Some("must not be empty".into());
        }
        text.chars()
            .find(|c| c.is_control())
            .map(|c| format!("{text:?} holds the control character {c:?}"))
    };
    if let Some(w) = why(&track.experiment) {
        return Some(("track.experiment".into(), w));
    }
    if let Some(w) = track.name.as_deref().and_then(why) {
        return Some(("track.name".into(), w));
    }
    track
        .tags
        .keys()
        .find_map(|k| why(k).map(|w| (format!("track.tags key {k:?}"), w)))
}

/// `value` as a param's text: strings without quotes, other values as TOML writes them.
pub fn value_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The config's keys as flat `section.key` params (nested tables joined with `.`), the
/// `[track]` section left out (its tags are recorded as tags).
pub fn flatten(table: &toml::Table) -> Vec<(String, String)> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<(String, String)>) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, out),
                v => out.push((key, value_text(v))),
            }
        }
    }
    let mut out = Vec::new();
    let mut rest = table.clone();
    rest.remove("track");
    walk("", &rest, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_names_and_control_characters_are_named() {
        let mut t = TrackConfig::default();
        assert_eq!(check_names(&t), None);
        t.name = Some("run \u{1b}[31mRED".into());
        let (key, why) = check_names(&t).unwrap();
        assert_eq!(key, "track.name");
        assert!(why.contains("control character '\\u{1b}'"), "{why}");
        t.name = Some("naïve/run 1".into());
        assert_eq!(check_names(&t), None);
        t.experiment = String::new();
        assert_eq!(
            check_names(&t).unwrap(),
            ("track.experiment".into(), "must not be empty".into())
        );
        t.experiment = "e".into();
        t.tags.insert("a\nb".into(), toml::Value::String("x\ny".into()));
        assert_eq!(check_names(&t).unwrap().0, "track.tags key \"a\\nb\"");
        t.tags.clear();
        t.tags.insert("k".into(), toml::Value::String("x\u{7}y".into()));
        assert_eq!(check_names(&t), None, "tag values may hold anything");
    }

    #[test]
    fn the_config_flattens_to_params_without_the_track_section() {
        let table: toml::Table = "[optim]\nkind = \"adamw\"\nlr = 0.001\nbetas = [0.9, 0.95]\n\
                                  [model]\nkind = \"gpt\"\n[model.extra]\nx = true\n\
                                  [track]\nname = \"a\"\ntags = { team = \"nlp\" }\n"
            .parse()
            .unwrap();
        let params = flatten(&table);
        let get = |k: &str| params.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("optim.lr"), Some("0.001"));
        assert_eq!(get("optim.kind"), Some("adamw"));
        assert_eq!(get("optim.betas"), Some("[0.9, 0.95]"));
        assert_eq!(get("model.extra.x"), Some("true"));
        assert!(params.iter().all(|(k, _)| !k.starts_with("track")), "{params:?}");
        let track: TrackConfig = toml::Value::Table(table["track"].as_table().unwrap().clone())
            .try_into()
            .unwrap();
        assert!(track.enabled);
        assert_eq!(track.experiment, "default");
        assert!(!track.tensorboard);
        assert_eq!(value_text(&track.tags["team"]), "nlp");
    }
}
