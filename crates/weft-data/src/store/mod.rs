//! Datasets' files in object storage: `s3://`, `gs://`, `az://`, `http(s)://`, `file://` or a plain
//! path, behind [`ObjectSource`] and [`ObjectSink`].
//!
//! - [`open`] (and [`open_with`]) turns a URL or path into a [`Store`], which reads and writes
//!   objects by name under that root. Remote stores go through the `object_store` crate, with
//!   credentials and endpoints from each cloud's standard environment variables (`AWS_*`, with
//!   `AWS_ENDPOINT_URL` for S3-compatible servers; `GOOGLE_*`; `AZURE_*`). A plain path or a
//!   `file://` URL is a [`LocalFolder`].
//! - Transient failures are retried with exponential backoff for up to
//!   [`StoreOptions::retry_for`] (60 s by default); a missing object or bucket and bad credentials
//!   fail at once. Every error is one line naming the object's URL.
//! - [`CachedSource`] keeps fixed-size blocks of what was read in an on-disk cache with a size
//!   limit, and fetches ahead on a background thread.
//!
//! ```no_run
//! use weft_data::store;
//! use weft_data::ObjectSource;
//!
//! let bucket = store::open("s3://my-bucket/datasets/shakespeare")?;
//! let index = bucket.read("index.json")?; // s3://my-bucket/datasets/shakespeare/index.json
//! let cached = store::CachedSource::new(bucket.clone(), store::CacheOptions::default())?;
//! let window = cached.read_range("train-00000.bin", 4096..8192)?;
//! # let _ = (index, window);
//! # Ok::<(), weft_data::Error>(())
//! ```

mod cache;
mod disk;
mod remote;
mod retry;
mod settings;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

pub use cache::{default_dir, CacheOptions, CacheStats, CachedSource};

use crate::error::{invalid, Result};

/// The largest object read whole, in bytes (`index.json` and the like; shards are read by
/// ranges). A larger one, or a server that claims one, is an error naming it before anything
/// is allocated for it.
pub const MAX_WHOLE_OBJECT: u64 = 1 << 30;
use crate::objects::{LocalFolder, ObjectSink, ObjectSource};

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long one operation keeps retrying transient failures (refused connections, timeouts,
    /// 5xx) before it fails. Default 60 s.
    pub retry_for: Duration,
    /// Settings applied on top of the environment, as `object_store` names them (for S3:
    /// `aws_endpoint`, `aws_access_key_id`, `aws_secret_access_key`, `aws_region`, ...; for GCS
    /// `google_*`; for Azure `azure_*`; for HTTP the client keys such as `timeout`). An unknown
    /// key is an error naming it. Ignored for local folders.
    pub config: Vec<(String, String)>,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            retry_for: Duration::from_secs(60),
            config: Vec::new(),
        }
    }
}

/// Objects under one root: a local folder or a remote store. Both an [`ObjectSource`] and an
/// [`ObjectSink`]; share it as `Arc<Store>` (it coerces to `Arc<dyn ObjectSource>`).
#[derive(Debug)]
pub struct Store {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Local(LocalFolder),
    Remote(remote::Remote),
}

/// Opens `url_or_path` with [`StoreOptions::default`]; see [`open_with`].
pub fn open(url_or_path: &str) -> Result<Arc<Store>> {
    open_with(url_or_path, &StoreOptions::default())
}

/// Opens `url_or_path`: `s3://bucket/prefix` (also `s3a://`), `gs://bucket/prefix`,
/// `az://container/prefix`, `http(s)://host/path`, `file:///abs/path`, or a plain path (no
/// `scheme://`), which is a [`LocalFolder`]. Nothing is read or written until the first call;
/// only the URL and the settings are checked here.
pub fn open_with(url_or_path: &str, options: &StoreOptions) -> Result<Arc<Store>> {
    if url_or_path.is_empty() {
        return Err(invalid("empty store URL or path"));
    }
    let Some((scheme, _)) = url_or_path.split_once("://") else {
        return Ok(Arc::new(Store {
            backend: Backend::Local(LocalFolder::new(url_or_path)),
        }));
    };
    let url = url::Url::parse(url_or_path).map_err(|e| invalid(format!("{url_or_path}: not a valid URL: {e}")))?;
    // the rest of the URL names the objects: a query (`?versionId=...`) or a fragment would be
    // dropped without a word while messages showed it
    if url.query().is_some() || url.fragment().is_some() {
        let what = if url.query().is_some() {
            "a query (?...)"
        } else {
            "a fragment (#...)"
        };
        return Err(invalid(format!(
            "{url_or_path}: a store URL cannot hold {what}; weft names objects by the URL's path alone \
             (write a '?' or '#' that belongs to the path as %3F or %23)"
        )));
    }
    if scheme.eq_ignore_ascii_case("file") {
        let path = url
            .to_file_path()
            .map_err(|_| invalid(format!("{url_or_path}: a file:// URL needs an absolute path")))?;
        return Ok(Arc::new(Store {
            backend: Backend::Local(LocalFolder::new(path)),
        }));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(format!("{url_or_path}: names no bucket, container or host")));
    }
    Ok(Arc::new(Store {
        backend: Backend::Remote(remote::Remote::open(&url, options)?),
    }))
}

