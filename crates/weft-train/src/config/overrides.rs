//! Command-line changes to a run config: `--unset section.key` and `--set section.key=value`.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Keys whose values are paths. A relative path given on the command line resolves against the
/// working directory (as every other path argument does), one written in a config file against
/// the file's folder. A URL (`s3://...`, anything with `://`) and the names that are not paths
/// (`data.path = "builtin"`, `data.tokenizer = "char"` or `"gpt2"`) are taken as they are.
const PATH_KEYS: [(&str, &str); 8] = [
    ("init", "from"),
    ("data", "path"),
    ("data", "tokenizer"),
    ("train", "metrics"),
    ("train", "checkpoint_dir"),
    ("train", "trace"),
    ("parallel", "cluster"),
    ("track", "dir"),
];

/// Values of path keys that name something built in rather than a file.
const NOT_PATHS: [(&str, &str, &str); 3] = [
    ("data", "path", "builtin"),
    ("data", "tokenizer", "char"),
    ("data", "tokenizer", "gpt2"),
];

/// What the command line changes in a config: keys removed, then keys set.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `section.key`: removed from the config (e.g. `optim.momentum` when switching `optim.kind`
    /// from sgd to adam).
    pub unset: Vec<String>,
    /// `section.key=value`: the value is TOML (`3`, `0.1`, `true`, `[1, 2]`, `"x"`) or, failing
    /// that, a bare string.
    pub set: Vec<String>,
    /// What relative paths among the `set` values resolve against (the working directory).
    pub cwd: PathBuf,
}

impl Overrides {
    /// `set` only, with paths resolved against the working directory.
    pub fn set<S: Into<String>>(set: impl IntoIterator<Item = S>) -> Overrides {
        Overrides {
            unset: Vec::new(),
            set: set.into_iter().map(Into::into).collect(),
            cwd: std::env::current_dir().unwrap_or_default(),
        }
    }

    /// Removes every `unset` key, then applies every `set` value, in order.
    pub(crate) fn apply(&self, table: &mut toml::Table) -> Result<()> {
        for spec in &self.unset {
            let (section, key) = split_key(spec, "--unset")?;
            let removed = table
                .get_mut(section)
                .and_then(|s| s.as_table_mut())
                .and_then(|s| s.remove(key));
            if removed.is_none() {
                return Err(Error::Config(format!(
                    "--unset {spec:?}: the config has no key {key} in [{section}]"
                )));
            }
        }
        for spec in &self.set {
            self.apply_set(table, spec)?;
        }
        Ok(())
    }

    fn apply_set(&self, table: &mut toml::Table, spec: &str) -> Result<()> {
        let (key, raw) = spec
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("--set {spec:?}: expected section.key=value")))?;
        let (section, name) = split_key(key, "--set")?;
        let mut value: toml::Value = format!("v = {raw}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        if PATH_KEYS.contains(&(section, name)) {
            if let toml::Value::String(p) = &value {
                let builtin = NOT_PATHS.contains(&(section, name, p.as_str())) || p.contains("://");
                let path = PathBuf::from(p);
                // an empty path stays empty, for the config's checks to refuse
                if !builtin && !p.is_empty() && path.is_relative() {
                    value = toml::Value::String(self.cwd.join(path).to_string_lossy().into_owned());
                }
            }
        }
        let section_table = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| Error::Config(format!("--set {spec:?}: {section} is not a section")))?;
        section_table.insert(name.to_string(), value);
        Ok(())
    }
}

/// `section.key` split in two; `flag` names the option in errors.
fn split_key<'a>(spec: &'a str, flag: &str) -> Result<(&'a str, &'a str)> {
    let key = spec.split_once('=').map_or(spec, |(k, _)| k).trim();
    match key.split_once('.') {
        Some((s, k)) if !s.is_empty() && !k.is_empty() && !k.contains('.') => Ok((s, k)),
        _ => Err(Error::Config(format!("{flag} {spec:?}: the key must be section.key"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn unset_removes_and_names_what_is_absent() {
        let mut t = table("[optim]\nkind = \"sgd\"\nmomentum = 0.9\n");
        let o = Overrides {
            unset: vec!["optim.momentum".into()],
            set: vec!["optim.kind=adam".into()],
            cwd: PathBuf::from("/w"),
        };
        o.apply(&mut t).unwrap();
        assert_eq!(t["optim"].as_table().unwrap().len(), 1);
        assert_eq!(t["optim"]["kind"].as_str(), Some("adam"));
        let missing = Overrides {
            unset: vec!["optim.momentum".into()],
            ..Default::default()
        };
        let e = missing.apply(&mut t).unwrap_err().to_string();
        assert!(e.contains("optim.momentum") && e.contains("no key momentum"), "{e}");
        let bad = Overrides {
            unset: vec!["momentum".into()],
            ..Default::default()
        };
        assert!(bad.apply(&mut t).unwrap_err().to_string().contains("section.key"));
    }

    #[test]
    fn set_paths_resolve_against_the_working_directory() {
        let mut t = table("[train]\nsteps = 1\n");
        let o = Overrides {
            unset: vec![],
            set: vec![
                "train.checkpoint_dir=ckpt".into(),
                "train.metrics=\"/abs/m.jsonl\"".into(),
                "data.path=builtin".into(),
                "train.seed=3".into(),
                "parallel.cluster=c.toml".into(),
                "track.dir=runs".into(),
                "data.tokenizer=gpt2".into(),
            ],
            cwd: PathBuf::from("/work/here"),
        };
        o.apply(&mut t).unwrap();
        assert_eq!(t["train"]["checkpoint_dir"].as_str(), Some("/work/here/ckpt"));
        assert_eq!(t["train"]["metrics"].as_str(), Some("/abs/m.jsonl"));
        assert_eq!(t["data"]["path"].as_str(), Some("builtin"));
        assert_eq!(t["train"]["seed"].as_integer(), Some(3));
        assert_eq!(t["parallel"]["cluster"].as_str(), Some("/work/here/c.toml"));
        assert_eq!(t["track"]["dir"].as_str(), Some("/work/here/runs"));
        assert_eq!(t["data"]["tokenizer"].as_str(), Some("gpt2"));
        // a URL and a tokenizer file
        let o = Overrides {
            unset: vec![],
            set: vec![
                "data.path=s3://bucket/shards".into(),
                "data.tokenizer=tok/tokenizer.json".into(),
            ],
            cwd: PathBuf::from("/work/here"),
        };
        o.apply(&mut t).unwrap();
        assert_eq!(t["data"]["path"].as_str(), Some("s3://bucket/shards"));
        assert_eq!(t["data"]["tokenizer"].as_str(), Some("/work/here/tok/tokenizer.json"));
    }
}
