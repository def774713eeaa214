//! Cloud settings from the environment that object_store panicked on (exit 101 on the first
//! request): an `AWS_ENDPOINT_URL` that is empty, not a URL, or holds a non-ASCII host; a key,
//! token or account name with a line break (a secret file's last newline); a GCS key whose
//! `gcs_base_url` is empty or garbage. Each is now one error naming the variable, never quoting a
//! secret. One test alone in this binary: it sets the process's environment.

#[path = "support/s3_server.rs"]
mod s3_server;

use std::time::Duration;

use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use weft_data::store::{self, StoreOptions};
use weft_data::{ObjectSink, ObjectSource};

const CLOUD_PREFIXES: [&str; 3] = ["AWS_", "AZURE_", "GOOGLE_"];

fn clear_cloud_env() {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if CLOUD_PREFIXES.iter().any(|p| k.starts_with(p)) || k == "SERVICE_ACCOUNT" || k == "IDENTITY_ENDPOINT" {
                std::env::remove_var(k);
            }
        }
    }
}

fn set(vars: &[(&str, &str)]) {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
}

/// Opens `url` with `vars` set (and nothing else of the clouds'), and reads `index.json`; the
/// error of whichever fails (none should panic).
fn attempt(url: &str, vars: &[(&str, &str)]) -> Result<Vec<u8>, String> {
    clear_cloud_env();
    set(vars);
    let options = StoreOptions {
        retry_for: Duration::from_secs(1),
        config: Vec::new(),
    };
    let s = store::open_with(url, &options).map_err(|e| e.to_string())?;
    s.read("index.json").map_err(|e| e.to_string())
}

