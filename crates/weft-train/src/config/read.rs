//! Reading a run config's text: a TOML syntax error as one line, the key a deserialization
//! error is about, and `[init] from` a Hugging Face folder giving the `[model]` section.

use std::path::{Path, PathBuf};

use super::bounds;
use crate::error::{Error, Result};

/// The key an error that `serde_path_to_error` found at `path` is about: `path` itself, or for a
/// missing key the key under it (`model.bias`, not `model`, whose path is the table's; `.` is
/// the top).
pub(super) fn key_of(path: &str, msg: &str) -> String {
    let missing = msg
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    match (path, missing) {
        (".", Some(key)) => key.to_string(),
        (path, Some(key)) => format!("{path}.{key}"),
        (path, None) => path.to_string(),
    }
}

/// A TOML syntax error as one line: `source (line L, column C): message`, where the line and
/// the column (of characters, both from 1) are where the parser stopped, as in its own report.
pub(super) fn syntax_error(source: &str, text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map(|s| {
        let mut start = s.start.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let before = &text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
        format!(" (line {line}, column {column})")
    });
    let message = e.message().trim().replace('\n', " ");
    format!("{source}{}: {message}", at.unwrap_or_default())
}

/// Whether a run config's value is the one `config.json` gives: numbers by value (`8` is `8.0`),
/// tables key by key (a `rope_scaling` written with other numbers' forms, or other keys, is not).
fn same_value(have: &toml::Value, want: &toml::Value) -> bool {
    let number = |v: &toml::Value| v.as_float().or(v.as_integer().map(|i| i as f64));
    match (have, want) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => match (number(have), number(want)) {
            (Some(a), Some(b)) => a == b,
            _ => have == want,
        },
    }
}

/// `[init] from` naming a Hugging Face checkpoint folder: its `config.json` gives the `[model]`
/// section when the run has none, and must agree with the one it has (every key config.json
/// sets; keys it does not, such as `dropout`, are the run's). A key config.json sets that the
/// run's `[model]` leaves out is taken from config.json.
pub(super) fn model_from_hf_folder(table: &mut toml::Table, source: &str, base_dir: &Path) -> Result<()> {
    let Some(from) = table
        .get("init")
        .and_then(|i| i.get("from"))
        .and_then(toml::Value::as_str)
    else {
        return Ok(());
    };
    let dir = if Path::new(from).is_absolute() {
        PathBuf::from(from)
    } else {
        base_dir.join(from)
    };
    if !weft_models::hf::is_checkpoint_folder(&dir) {
        return Ok(());
    }
    let config_path = dir.join("config.json");
    let text = weft_data::files::read_to_string(&config_path).map_err(|e| Error::Config(e.to_string()))?;
    let keys = weft_models::hf::to_weft_keys(&text, &config_path.display().to_string())
        .map_err(|e| Error::Config(e.to_string()))?;
    let theirs: toml::Table = serde_json::from_value(serde_json::Value::Object(keys))
        .map_err(|e| Error::Config(format!("{}: {e}", config_path.display())))?;
    // sizes past weft's bounds are config.json's, not the run config's
    for (key, value) in &theirs {
        let (Some(max), Some(v)) = (bounds::language_model_bound(key), value.as_integer()) else {
            continue;
        };
        if v < 0 || v as u64 > max as u64 {
            return Err(Error::Config(format!(
                "{}: gives model.{key} = {v}, outside the 0 to {max} weft accepts",
                config_path.display()
            )));
        }
    }
    match table.get_mut("model") {
        None => {
            let mut model = theirs;
            if model.get("kind").and_then(toml::Value::as_str) == Some("gpt") {
                model.insert("dropout".into(), toml::Value::Float(0.0));
            }
            table.insert("model".into(), toml::Value::Table(model));
        }
        Some(toml::Value::Table(ours)) => {
            for (key, want) in &theirs {
                // a key the run leaves out is the checkpoint's (a plain default would build
                // another model: rope_theta 10000 for a checkpoint's 500000, say)
                let Some(have) = ours.get(key) else {
                    ours.insert(key.clone(), want.clone());
                    continue;
                };
                if !same_value(have, want) {
                    return Err(Error::Config(format!(
                        "{source}: model.{key}: {have} here, but {want} in {} (init.from); leave the key out to \
                         take the checkpoint's",
                        config_path.display()
                    )));
                }
            }
        }
        Some(_) => {}
    }
    Ok(())
}
