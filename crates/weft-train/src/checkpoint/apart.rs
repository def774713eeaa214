//! An export's output kept apart from what it reads: `weft checkpoint consolidate CKPT -o
//! CKPT/step-N/index.json` wrote the file over the checkpoint's own index (and the checkpoint
//! never read again).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Symbolic links followed before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Where a write to `path` lands: the path with every link it leads through followed (a link
/// at its end too, as an atomic write follows it) and `.` and `..` taken out, as far as it
/// exists; the missing rest as written.
fn resolved(path: &Path) -> PathBuf {
    let mut path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for _ in 0..MAX_LINKS {
        if let Ok(c) = path.canonicalize() {
            return c;
        }
        // a link to nothing (yet): what it leads to is what a write creates
        match std::fs::read_link(&path) {
            Ok(target) => path = path.parent().map_or(target.clone(), |p| p.join(&target)),
            Err(_) => break,
        }
    }
    // missing: its nearest existing folder resolved, the rest appended
    let mut tail = Vec::new();
    let mut at = path.as_path();
    while let (Some(name), Some(parent)) = (at.file_name(), at.parent()) {
        tail.push(name);
        if let Ok(mut c) = parent.canonicalize() {
            c.extend(tail.iter().rev());
            return c;
        }
        at = parent;
    }
    path
}

/// Refuses `output` (what `flag` names) when a write there would land on what the export reads:
/// `input` itself (a checkpoint folder, a Hugging Face folder or a file), anything inside the
/// folder, or a file of the folder wherever its links lead. Links and `..` are followed on both
/// sides; the error names both paths.
pub fn check_output_apart(input: &Path, output: &Path, flag: &str) -> Result<()> {
    let Ok(source) = input.canonicalize() else {
        return Ok(()); // nothing there to overwrite (reading it fails, naming it)
    };
    let target = resolved(output);
    let refuse = |what: String| {
        Err(Error::Run(format!(
            "{flag} {}: {what}, which it reads: a write there would destroy it; write to a path outside it",
            output.display()
        )))
    };
    if target == source {
        return refuse(format!("is {}", input.display()));
    }
    if !source.is_dir() {
        return Ok(());
    }
    if target.starts_with(&source) {
        return refuse(format!("lies inside {}", input.display()));
    }
    // a file of the folder that is a link to somewhere else
    for entry in std::fs::read_dir(&source).into_iter().flatten().flatten() {
        if entry.path().canonicalize().is_ok_and(|f| f == target) {
            return refuse(format!(
                "is {} of {} (through a link)",
                entry.file_name().to_string_lossy(),
                input.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_on_or_inside_what_is_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("weft-apart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ckpt = dir.join("ck/step-00000003");
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::write(ckpt.join("index.json"), b"{}").unwrap();
        std::fs::write(dir.join("elsewhere.safetensors"), b"x").unwrap();
        std::os::unix::fs::symlink(
            dir.join("elsewhere.safetensors"),
            ckpt.join("model-rank-00000.safetensors"),
        )
        .unwrap();
        std::os::unix::fs::symlink(ckpt.join("index.json"), dir.join("link.json")).unwrap();
        std::os::unix::fs::symlink(&ckpt, dir.join("ck-link")).unwrap();
        let refused = |out: PathBuf| {
            let e = check_output_apart(&ckpt, &out, "--output")
                .expect_err(&format!("{}", out.display()))
                .to_string();
            assert!(
                e.contains(&out.display().to_string()) && e.contains(&ckpt.display().to_string()),
                "{e}"
            );
        };
        refused(ckpt.join("index.json"));
        refused(ckpt.join("new.safetensors"));
        refused(ckpt.clone());
        refused(dir.join("ck/../ck/step-00000003/index.json"));
        refused(dir.join("link.json"));
        refused(dir.join("ck-link/x.onnx"));
        refused(dir.join("elsewhere.safetensors"));
        // beside it is fine: the checkpoint directory, a new folder
        for ok in [dir.join("ck/x.st"), dir.join("out/new/x.onnx"), dir.join("x.st")] {
            check_output_apart(&ckpt, &ok, "--output").unwrap();
        }
        // a file read is refused as the output, not its folder
        let file = dir.join("x.st");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_output_apart(&file, &file, "--output").is_err());
        check_output_apart(&file, &dir.join("y.onnx"), "--output").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
