//! Number flags outside their bounds stop the start in one line naming the flag and the
//! bounds; a body that is not JSON is a 400 naming its own cause (a number past f64's range, a
//! lone surrogate escape, a string that is not UTF-8), not a shape it does not have.

use std::io::Read;
use std::process::Stdio;

use crate::common::{temp_dir, wait_for, weft_command, weft_ok_with_store};
use crate::support::{train_mlp, Server};

#[test]
fn number_flags_outside_their_bounds_stop_the_start_naming_the_flag_and_the_bounds() {
    let store = temp_dir("serve-flag-bounds");
    // a registry with a production version: before, each value below started a server
    let runs = store.join("runs");
    let ckpt = train_mlp(&store);
    weft_ok_with_store(&runs, &["models", "register", ckpt.to_str().unwrap(), "--name", "m"]);
    weft_ok_with_store(&runs, &["models", "promote", "m", "1", "--stage", "production"]);
    let (s, r) = (store.to_str().unwrap(), runs.to_str().unwrap());
    for (flag, value, bounds) in [
        // before, 0 was 10 ms without a word, and 2^64 - 1 never followed a promotion
        ("--registry-poll-ms", "0", "is outside 10 to 600000"),
        ("--registry-poll-ms", "18446744073709551615", "is outside 10 to 600000"),
        ("--registry-poll-ms", "600001", "is outside 10 to 600000"),
        // before, 0 started a server answering every request body 413
        ("--max-body-bytes", "0", "is outside 256 to 1073741824"),
        ("--max-body-bytes", "1073741825", "is outside 256 to 1073741824"),
        (
            "--max-body-bytes-in-flight",
            "1099511627777",
            "is outside 16777216 to 1099511627776",
        ),
    ] {
        #[rustfmt::skip]
        let mut child = weft_command(&["serve", "--model-store", s, "--registry", r, "--port", "0",
            "--management-port", "0", "--metrics-port", "0", flag, value])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stopped = wait_for(20, || child.try_wait().unwrap().is_some());
        if !stopped {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(stopped, "{flag} {value}: the server started: {err}");
        assert_eq!(status.code(), Some(1), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("{flag}: {value} {bounds}")),
            "{flag} {value}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_body_that_is_not_json_is_answered_400_naming_its_own_cause() {
    let store = temp_dir("serve-json-causes");
    train_mlp(&store);
    let s = Server::start(&store, &["--model", "m=mlp"]);
    let infer = |data: &str| {
        format!(r#"{{"inputs": [{{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": {data}}}]}}"#)
            .into_bytes()
    };
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("/v2/models/m/infer", infer("[0.5, 1e400]"), "number out of range"),
        (
            "/v2/models/m/generate",
            br#"{"text_input": "ab", "parameters": {"max_tokens": 5, "temperature": 1e400}}"#.to_vec(),
            "number out of range",
        ),
        (
            "/v1/completions",
            br#"{"model": "m", "prompt": "\ud800", "max_tokens": 5}"#.to_vec(),
            "hex escape",
        ),
        (
            "/v1/completions",
            b"{\"model\": \"m\", \"prompt\": \"\xff\xfe\", \"max_tokens\": 5}".to_vec(),
            "invalid unicode code point",
        ),
        (
            "/v1/completions",
            br#"{"model": "m", "prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "\ud800x"]}"#.to_vec(),
            "hex escape",
        ),
    ];
    for (path, body, cause) in cases {
        let shown = String::from_utf8_lossy(&body).into_owned();
        let (status, answer) = s.post(path, body);
        assert_eq!(status, 400, "{shown}: {answer}");
        let message = if path.starts_with("/v1/") {
            &answer["error"]["message"]
        } else {
            &answer["error"]
        };
        let message = message.as_str().unwrap_or_default();
        assert!(
            message.starts_with("the request body is not valid JSON: ") && message.contains(cause),
            "{shown}: {message}"
        );
        // before, each was "invalid request at ...: expected a JSON object, not an array"
        assert!(!message.contains("array"), "{shown}: {message}");
    }
    s.alive();
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}
