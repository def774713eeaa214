//! The folder that holds the workers' error files ([`crate::failure`]): the launcher gives
//! each worker a path in it (`WEFT_ERROR_FILE`) and reads what the failed ones wrote there. It
//! is private to the launcher's user and removed when the launch ends.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A launch's error-file folder; removed with everything in it when dropped.
pub(super) struct ErrorFiles {
    /// `None` when it could not be made: the workers then get no error file, and failures are
    /// reported in the order the workers exited.
    dir: Option<PathBuf>,
}

impl ErrorFiles {
    /// A fresh folder under the temporary directory (`TMPDIR`, else `/tmp`), readable by this
    /// user only. When none can be made, says so on stderr and goes on without.
    pub(super) fn create() -> ErrorFiles {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::temp_dir();
        let mut last = None;
        for _ in 0..100 {
            let n = N.fetch_add(1, Ordering::SeqCst);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!("weft-launch-{}-{n}-{nanos}", std::process::id()));
            let mut builder = std::fs::DirBuilder::new();
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&dir) {
                Ok(()) => return ErrorFiles { dir: Some(dir) },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        weft_core::errln!(
            "weft launch: cannot make a folder for the workers' error files in {}: {}; failures are reported in \
             the order the workers exit",
            base.display(),
            last.map_or_else(|| "no free name".to_string(), |e| e.to_string())
        );
        ErrorFiles { dir: None }
    }

    /// The error file of global rank `rank`, with whatever an earlier attempt left there
    /// removed.
    pub(super) fn fresh(&self, rank: usize) -> Option<PathBuf> {
        let path = self.dir.as_ref()?.join(format!("rank-{rank}.json"));
        let _ = std::fs::remove_file(&path);
        Some(path)
    }
}

impl Drop for ErrorFiles {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
