use super::*;
use crate::model::test_version;

/// Model `m` with versions 1, 2 and 3 (1 the default), each admitting 4 requests.
fn three() -> Registry {
    let r = Registry::default();
    for v in ["1", "2", "3"] {
        r.add(test_version(v, 4, 1)).unwrap();
    }
    r
}

/// How many of `n` unversioned requests each version answers.
fn routed(r: &Registry, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let a = r.admit("m", None).unwrap();
        *counts.entry(a.served.version.clone()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn the_split_routes_in_proportion_and_follows_removals() {
    let r = three();
    assert_eq!(r.add(test_version("2", 4, 1)).unwrap_err().status, StatusCode::CONFLICT);
    assert_eq!(routed(&r, 10)["1"], 10);
    let w = |v: &str, x: f64| (v.to_string(), x);
    r.set_split("m", &[w("1", 5.0), w("2", 3.0), w("3", 2.0)]).unwrap();
    let counts = routed(&r, 1000);
    for (v, want) in [("1", 500), ("2", 300), ("3", 200)] {
        assert!(counts[v].abs_diff(want) <= 3, "{counts:?}");
    }
    // versioned requests ignore the split
    assert_eq!(r.admit("m", Some("3")).unwrap().served.version, "3");
    assert_eq!(
        r.set_split("m", &[w("9", 1.0)]).unwrap_err().status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        r.set_split("m", &[w("1", 0.0)]).unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        r.set_split("m", &[w("1", f64::NAN)]).unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    // the default stays; a removed version's share goes to the others
    assert_eq!(r.remove("m", "1").unwrap_err().status, StatusCode::CONFLICT);
    r.remove("m", "3").unwrap();
    let view = r.view("m").unwrap();
    let shares: Vec<(&str, f64)> = view.split.iter().map(|(v, x)| (v.as_str(), *x)).collect();
    assert!(
        shares.len() == 2 && (shares[0].1 - 0.625).abs() < 1e-12 && (shares[1].1 - 0.375).abs() < 1e-12,
        "{shares:?}"
    );
    assert_eq!(r.admit("m", Some("3")).err().unwrap().status, StatusCode::NOT_FOUND);
    r.set_default("m", "2").unwrap();
    r.set_split("m", &[]).unwrap();
    assert_eq!(routed(&r, 5)["2"], 5);
    r.remove("m", "1").unwrap();
    r.remove("m", "2").unwrap();
    assert!(r.is_empty());
}

#[test]
fn only_the_version_added_is_removed_by_remove_if_same() {
    let r = three();
    let two = r.get("m", Some("2")).unwrap();
    // unregistered, then another checkpoint registered as version 2: that one stays
    r.remove("m", "2").unwrap();
    let other = r.add(test_version("2", 4, 1)).unwrap();
    assert!(r.remove_if_same(&two).unwrap().is_none());
    assert!(Arc::ptr_eq(&r.get("m", Some("2")).unwrap(), &other));
    assert!(Arc::ptr_eq(&r.remove_if_same(&other).unwrap().unwrap(), &other));
    assert_eq!(r.versions("m"), ["1", "3"]);
    // the default is refused as by remove
    let one = r.get("m", Some("1")).unwrap();
    assert_eq!(r.remove_if_same(&one).unwrap_err().status, StatusCode::CONFLICT);
    // a failure recorded at start is forgotten when cleared
    let failure = |v: &str| LoadFailure {
        name: "n".into(),
        version: v.into(),
        error: "e".into(),
    };
    r.record_failure(failure("1"));
    r.record_failure(failure("2"));
    r.clear_failure("n", "1");
    assert_eq!(r.failures(), [failure("2")]);
}

#[test]
fn a_removed_version_drains_what_it_admitted() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let r = three();
        let held = r.admit("m", Some("2")).unwrap();
        let served = r.remove("m", "2").unwrap();
        assert_eq!(served.queue_depth(), 1);
        let drained = tokio::spawn(async move {
            drain(&served).await;
            served
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!drained.is_finished(), "drained while a request was admitted");
        drop(held);
        let served = drained.await.unwrap();
        // closed for good: nothing is admitted to it any more
        assert!(Admitted::new(&served).is_err());
    });
}

#[test]
fn a_request_needing_several_places_takes_them_at_admission_and_keeps_them_while_draining() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let r = three();
        let too_many = |s: &Served, queue: usize| ApiError::bad_request(format!("{} has {queue}", s.version));
        // more than the version has: the caller's 400, nothing taken
        let e = r.admit_many("m", Some("2"), 5, too_many).err().unwrap();
        assert_eq!((e.status, e.message.as_str()), (StatusCode::BAD_REQUEST, "2 has 4"));
        // admitted with all three places at once
        let held = r.admit_many("m", Some("2"), 3, too_many).unwrap();
        assert_eq!(held.places(), 3);
        let served = held.served.clone();
        assert_eq!(served.queue_depth(), 3);
        // two more do not fit in the one left: refused whole, the one place stays free
        let e = r.admit_many("m", Some("2"), 2, too_many).err().unwrap();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(served.queue_depth(), 3);
        // unregistered: the drain takes every place given back, so no place can be had now
        // (a request taking its further places one by one, after its first, was refused)
        r.remove("m", "2").unwrap();
        let draining = served.clone();
        let drained = tokio::spawn(async move { drain(&draining).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(Admitted::new(&served).is_err());
        // the request has its three places still: one per completion, each given back alone
        let mut places = held.into_places();
        assert_eq!(places.iter().map(Admitted::places).collect::<Vec<_>>(), [1, 1, 1]);
        assert!(places.iter().all(|a| Arc::ptr_eq(&a.served, &served)));
        while let Some(place) = places.pop() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert!(
                !drained.is_finished(),
                "drained while {} places were held",
                places.len() + 1
            );
            drop(place);
        }
        drained.await.unwrap();
        assert!(Admitted::new(&served).is_err());
    });
}
