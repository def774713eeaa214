//! TensorBoard event files: CRC32C against RFC 3720's vectors, and every record of a written
//! file read back with its checksums and values.

#[path = "support/tfevents.rs"]
mod tfevents;

use weft_track::tensorboard::{masked_crc32c, EventWriter, FILE_VERSION};

/// RFC 3720 (iSCSI), appendix B.4: CRC32C of 32-byte patterns and a 48-byte PDU.
fn rfc3720_vectors() -> Vec<(Vec<u8>, u32)> {
    let mut pdu = vec![0u8; 48];
    pdu[0] = 0x01;
    pdu[1] = 0xc0;
    pdu[16..20].copy_from_slice(&[0x14, 0x00, 0x00, 0x00]);
    pdu[20..24].copy_from_slice(&[0x00, 0x00, 0x04, 0x00]);
    pdu[24..28].copy_from_slice(&[0x00, 0x00, 0x00, 0x14]);
    pdu[28..32].copy_from_slice(&[0x00, 0x00, 0x00, 0x18]);
    pdu[32..36].copy_from_slice(&[0x28, 0x00, 0x00, 0x00]);
    pdu[36..40].copy_from_slice(&[0x00, 0x00, 0x00, 0x00]);
    pdu[40..44].copy_from_slice(&[0x02, 0x00, 0x00, 0x00]);
    vec![
        (vec![0u8; 32], 0x8a91_36aa),
        (vec![0xffu8; 32], 0x62a8_ab43),
        ((0u8..32).collect(), 0x46dd_794e),
        ((0u8..32).rev().collect(), 0x113f_db5c),
        (pdu, 0xd996_3a56),
        (b"123456789".to_vec(), 0xe306_9283),
    ]
}

#[test]
fn crc32c_known_answers() {
    for (data, want) in rfc3720_vectors() {
        assert_eq!(crc32c::crc32c(&data), want, "the crate, {data:02x?}");
        assert_eq!(tfevents::crc32c(&data), want, "the test's own, {data:02x?}");
        assert_eq!(masked_crc32c(&data), tfevents::masked(want));
    }
}

#[test]
fn every_record_reads_back() {
    let dir = std::env::temp_dir().join(format!("weft-track-tb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut w = EventWriter::create_in(&dir).unwrap();
    let path = w.path().to_path_buf();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let mut written = Vec::new();
    for step in [0i64, 1, 2, 127, 128, 300, 1 << 40] {
        for (k, tag) in ["loss", "lr", "a/long/tag_name"].iter().enumerate() {
            let value = (step as f64 + 0.1) / (k as f64 + 3.0);
            let time = 1.7e9 + step as f64 * 0.25;
            w.scalar(tag, step, value, time).unwrap();
            written.push((time, step, tag.to_string(), value as f32));
        }
    }
    w.scalar("neg", -5, f64::INFINITY, 1.0).unwrap();
    written.push((1.0, -5, "neg".into(), f32::INFINITY));
    drop(w);
    let events = tfevents::read(&std::fs::read(&path).unwrap());
    assert_eq!(events.len(), written.len() + 1);
    assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
    assert!(events[0].values.is_empty());
    for (e, (time, step, tag, value)) in events[1..].iter().zip(&written) {
        assert_eq!(e.wall_time, *time);
        assert_eq!(e.step, *step);
        assert_eq!(e.file_version, None);
        assert_eq!(e.values, vec![(tag.clone(), *value)]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records a run of `values` (`loss` at steps 1, 2, ...), then sets its start time and host as
/// another run's may be (a sweep's parallel trials start in the same second on one host).
fn record(dir: &std::path::Path, name: &str, values: &[f64]) -> i64 {
    let run = weft_track::NewRun {
        experiment: "sweep".into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let w = weft_track::RunWriter::start(dir, run, weft_track::WriterOptions::default()).unwrap();
    for (s, v) in values.iter().enumerate() {
        w.log(s as u64 + 1, "loss", *v);
    }
    let id = w.id();
    w.end(weft_track::Status::Finished, None).unwrap();
    let conn = rusqlite::Connection::open(dir.join(weft_track::STORE_FILE)).unwrap();
    conn.execute(
        "UPDATE runs SET start_time = 1700000000.25, host = 'node-1' WHERE id = ?1",
        [id],
    )
    .unwrap();
    id
}

/// The `loss` values of an event file, by step.
fn losses(path: &std::path::Path) -> Vec<(i64, f32)> {
    tfevents::read(&std::fs::read(path).unwrap())
        .iter()
        .flat_map(|e| e.values.iter().map(move |(_, v)| (e.step, *v)))
        .collect()
}

#[test]
fn exports_never_overwrite_an_event_file() {
    let dir = std::env::temp_dir().join(format!("weft-track-tb-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store_dir = dir.join("weft-runs");
    let a = record(&store_dir, "trial-1", &[3.0, 2.0]);
    let b = record(&store_dir, "trial-2", &[5.0, 4.0, 1.0]);
    let store = weft_track::Store::open_existing(&store_dir).unwrap();
    // two runs started in the same second on one host, exported to one folder: the second
    // export replaced the first's file (one name, File::create)
    let out = dir.join("tb");
    let fa = weft_track::tensorboard::export_run(&store, a, &out).unwrap();
    let fb = weft_track::tensorboard::export_run(&store, b, &out).unwrap();
    assert_ne!(fa, fb);
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 2);
    assert_eq!(losses(&fa), [(1, 3.0), (2, 2.0)]);
    assert_eq!(losses(&fb), [(1, 5.0), (2, 4.0), (3, 1.0)]);
    let name = fa.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(name, format!("events.out.tfevents.1700000000.node-1.run-{a}"));
    // exported again to the same folder: refused, naming the file, which is left as it is
    let before = std::fs::read(&fa).unwrap();
    let e = weft_track::tensorboard::export_run(&store, a, &out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&fa.display().to_string()) && e.contains("never overwritten"),
        "{e}"
    );
    assert_eq!(std::fs::read(&fa).unwrap(), before);
    // into the run's own folder, beside the file the run wrote while it trained (named by its
    // start second and host, as the export was): that file stays
    let folder = weft_track::run_folder(&store_dir, "sweep", "trial-1");
    std::fs::create_dir_all(&folder).unwrap();
    let trained = folder.join(weft_track::tensorboard::file_name(1700000000.25, "node-1"));
    std::fs::write(&trained, b"the run's own events").unwrap();
    let exported = weft_track::tensorboard::export_run(&store, a, &folder).unwrap();
    assert_ne!(exported, trained);
    assert_eq!(std::fs::read(&trained).unwrap(), b"the run's own events");
    assert_eq!(losses(&exported), [(1, 3.0), (2, 2.0)]);
    let _ = std::fs::remove_dir_all(&dir);
}
