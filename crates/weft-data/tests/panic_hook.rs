//! The panics weft contains inside the `tokenizers` crate print nothing (the user sees one error
//! line); every other panic still reaches the hook the program had. One test alone in this binary:
//! it sets the process's panic hook.

use std::sync::{Arc, Mutex};

use weft_data::TokenizerSpec;

#[test]
fn contained_panics_are_silent_and_others_reach_the_previous_hook() {
    // stands in for the default hook, which would print "thread ... panicked at ..."
    let printed: Arc<Mutex<Vec<String>>> = Arc::default();
    let p = printed.clone();
    std::panic::set_hook(Box::new(move |info| {
        p.lock().unwrap().push(info.to_string());
    }));

    let dir = std::env::temp_dir().join(format!("weft-panic-hook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // the Strip decoder strips 2 characters of a 1-character token: the crate panics decoding it
    let path = dir.join("strip.json");
    std::fs::write(
        &path,
        r#"{"decoder":{"type":"Strip","content":" ","start":0,"stop":2},
            "model":{"type":"WordLevel","vocab":{" ":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    )
    .unwrap();
    let t = TokenizerSpec::File(path.clone()).load().unwrap();
    let e = t.decode(&[0]).unwrap_err().to_string();
    assert!(e.contains("cannot decode") && e.contains("(it panicked: "), "{e}");
    // a panic while loading, on another thread (as `weft data prepare` encodes on the pool's)
    let charsmap = dir.join("charsmap.json");
    std::fs::write(
        &charsmap,
        r#"{"normalizer":{"type":"Precompiled","precompiled_charsmap":"AAAA"},
            "model":{"type":"WordLevel","vocab":{"a":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    )
    .unwrap();
    let spec = TokenizerSpec::File(charsmap);
    let e = std::thread::spawn(move || spec.load().unwrap_err().to_string())
        .join()
        .unwrap();
    assert!(e.contains("precompiled_charsmap"), "{e}");
    assert_eq!(*printed.lock().unwrap(), Vec::<String>::new());

    // an ordinary panic, here and on another thread, is handed on
    let r = std::panic::catch_unwind(|| panic!("an ordinary panic"));
    assert!(r.is_err());
    let r = std::thread::spawn(|| panic!("another on its thread")).join();
    assert!(r.is_err());
    let printed = printed.lock().unwrap();
    assert_eq!(printed.len(), 2, "{printed:?}");
    assert!(printed[0].contains("an ordinary panic") && printed[1].contains("another on its thread"));
    std::fs::remove_dir_all(&dir).unwrap();
}
