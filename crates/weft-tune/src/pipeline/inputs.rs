//! The digests of the files a step's run config reads (its data, tokenizer and `init.from`),
//! which go into the step's cache key ([`super::Pipeline::hash_with_inputs`]) so a changed file
//! at the same path runs the step again. What is read is bounded by what the trainer reads
//! itself:
//!
//! - a file: the SHA-256 of its bytes (a text or CSV corpus, a tokenizer, a safetensors file,
//!   all of which the trainer reads whole);
//! - a folder of token shards (`weft data prepare`'s, holding `index.json`): the SHA-256 of its
//!   `index.json`, which lists every shard with the CRC-32 of each of its blocks; the trainer
//!   checks each block it reads against them, so a shard changed without its index is refused
//!   rather than read, and the shards themselves (any size) are not read here;
//! - any other folder (a checkpoint, a Hugging Face model folder): the SHA-256 of every file in
//!   it, by relative name and bytes, in name order (symbolic links followed);
//! - a path where nothing is: `absent` (the step runs, and fails as its program says; the key
//!   changes once something is there).
//!
//! URLs (`s3://`, `gs://`, `http(s)://`, ...) are keyed by their text only: an object store is
//! not read when a key is made (docs/registry.md).

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The name of a token folder's index.
const INDEX: &str = "index.json";

/// The digest of what is at `path` (see the module docs).
pub fn digest(path: &Path) -> Result<String> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok("absent".into()),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_dir() {
        let mut h = Sha256::new();
        hash_file(path, &mut h)?;
        return Ok(format!("sha256:{:x}", h.finalize()));
    }
    let index = path.join(INDEX);
    if index.is_file() {
        let mut h = Sha256::new();
        hash_file(&index, &mut h)?;
        return Ok(format!("{INDEX} sha256:{:x}", h.finalize()));
    }
    let mut files = Vec::new();
    list(path, Path::new(""), &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for rel in &files {
        h.update(format!("\0{}\0", rel.display()).as_bytes());
        hash_file(&path.join(rel), &mut h)?;
    }
    Ok(format!("folder of {} files sha256:{:x}", files.len(), h.finalize()))
}

/// Streams the bytes of `path` into `h`.
fn hash_file(path: &Path, h: &mut Sha256) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// The files under `root/rel`, relative to `root`, into `out`.
fn list(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
        path: dir.clone(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        let name = rel.join(entry.file_name());
        if root.join(&name).is_dir() {
            list(root, &name, out)?;
        } else {
            out.push(name);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_folders_and_token_folders_have_digests_that_follow_what_is_read() {
        let dir = std::env::temp_dir().join(format!("weft-tune-inputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ckpt/sub")).unwrap();
        std::fs::create_dir_all(dir.join("tokens")).unwrap();
        // a file: its bytes
        let file = dir.join("corpus.txt");
        assert_eq!(digest(&file).unwrap(), "absent");
        std::fs::write(&file, "hello").unwrap();
        let a = digest(&file).unwrap();
        assert!(a.starts_with("sha256:"), "{a}");
        std::fs::write(&file, "hellO").unwrap();
        assert_ne!(digest(&file).unwrap(), a);
        // a folder: every file's name and bytes
        std::fs::write(dir.join("ckpt/a.bin"), "1").unwrap();
        std::fs::write(dir.join("ckpt/sub/b.bin"), "2").unwrap();
        let c = digest(&dir.join("ckpt")).unwrap();
        assert!(c.starts_with("folder of 2 files sha256:"), "{c}");
        std::fs::write(dir.join("ckpt/sub/b.bin"), "3").unwrap();
        assert_ne!(digest(&dir.join("ckpt")).unwrap(), c);
        // a token folder: its index (which holds the shards' checksums), not its shards
        std::fs::write(dir.join("tokens/index.json"), "{\"shards\": 1}").unwrap();
        std::fs::write(dir.join("tokens/train-0.bin"), "x").unwrap();
        let t = digest(&dir.join("tokens")).unwrap();
        assert!(t.starts_with("index.json sha256:"), "{t}");
        std::fs::write(dir.join("tokens/train-0.bin"), "y").unwrap();
        assert_eq!(digest(&dir.join("tokens")).unwrap(), t);
        std::fs::write(dir.join("tokens/index.json"), "{\"shards\": 2}").unwrap();
        assert_ne!(digest(&dir.join("tokens")).unwrap(), t);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
