use super::*;

fn fake_checkpoint(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("COMPLETE"), "").unwrap();
    std::fs::write(dir.join("index.json"), "{}").unwrap();
}

#[test]
fn a_reader_of_a_store_without_versions_takes_no_write_lock() {
    let dir = std::env::temp_dir().join(format!("weft-tune-registry-reader-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = dir.join("store");
    drop(Store::open(&store).unwrap());
    // another process holds the write lock (a long write transaction)
    let holder = rusqlite::Connection::open(store.join("runs.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let reader = ModelRegistry::open_existing(&store).unwrap();
    assert_eq!(reader.list().unwrap(), Listing::default());
    assert!(reader.production().unwrap().versions.is_empty());
    let e = reader.version("m", 1).unwrap_err().to_string();
    assert!(e.contains("no model named \"m\""), "{e}");
    // it waited 30 s for the lock and failed, to make the table
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    holder.execute_batch("COMMIT").unwrap();
    // a registry opened that way still registers (and makes the table then)
    let ckpt = dir.join("ckpt");
    fake_checkpoint(&ckpt);
    let mut reader = reader;
    assert_eq!(reader.register(&store, ckpt.to_str().unwrap(), "m").unwrap().version, 1);
    assert_eq!(reader.list().unwrap().versions.len(), 1);
}

#[test]
fn versions_count_up_and_one_production_per_name() {
    let dir = std::env::temp_dir().join(format!("weft-tune-registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ckpts = dir.join("ckpt");
    fake_checkpoint(&ckpts.join("step-00000002"));
    fake_checkpoint(&ckpts.join("step-00000010"));
    let mut reg = ModelRegistry::open(&dir.join("store")).unwrap();
    let store = dir.join("store");
    let v1 = reg.register(&store, ckpts.to_str().unwrap(), "m").unwrap();
    assert_eq!((v1.version, v1.stage.as_str()), (1, "none"));
    assert!(v1.path.ends_with("step-00000010"), "{:?}", v1.path);
    let v2 = reg
        .register(&store, ckpts.join("step-00000002").to_str().unwrap(), "m")
        .unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(
        reg.register(&store, ckpts.to_str().unwrap(), "other").unwrap().version,
        1
    );
    // bad input
    assert!(reg.register(&store, dir.to_str().unwrap(), "m").is_err());
    assert!(reg.register(&store, "no-such-run", "m").is_err());
    assert!(reg.register(&store, ckpts.to_str().unwrap(), "bad/name").is_err());
    assert!(reg.promote("m", 9, Stage::Staging).is_err());
    assert!(reg.promote("nope", 1, Stage::Staging).is_err());
    assert!("live".parse::<Stage>().is_err());
    // one production version per name
    assert_eq!(reg.promote("m", 1, Stage::Production).unwrap(), None);
    assert_eq!(reg.promote("m", 2, Stage::Production).unwrap(), Some(1));
    assert_eq!(reg.version("m", 1).unwrap().stage, "archived");
    let prod = reg.production().unwrap().versions;
    assert_eq!(prod.len(), 1);
    assert_eq!((prod[0].name.as_str(), prod[0].version), ("m", 2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rows_written_by_hand_that_are_no_version_are_left_out_by_name_and_the_rest_read() {
    let dir = std::env::temp_dir().join(format!("weft-tune-registry-rows-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ckpt = dir.join("ckpt");
    fake_checkpoint(&ckpt);
    let store = dir.join("store");
    let mut reg = ModelRegistry::open(&store).unwrap();
    reg.register(&store, ckpt.to_str().unwrap(), "m").unwrap();
    reg.promote("m", 1, Stage::Production).unwrap();
    let insert = |sql: &str| reg.store.connection().execute(sql, []).unwrap();
    // a path as a blob; a version as text; a name that is not UTF-8; a created time as text
    insert("INSERT INTO model_versions VALUES ('blob', 1, 'production', NULL, NULL, x'2f746d70', 0, 0)");
    insert("INSERT INTO model_versions VALUES ('vtext', 'two', 'staging', NULL, NULL, '/tmp', 0, 0)");
    insert("INSERT INTO model_versions VALUES (CAST(x'ff00' AS TEXT), 1, 'production', NULL, NULL, '/tmp', 0, 0)");
    insert("INSERT INTO model_versions VALUES ('when', 1, 'none', NULL, NULL, '/tmp', 'noon', 0)");
    let all = reg.list().unwrap();
    assert_eq!(all.versions.len(), 1, "{all:?}");
    assert_eq!((all.versions[0].name.as_str(), all.versions[0].version), ("m", 1));
    let said: Vec<String> = all.unreadable.iter().map(|u| u.to_string()).collect();
    assert_eq!(said.len(), 4, "{said:?}");
    for want in [
        "the registry's row for model \"blob\" version 1 cannot be read (column path holds a blob); it is left out",
        "the registry's row for model \"vtext\" version (unreadable) cannot be read (column version holds text)",
        "the registry's row for model (unreadable) version 1 cannot be read (column name holds text that is not UTF-8)",
        "the registry's row for model \"when\" version 1 cannot be read (column created holds text)",
    ] {
        assert!(said.iter().any(|s| s.starts_with(want)), "{want}\nin {said:?}");
    }
    // production: the readable version and the bad rows that are (or may be) production
    let prod = reg.production().unwrap();
    assert_eq!(prod.versions.len(), 1);
    let names: Vec<Option<&str>> = prod.unreadable.iter().map(|u| u.name.as_deref()).collect();
    assert_eq!(names, [Some("blob"), None]);
    // one model's rows; one version's row
    let blob = reg.versions("blob").unwrap();
    assert_eq!((blob.versions.len(), blob.unreadable.len()), (0, 1));
    let e = reg.version("blob", 1).unwrap_err().to_string();
    assert!(
        e.contains("the row for model \"blob\" version 1 cannot be read (column path holds a blob)"),
        "{e}"
    );
    assert!(reg.versions("nope").is_err());
    assert_eq!(reg.version("m", 1).unwrap().stage, "production");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_the_check_refuses_is_not_registered() {
    let dir = std::env::temp_dir().join(format!("weft-tune-registry-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ckpts = dir.join("ckpt");
    fake_checkpoint(&ckpts.join("step-00000004"));
    let store = dir.join("store");
    let mut reg = ModelRegistry::open(&store).unwrap();
    // the check is given the checkpoint folder the source resolves to
    let seen = std::cell::RefCell::new(None);
    let refuse = |p: &Path| {
        *seen.borrow_mut() = Some(p.to_path_buf());
        Err(format!("{}: damaged", p.display()))
    };
    let e = reg
        .register_checked(&store, ckpts.to_str().unwrap(), "m", &refuse)
        .unwrap_err()
        .to_string();
    let folder = ckpts.join("step-00000004").canonicalize().unwrap();
    assert_eq!(e, format!("{}: damaged", folder.display()));
    assert_eq!(seen.borrow().as_deref(), Some(folder.as_path()));
    assert!(reg.list().unwrap().versions.is_empty(), "nothing registered");
    let v = reg
        .register_checked(&store, ckpts.to_str().unwrap(), "m", &|_| Ok(()))
        .unwrap();
    assert_eq!(v.version, 1, "the refused one took no version number");
    let _ = std::fs::remove_dir_all(&dir);
}
