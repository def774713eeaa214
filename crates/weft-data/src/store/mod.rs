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
    }
}
