//! A checkpoint's `index.json` that is no file to read whole: one far larger than any index
//! (a sparse file of 2 GiB) is refused before it is read, and a FIFO is refused without waiting
//! for a writer. Both name the file.

use weft_train::checkpoint::{read_index, MAX_INDEX_BYTES};

fn folder(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("weft-index-file-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn an_index_past_the_cap_is_refused_before_it_is_read() {
    let dir = folder("huge");
    let file = std::fs::File::create(dir.join("index.json")).unwrap();
    // sparse: no disk used, and reading it whole would take 2 GiB of memory
    file.set_len(2 * MAX_INDEX_BYTES).unwrap();
    let e = read_index(&dir).unwrap_err().to_string();
    assert!(e.contains("index.json") && e.contains("longer than"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn a_fifo_index_is_refused_without_waiting() {
    let dir = folder("fifo");
    let path = dir.join("index.json");
    let status = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(status.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.clone();
    std::thread::spawn(move || {
        let _ = tx.send(read_index(&d).map(drop).map_err(|e| e.to_string()));
    });
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("an answer within 20 s");
    let e = result.unwrap_err();
    assert!(e.contains("index.json") && e.contains("FIFO"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