impl Store {
    /// Whether this is a folder of this machine (no cache needed in front of it).
    pub fn is_local(&self) -> bool {
        matches!(self.backend, Backend::Local(_))
    }

    /// The object's full path or URL, for messages.
    pub fn describe(&self, name: &str) -> String {
        match &self.backend {
            Backend::Local(f) => ObjectSource::describe(f, name),
            Backend::Remote(r) => r.describe(name),
        }
    }

    /// Whether object `name` exists. `Ok(false)` only when the folder or the store says "not
    /// found"; anything else that keeps the question from being answered (access denied, a store
    /// still unavailable after [`StoreOptions::retry_for`], a folder that cannot be read) is an
    /// error naming the object. A file of any kind (a directory, a link, a broken link) exists.
    ///
    /// For a writer that must not replace what is there (`weft data prepare` and its
    /// `index.json`): [`ObjectSource::len`] failing does not mean the object is absent.
    pub fn exists(&self, name: &str) -> Result<bool> {
        match &self.backend {
            Backend::Local(f) => {
                let rel = std::path::Path::new(name);
                if name.is_empty()
                    || rel.is_absolute()
                    || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(invalid(format!(
                        "{}: object name {name:?} must be a relative path inside the folder",
                        f.root().display()
                    )));
                }
                let path = f.root().join(rel);
                match std::fs::symlink_metadata(&path) {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(source) => Err(crate::error::Error::Io { path, source }),
                }
            }
            Backend::Remote(r) => r.exists(name),
        }
    }
}

impl ObjectSource for Store {
    fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        match &self.backend {
            Backend::Local(f) => f.read_range(name, range),
            Backend::Remote(r) => r.read_range(name, range),
        }
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        match &self.backend {
            Backend::Local(f) => f.read(name),
            Backend::Remote(r) => r.read(name),
        }
    }

    fn len(&self, name: &str) -> Result<u64> {
        match &self.backend {
            Backend::Local(f) => f.len(name),
            Backend::Remote(r) => r.len(name),
        }
    }

    fn describe(&self, name: &str) -> String {
        Store::describe(self, name)
    }
}