#[test]
fn malformed_cloud_variables_are_named_not_panicked_on() {
    let dir = std::env::temp_dir().join(format!("weft-store-env-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let server = S3Server::start(&dir.join("server"));
    server.create_bucket("data");
    let endpoint = server.endpoint();
    let aws = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, String)> {
        let mut v: Vec<(&str, String)> = vec![
            ("AWS_ENDPOINT_URL", endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ];
        for (k, val) in extra {
            v.retain(|(name, _)| name != k);
            v.push((k, val.to_string()));
        }
        v
    };
    let run = |url: &str, vars: &[(&str, String)]| {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        attempt(url, &vars)
    };

    // good settings from the environment work (and the object is there to read)
    clear_cloud_env();
    let good = aws(&[]);
    set(&good.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
    store::open("s3://data/ds").unwrap().put("index.json", b"{}").unwrap();
    assert_eq!(run("s3://data/ds", &good).unwrap(), b"{}");

    let secret_cases: [(&str, &str, &str); 5] = [
        ("AWS_ACCESS_KEY_ID", "weft-test-key\n", "ends with a line break"),
        ("AWS_SESSION_TOKEN", "abc\ndef", "holds a line break"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "weft-test-secret\r\n",
            "ends with a line break",
        ),
        ("AWS_SESSION_TOKEN", "tok\u{1b}en", "control character (U+001B)"),
        ("AWS_REGION", "us-east-1\n", "ends with a line break"),
    ];
    for (var, value, why) in secret_cases {
        let e = run("s3://data/ds", &aws(&[(var, value)])).unwrap_err();
        assert!(
            e.contains(var) && e.contains(why) && e.contains("s3://data/ds"),
            "{var}: {e}"
        );
        assert!(!e.contains(value.trim()), "{var}: the value is not shown: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
    for (value, why) in [
        ("", "is empty"),
        ("garbage", "not an absolute http(s) URL"),
        ("http://\u{fc}.invalid:19000", "not ASCII"),
        ("s3://bucket", "http:// or https://"),
        ("http://", "not an absolute http(s) URL"),
        ("http://host\n", "ends with a line break"),
    ] {
        let e = run("s3://data/ds", &aws(&[("AWS_ENDPOINT_URL", value)])).unwrap_err();
        assert!(e.contains("AWS_ENDPOINT_URL") && e.contains(why), "{value:?}: {e}");
    }
    // the older alias of the variable is checked as well
    let mut alias = aws(&[]);
    alias.retain(|(k, _)| *k != "AWS_ENDPOINT_URL");
    alias.push(("AWS_ENDPOINT", "garbage".into()));
    let e = run("s3://data/ds", &alias).unwrap_err();
    assert!(e.contains("AWS_ENDPOINT ") && e.contains("not an absolute"), "{e}");
    // a setting in code replaces the variable: the variable is not used, so not checked
    clear_cloud_env();
    set(&[("AWS_ENDPOINT_URL", "garbage"), ("AWS_ACCESS_KEY_ID", "key\n")]);
    let opts = StoreOptions {
        retry_for: Duration::from_secs(1),
        config: vec![
            ("aws_endpoint".into(), endpoint.clone()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), SECRET_KEY.into()),
            ("aws_region".into(), "us-east-1".into()),
        ],
    };
    assert_eq!(
        store::open_with("s3://data/ds", &opts)
            .unwrap()
            .read("index.json")
            .unwrap(),
        b"{}"
    );

    // Azure: nothing listens; the check comes before any request
    for (var, value, why) in [
        (
            "AZURE_STORAGE_ACCOUNT_NAME",
            "devstoreaccount1\n",
            "ends with a line break",
        ),
        ("AZURE_STORAGE_TOKEN", "abc\ndef", "holds a line break"),
        ("AZURE_STORAGE_ENDPOINT", "garbage", "not an absolute"),
        ("IDENTITY_ENDPOINT", "", "is empty"),
    ] {
        let mut vars = vec![
            ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1"),
            ("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"),
            ("AZURE_STORAGE_ENDPOINT", "http://127.0.0.1:9/devstoreaccount1"),
            ("AZURE_ALLOW_HTTP", "true"),
        ];
        vars.retain(|(k, _)| *k != var);
        vars.push((var, value));
        let e = attempt("az://data/ds", &vars).unwrap_err();
        assert!(
            e.contains(var) && e.contains(why) && e.contains("az://data/ds"),
            "{var}: {e}"
        );
        if var != "AZURE_STORAGE_ENDPOINT" {
            assert!(value.trim().is_empty() || !e.contains(value.trim()), "{var}: {e}");
        }
    }

    // GCS: the base URL inside the service-account key, in the variable or in a key file
    let key = |base: &str| {
        format!(
            r#"{{"private_key": "", "private_key_id": "", "client_email": "",
                "gcs_base_url": "{base}", "disable_oauth": true}}"#
        )
    };
    for (base, why) in [("", "is empty"), ("garbage", "not an absolute")] {
        let k = key(base);
        let e = attempt("gs://data/ds", &[("GOOGLE_SERVICE_ACCOUNT_KEY", &k)]).unwrap_err();
        assert!(
            e.contains("GOOGLE_SERVICE_ACCOUNT_KEY") && e.contains("gcs_base_url") && e.contains(why),
            "{base:?}: {e}"
        );
        let file = dir.join("key.json");
        std::fs::write(&file, &k).unwrap();
        let e = attempt("gs://data/ds", &[("GOOGLE_SERVICE_ACCOUNT", file.to_str().unwrap())]).unwrap_err();
        assert!(
            e.contains("GOOGLE_SERVICE_ACCOUNT") && e.contains("gcs_base_url") && e.contains(why),
            "{base:?}: {e}"
        );
    }
    // a key file that is a pipe is refused, not waited on
    let fifo = dir.join("key.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let e = attempt("gs://data/ds", &[("GOOGLE_SERVICE_ACCOUNT", fifo.to_str().unwrap())]).unwrap_err();
    assert!(e.contains("GOOGLE_SERVICE_ACCOUNT") && e.contains("not a file"), "{e}");
    // a good base URL gets as far as the request (nothing listens there)
    let k = key("http://127.0.0.1:9");
    let e = attempt("gs://data/ds", &[("GOOGLE_SERVICE_ACCOUNT_KEY", &k)]).unwrap_err();
    assert!(
        e.contains("gs://data/ds/index.json") && !e.contains("gcs_base_url"),
        "{e}"
    );

    clear_cloud_env();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
