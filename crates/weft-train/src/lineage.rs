//! What a run read, recorded as its inputs in the run store (`run_inputs`, docs/tracking.md,
//! "Lineage"): its data (its real path with links resolved, or its URL, and a SHA-256 of what
//! it held) and its initial weights (where, and the run whose checkpoint they are, which the
//! store finds by its recorded checkpoint folders). Its config is its params. Computed on the
//! rank that records, when it starts.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};
use weft_track::RunInput;

use crate::config::{DataConfig, RunConfig};

/// `sha256:HEX` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    hex_digest(Sha256::digest(bytes).as_slice())
}

fn hex_digest(d: &[u8]) -> String {
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `sha256:HEX` of a file's bytes, read in 1 MiB pieces; `None` when it cannot be read (the
/// run read it a moment ago: the input is still recorded, without a digest).
fn file_digest(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(hex_digest(h.finalize().as_slice()))
}

/// An absolute path as text (as the store records artifacts).
fn absolute(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The path with links resolved (absolute where it cannot be): data read through a link
/// (a pipeline's fixed path to the folder a prepare step wrote) names the folder itself.
fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path).map_or_else(|_| absolute(path), |p| p.display().to_string())
}

/// The run's inputs: `data` (and `init` with `[init] from`). `tokens_digest` is the digest of
/// a token dataset's `index.json` as the run read it (from the store itself for a URL).
pub fn run_inputs(config: &RunConfig, tokens_digest: Option<&str>) -> Vec<RunInput> {
    // data by its real path; initial weights as the store records checkpoint folders
    let file = |kind: &str, path: &Path| {
        let path = config.resolve(path);
        RunInput {
            kind: kind.into(),
            uri: if kind == "data" {
                canonical(&path)
            } else {
                absolute(&path)
            },
            digest: file_digest(&path),
            source_run: None,
        }
    };
    let data = match &config.data {
        DataConfig::Text(t) if t.path.as_os_str() == "builtin" => RunInput {
            kind: "data".into(),
            uri: "builtin:text".into(),
            digest: Some(digest_of(crate::builtin::CORPUS.as_bytes())),
            source_run: None,
        },
        DataConfig::Text(t) => file("data", &t.path),
        DataConfig::Csv(c) => file("data", &c.path),
        DataConfig::Batches(b) => file("data", &b.path),
        DataConfig::Tokens(k) => RunInput {
            kind: "data".into(),
            uri: if k.path.contains("://") {
                k.path.clone()
            } else {
                canonical(&config.resolve(Path::new(&k.path)))
            },
            digest: tokens_digest.map(str::to_string),
            source_run: None,
        },
    };
    let mut inputs = vec![data];
    if let Some(from) = &config.init.from {
        let path = config.resolve(from);
        let init = if path.is_dir() {
            // a Hugging Face folder: its config.json names the model (the weights may be many
            // GB, and are named by their folder)
            RunInput {
                kind: "init".into(),
                uri: absolute(&path),
                digest: file_digest(&path.join("config.json")),
                source_run: None,
            }
        } else {
            file("init", from)
        };
        inputs.push(init);
    }
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_the_sha256_of_the_bytes() {
        // FIPS 180-2's example: SHA-256("abc")
        assert_eq!(
            digest_of(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dir = std::env::temp_dir().join(format!("weft-lineage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("data.txt");
        // more than one 1 MiB piece
        let bytes: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 251) as u8).collect();
        std::fs::write(&f, &bytes).unwrap();
        assert_eq!(file_digest(&f), Some(digest_of(&bytes)));
        assert_eq!(file_digest(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
