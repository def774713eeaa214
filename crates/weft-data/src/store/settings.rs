//! The settings an `object_store` store is built from (the cloud's environment variables, then
//! [`StoreOptions::config`]), checked before the store is built ([`super::remote`]): endpoints
//! must be absolute http(s) URLs, values bound for headers must hold no control characters, and a
//! GCS service-account key's `gcs_base_url` is a URL too. Errors name the variable or key, never
//! a credential's value.

use std::collections::HashMap;
use std::hash::Hash;
use std::str::FromStr;

use super::remote::config_error;
use super::StoreOptions;
use crate::error::Result;

/// A setting a store is built from: where it came from (an environment variable, or a key of
/// [`StoreOptions::config`]), for messages, and its value.
pub(super) struct Setting {
    pub(super) from: String,
    pub(super) value: String,
}

/// The settings an `object_store` builder applies, by key, as its `from_env` and weft's
/// `with_config` loop do: the variables `first` names, then every variable starting with `prefix`
/// whose lower-cased name is a key (the last of aliases wins, as there), then those `last` names,
/// then `options.config` on top. Names that are no key are left to the builder, which ignores
/// the variables and refuses the settings.
pub(super) fn applied<K: FromStr + Eq + Hash + Copy>(
    prefix: &str,
    first: &[(&str, K)],
    last: &[(&str, K)],
    options: &StoreOptions,
) -> HashMap<K, Setting> {
    let mut out = HashMap::new();
    let mut set = |key: K, from: String, value: String| {
        out.insert(key, Setting { from, value });
    };
    let var = |name: &str| std::env::var_os(name).and_then(|v| v.into_string().ok());
    for &(name, key) in first {
        if let Some(v) = var(name) {
            set(key, name.to_string(), v);
        }
    }
    for (name, value) in std::env::vars_os() {
        if let (Some(name), Some(value)) = (name.to_str(), value.to_str()) {
            if name.starts_with(prefix) {
                if let Ok(key) = name.to_ascii_lowercase().parse() {
                    set(key, name.to_string(), value.to_string());
                }
            }
        }
    }
    for &(name, key) in last {
        if let Some(v) = var(name) {
            set(key, name.to_string(), v);
        }
    }
    for (k, v) in &options.config {
        if let Ok(key) = k.to_ascii_lowercase().parse() {
            set(key, format!("the setting {k:?}"), v.clone());
        }
    }
    out
}

/// How a setting's value is checked.
pub(super) enum Check {
    /// An endpoint: an absolute `http(s)://` URL with a host, as a request can carry it.
    Url,
    /// Anything else that reaches a request (a key, a token, a region, a path): no control
    /// characters. Values bound for a header (`AWS_ACCESS_KEY_ID`, `AWS_SESSION_TOKEN`,
    /// `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_TOKEN`) made object_store panic with one.
    Text,
    /// Not checked here (JSON, which may span lines; a bucket the URL replaces).
    Free,
}

/// Checks every setting as `check` sorts it; the first bad one (in the order of their names) is
/// an error naming it.
pub(super) fn check_settings<K>(shown: &str, settings: HashMap<K, Setting>, check: impl Fn(&K) -> Check) -> Result<()> {
    let mut settings: Vec<(K, Setting)> = settings.into_iter().collect();
    settings.sort_by(|a, b| a.1.from.cmp(&b.1.from));
    for (key, s) in &settings {
        let why = match check(key) {
            Check::Url => url_problem(&s.value).map(|why| {
                // an endpoint is no secret, but one with user:password@ would print it
                if s.value.is_empty() || s.value.contains('@') || s.value.chars().any(char::is_control) {
                    why
                } else {
                    format!("{:?} {why}", short(&s.value))
                }
            }),
            Check::Text => control_problem(&s.value),
            Check::Free => None,
        };
        if let Some(why) = why {
            return Err(config_error(shown, format!("{} {why}", s.from)));
        }
    }
    Ok(())
}

/// At most 100 characters of `s`, for a message.
pub(super) fn short(s: &str) -> String {
    if s.chars().count() <= 100 {
        s.to_string()
    } else {
        s.chars().take(97).collect::<String>() + "..."
    }
}

/// What is wrong with a value that must hold no control characters, without quoting it (it may
/// be a secret).
pub(super) fn control_problem(value: &str) -> Option<String> {
    let (at, c) = value.char_indices().find(|(_, c)| c.is_control())?;
    let what = match c {
        '\n' | '\r' => "a line break".to_string(),
        '\t' => "a tab".to_string(),
        c => format!("a control character (U+{:04X})", c as u32),
    };
    let whole = value.chars().count();
    if value[at..].chars().all(char::is_control) {
        return Some(format!(
            "ends with {what} (as a value read from a file often does); remove it (the value is not shown: it may be a secret)"
        ));
    }
    Some(format!(
        "holds {what} (character {} of {whole}); remove it (the value is not shown: it may be a secret)",
        value[..at].chars().count() + 1
    ))
}

/// What keeps `value` from being an endpoint a request can be sent to: an absolute `http://` or
/// `https://` URL with a host, written in plain ASCII as a request line carries it.
pub(super) fn url_problem(value: &str) -> Option<String> {
    const EXAMPLE: &str = "such as http://127.0.0.1:9000 or https://storage.example.com";
    if value.trim().is_empty() {
        return Some(format!(
            "is empty: unset it, or set it to the store's http(s) URL ({EXAMPLE})"
        ));
    }
    if let Some(why) = control_problem(value) {
        return Some(why);
    }
    if let Some(c) = value.chars().find(|c| !c.is_ascii()) {
        return Some(format!(
            "holds {c:?}, which is not ASCII: write a host as its xn-- (punycode) form, a path percent-encoded"
        ));
    }
    // RFC 3986: unreserved, reserved, and '%' for escapes
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._~:/?#[]@!$&'()*+,;=%".contains(*c)))
    {
        return Some(format!("holds {c:?}, which a URL cannot carry unescaped"));
    }
    let url = match url::Url::parse(value) {
        Ok(u) => u,
        Err(e) => return Some(format!("is not an absolute http(s) URL ({e}); {EXAMPLE}")),
    };
    if url.scheme() != "http" && url.scheme() != "https" {
        return Some(format!(
            "is a {}:// URL; an endpoint is http:// or https://, {EXAMPLE}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Some(format!("names no host; {EXAMPLE}"));
    }
    None
}

/// The `gcs_base_url` of a GCS service-account key (JSON; `from` names where it came from): an
/// endpoint, checked as such. A key that is not JSON is left to object_store, which says so.
pub(super) fn check_gcs_key(shown: &str, from: &str, key: &str) -> Result<()> {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_str::<serde_json::Value>(key) else {
        return Ok(());
    };
    match obj.get("gcs_base_url") {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::String(u)) => match url_problem(u) {
            None => Ok(()),
            Some(why) => Err(config_error(
                shown,
                format!("{from}: gcs_base_url {:?} {why}", short(u)),
            )),
        },
        Some(other) => Err(config_error(
            shown,
            format!("{from}: gcs_base_url must be a string (a URL), not {other}"),
        )),
    }
}