impl ObjectSink for Store {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        match &self.backend {
            Backend::Local(f) => f.put(name, bytes),
            Backend::Remote(r) => r.put(name, bytes),
        }
    }

    fn describe(&self, name: &str) -> String {
        Store::describe(self, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_file_urls_are_local_folders() {
        let dir = std::env::temp_dir().join(format!("weft-store-open-{}", std::process::id()));
        let s = open(dir.to_str().unwrap()).unwrap();
        assert!(s.is_local());
        s.put("a/b.bin", b"hello").unwrap();
        let url = format!("file://{}", dir.display());
        let f = open(&url).unwrap();
        assert!(f.is_local());
        assert_eq!(f.read("a/b.bin").unwrap(), b"hello");
        assert_eq!(f.read_range("a/b.bin", 1..3).unwrap(), b"el");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_urls_are_named() {
        for (bad, why) in [
            ("ftp://host/x", "unsupported scheme"),
            ("s3:///nobucket", "names no bucket"),
            ("file://relative/path", "absolute path"),
            ("", "empty"),
            ("s3://data/q?versionId=abc", "cannot hold a query"),
            ("s3://data/q#frag", "cannot hold a fragment"),
            ("gs://data/q?x", "cannot hold a query"),
            ("https://example.invalid/files?sig=1", "cannot hold a query"),
            ("file:///tmp/a#b", "cannot hold a fragment"),
        ] {
            let e = open(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(bad.is_empty() || e.contains(bad), "{bad}: {e}");
        }
        let opts = StoreOptions {
            config: vec![("aws_no_such_key".into(), "1".into())],
            ..StoreOptions::default()
        };
        let e = open_with("s3://bucket/p", &opts).unwrap_err().to_string();
        assert!(e.contains("aws_no_such_key") && e.contains("s3://bucket/p"), "{e}");
    }

    #[test]
    fn settings_object_store_would_panic_on_are_named_not_quoted() {
        let with = |extra: &[(&str, &str)]| {
            let mut config: Vec<(String, String)> = vec![
                ("aws_access_key_id".into(), "k".into()),
                ("aws_secret_access_key".into(), "s".into()),
                ("aws_region".into(), "us-east-1".into()),
                ("aws_endpoint".into(), "http://127.0.0.1:9".into()),
            ];
            config.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            StoreOptions {
                config,
                ..StoreOptions::default()
            }
        };
        for (key, value, why) in [
            ("aws_endpoint", "", "is empty"),
            ("aws_endpoint", "garbage", "not an absolute http(s) URL"),
            ("aws_endpoint", "http://\u{fc}.invalid:19000", "not ASCII"),
            ("aws_endpoint", "ftp://host", "http:// or https://"),
            ("aws_endpoint", "http://host/a b", "cannot carry"),
            ("aws_access_key_id", "key-id\n", "ends with a line break"),
            ("aws_session_token", "abc\ndef", "line break (character 4 of 7)"),
            ("aws_secret_access_key", "sec\u{7}ret", "control character (U+0007)"),
        ] {
            let e = open_with("s3://bucket/p", &with(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("the setting {key:?}")) && e.contains(why) && e.contains("s3://bucket/p"),
                "{key}={value:?}: {e}"
            );
            if key != "aws_endpoint" {
                assert!(!e.contains(value.trim()), "the value is not shown: {e}");
            }
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let azure = |extra: &[(&str, &str)]| {
            let mut o = with(&[]);
            o.config = vec![("azure_storage_account_key".into(), "a2V5".into())];
            o.config
                .extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            o
        };
        for (key, value, why) in [
            (
                "azure_storage_account_name",
                "devstoreaccount1\n",
                "ends with a line break",
            ),
            ("azure_storage_token", "abc\ndef", "line break"),
            ("azure_storage_endpoint", "garbage", "not an absolute"),
        ] {
            let e = open_with(
                "az://container/p",
                &azure(&[("azure_storage_account_name", "acct"), (key, value)]),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("the setting {key:?}")) && e.contains(why),
                "{key}: {e}"
            );
        }
        for (base, why) in [("", "is empty"), ("garbage", "not an absolute"), ("7", "")] {
            let key = if base == "7" {
                r#"{"private_key": "", "private_key_id": "", "client_email": "", "gcs_base_url": 7}"#.to_string()
            } else {
                format!(
                    r#"{{"private_key": "", "private_key_id": "", "client_email": "",
                        "gcs_base_url": "{base}", "disable_oauth": true}}"#
                )
            };
            let o = StoreOptions {
                config: vec![("google_service_account_key".into(), key)],
                ..StoreOptions::default()
            };
            let e = open_with("gs://bucket/p", &o).unwrap_err().to_string();
            assert!(
                e.contains("google_service_account_key") && e.contains("gcs_base_url") && e.contains(why),
                "{base}: {e}"
            );
        }
        // good settings still open; PEM text may span lines
        open_with(
            "s3://bucket/p",
            &with(&[
                ("aws_endpoint", "https://s3.example.com:8443/base"),
                (
                    "aws_proxy_ca_certificate",
                    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                ),
            ]),
        )
        .unwrap();
    }

    #[test]
    fn remote_urls_describe_objects_under_their_prefix() {
        let opts = StoreOptions {
            config: vec![
                ("aws_access_key_id".into(), "k".into()),
                ("aws_secret_access_key".into(), "s".into()),
                ("aws_region".into(), "us-east-1".into()),
            ],
            ..StoreOptions::default()
        };
        let s = open_with("s3://bucket/data/set/", &opts).unwrap();
        assert!(!s.is_local());
        assert_eq!(s.describe("index.json"), "s3://bucket/data/set/index.json");
        let e = s.read("../x").unwrap_err().to_string();
        assert!(e.contains("relative path"), "{e}");
        let h = open("https://example.invalid/files").unwrap();
        assert_eq!(h.describe("a.bin"), "https://example.invalid/files/a.bin");
        // a prefix with a space or a non-ASCII character: its URL form, keys decoded (tested
        // against a server in tests/store_inputs.rs)
        let s = open_with("s3://bucket/my data/d\u{15b}", &opts).unwrap();
        assert_eq!(s.describe("index.json"), "s3://bucket/my%20data/d%C5%9B/index.json");
        for bad in ["s3://bucket/a%2F..%2Fb", "s3://bucket/a/%0A"] {
            let e = open_with(bad, &opts).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
