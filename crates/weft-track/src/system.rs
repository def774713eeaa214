//! The machine a run ran on, recorded as tags beside its host (MLflow keeps the like as system
//! tags): `sys.os` (`linux/x86_64`), `sys.cpus` (threads available to the process),
//! `sys.cpu` (the processor's model name, where `/proc/cpuinfo` gives it), `sys.memory_gb`
//! (total memory in GB of 10^9 bytes, where `/proc/meminfo` gives it) and `sys.weft` (weft's
//! version).

/// The prefix of the system tags.
pub const PREFIX: &str = "sys.";

/// This machine's system tags, `(key, value)`.
pub fn system_tags() -> Vec<(String, String)> {
    let mut tags = vec![
        (
            "sys.os".to_string(),
            format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ),
        (
            "sys.cpus".to_string(),
            std::thread::available_parallelism().map_or(1, |n| n.get()).to_string(),
        ),
        ("sys.weft".to_string(), env!("CARGO_PKG_VERSION").to_string()),
    ];
    if let Some(model) = read_field("/proc/cpuinfo", "model name") {
        tags.push(("sys.cpu".to_string(), model));
    }
    if let Some(kb) =
        read_field("/proc/meminfo", "MemTotal").and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
    {
        tags.push(("sys.memory_gb".to_string(), format!("{:.1}", kb * 1024.0 / 1e9)));
    }
    tags
}

/// The value of the first `key: value` line of `file` whose key is `key`, trimmed.
fn read_field(file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_system_tags_name_this_machine() {
        let tags = super::system_tags();
        let get = |k: &str| tags.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert!(get("sys.os").unwrap().contains('/'));
        assert!(get("sys.cpus").unwrap().parse::<usize>().unwrap() >= 1);
        assert_eq!(get("sys.weft").unwrap(), env!("CARGO_PKG_VERSION"));
        if cfg!(target_os = "linux") {
            assert!(!get("sys.cpu").unwrap_or_default().is_empty() || !std::path::Path::new("/proc/cpuinfo").exists());
            let gb: f64 = get("sys.memory_gb").unwrap().parse().unwrap();
            assert!(gb > 0.1, "{gb}");
        }
    }
}
