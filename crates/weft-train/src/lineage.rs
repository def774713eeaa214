//! What a run read, recorded as its inputs in the run store (`run_inputs`, docs/tracking.md,
//! "What is recorded"): its data (its real path with links resolved, or its URL, and a SHA-256 of what
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

/// Files larger than this are not hashed when a run starts (reading them once more would hold
/// up the first step): their inputs are recorded without a digest.
pub const HASH_LIMIT_BYTES: u64 = 1 << 30;

/// `sha256:HEX` of a file's bytes, read in 1 MiB pieces; `None` when it cannot be read (the
/// run read it a moment ago: the input is still recorded, without a digest), is not a file or
/// is larger than [`HASH_LIMIT_BYTES`].
fn file_digest(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > HASH_LIMIT_BYTES {
        return None;
    }
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

/// The path absolute with links and `..` resolved (as the store records artifacts), or absolute
/// where it cannot be resolved: data read through a link (a pipeline's fixed path to the folder a
/// prepare step wrote) names the folder itself, and weights the checkpoint folder another run
/// recorded.
fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// The run's inputs: `data`, `init` with `[init] from`, and `resume_from`: the checkpoint folder
/// `weft train --resume-from` started it from (when that is not its own). `tokens_digest` is the
/// digest of a token dataset's `index.json` as the run read it (from the store itself for a
/// URL). A folder (of Hugging Face weights, a checkpoint) is named, not hashed.
pub fn run_inputs(config: &RunConfig, tokens_digest: Option<&str>, resumed_from: Option<&Path>) -> Vec<RunInput> {
    let file = |kind: &str, path: &Path| RunInput {
        kind: kind.into(),
        uri: canonical(path),
        digest: file_digest(path),
        source_run: None,
    };
    let data = match &config.data {
        DataConfig::Text(t) if t.path.as_os_str() == "builtin" => RunInput {
            kind: "data".into(),
            uri: "builtin:text".into(),
            digest: Some(digest_of(crate::builtin::CORPUS.as_bytes())),
            source_run: None,
        },
        DataConfig::Text(t) => file("data", &config.resolve(&t.path)),
        DataConfig::Csv(c) => file("data", &config.resolve(&c.path)),
        DataConfig::Batches(b) => file("data", &config.resolve(&b.path)),
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
        inputs.push(file("init", &config.resolve(from)));
    }
    if let Some(folder) = resumed_from {
        inputs.push(file("resume_from", folder));
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
        // a folder is named, not hashed
        assert_eq!(file_digest(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
