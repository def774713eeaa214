//! `safetensors::save` (through `io::atomic::write`): a symlink at the target is written through
//! (the link stays), a target that is not a regular file is refused with one line naming it, and
//! a failed write (a full disk: the file size limit lowered in a child process) leaves neither a
//! temporary file nor a changed target.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weft_core::io::safetensors;
use weft_core::Tensor;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("atomic-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tensor(values: &[f32]) -> Tensor {
    Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

fn save(path: &Path, values: &[f32]) -> weft_core::Result<()> {
    let t = tensor(values);
    safetensors::save(path, [("w", &t)], &BTreeMap::new())
}

fn read(path: &Path) -> Vec<f64> {
    safetensors::load(path).unwrap().tensors["w"].to_vec_f64()
}

/// Files under `dir` (recursively) whose name ends in `.tmp`.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.extend(leftovers(&p));
        } else if p.to_string_lossy().ends_with(".tmp") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_symlink_is_written_through_and_stays_a_link() {
    let dir = scratch("symlink");
    std::fs::create_dir(dir.join("store")).unwrap();
    let real = dir.join("store/model.safetensors");
    save(&real, &[1.0, 2.0]).unwrap();
    // a relative link, and a link to that link
    let link = dir.join("latest.safetensors");
    std::os::unix::fs::symlink("store/model.safetensors", &link).unwrap();
    let chain = dir.join("chain.safetensors");
    std::os::unix::fs::symlink(&link, &chain).unwrap();

    save(&link, &[3.0, 4.0, 5.0]).unwrap();
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("store/model.safetensors"));
    assert_eq!(read(&real), vec![3.0, 4.0, 5.0]);

    save(&chain, &[6.0]).unwrap();
    assert!(std::fs::symlink_metadata(&chain).unwrap().file_type().is_symlink());
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(read(&real), vec![6.0]);

    // a dangling link: the file is created where it points
    let dangling = dir.join("next.safetensors");
    std::os::unix::fs::symlink("store/new.safetensors", &dangling).unwrap();
    save(&dangling, &[7.0]).unwrap();
    assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink());
    assert_eq!(read(&dir.join("store/new.safetensors")), vec![7.0]);
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_target_that_is_not_a_regular_file_is_refused_naming_it() {
    let dir = scratch("special");
    // a directory
    let sub = dir.join("sub.safetensors");
    std::fs::create_dir(&sub).unwrap();
    let e = save(&sub, &[1.0]).unwrap_err().to_string();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains(&*sub.to_string_lossy()) && e.contains("a directory") && e.contains("not a regular file"),
        "{e}"
    );
    assert!(sub.is_dir());
    // a FIFO
    let fifo = dir.join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let e = save(&fifo, &[1.0]).unwrap_err().to_string();
    assert!(e.contains(&*fifo.to_string_lossy()) && e.contains("a FIFO"), "{e}");
    {
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }
    // a device node, directly and through a link
    let null = Path::new("/dev/null");
    if null.exists() {
        use std::os::unix::fs::FileTypeExt;
        let e = save(null, &[1.0]).unwrap_err().to_string();
        assert!(e.contains("/dev/null") && e.contains("a character device"), "{e}");
        let link = dir.join("null.safetensors");
        std::os::unix::fs::symlink(null, &link).unwrap();
        let e = save(&link, &[1.0]).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} (a link to /dev/null)", link.display())) && e.contains("a character device"),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(null).unwrap().file_type().is_char_device());
        assert!(!Path::new("/dev/null.tmp").exists());
    }
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The environment variable that makes [`a_failed_write_leaves_no_temporary_file`] run its child
/// part (in a process of its own, since the file size limit applies to the whole process).
const CHILD: &str = "WEFT_TEST_FULL_DISK_DIR";

#[test]
fn a_failed_write_leaves_no_temporary_file() {
    if let Ok(dir) = std::env::var(CHILD) {
        // the child: files may grow to 4 KiB; a longer write fails with EFBIG (SIGXFSZ ignored)
        let dir = PathBuf::from(dir);
        let lim = libc::rlimit {
            rlim_cur: 4096,
            rlim_max: 4096,
        };
        // SAFETY: plain system calls on this process.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        let e = save(&dir.join("model.safetensors"), &vec![0.5; 16384]).unwrap_err();
        std::fs::write(dir.join("error.txt"), e.to_string()).unwrap();
        return;
    }
    let dir = scratch("full");
    let target = dir.join("model.safetensors");
    save(&target, &[1.0, 2.0]).unwrap();
    let before = std::fs::read(&target).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_failed_write_leaves_no_temporary_file", "--exact", "--test-threads=1"])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let e = std::fs::read_to_string(dir.join("error.txt")).unwrap();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains(&*target.to_string_lossy()) && e.contains("too large"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), before, "the target is unchanged");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}
