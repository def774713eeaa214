//! An object store reached over the network (`s3://`, `gs://`, `az://`, `http(s)://`), through the
//! `object_store` crate, on a private tokio runtime; every call blocks on it.
//!
//! The settings a store is built from (the cloud's environment variables, then
//! [`StoreOptions::config`]) are checked before the store is built: `object_store` takes them as
//! they are and panicked on the first request when an endpoint was not a URL it could send to
//! (`AWS_ENDPOINT_URL=` or `=garbage`) or when a value bound for a header held a line break (an
//! `AWS_ACCESS_KEY_ID` read from a secret file with its trailing newline). Each is one error
//! naming the variable (never its value, for credentials). As a last line of defence the build and
//! every request run under `catch_unwind`: a panic inside `object_store` is an error naming the
//! URL, its message kept off stderr.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};

use super::retry::{self, GaveUp};
use super::settings::{applied, check_gcs_key, check_settings, short, Check};
use super::{StoreOptions, MAX_WHOLE_OBJECT};
use crate::error::{invalid, Error, Result};
use crate::objects::check_range;

/// One bucket (or container, or HTTP root) and a prefix inside it.
pub(crate) struct Remote {
    /// The URL the store was opened with, without a trailing `/`, for messages.
    root: String,
    /// The prefix under which object names are resolved.
    prefix: ObjectPath,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
    retry_for: Duration,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("root", &self.root).finish()
    }
}

/// No retries inside object_store: [`retry::retry`] owns the loop.
fn no_retry() -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    }
}

pub(super) fn config_error(url: &str, e: impl std::fmt::Display) -> Error {
    invalid(format!("{url}: {e}"))
}

impl Remote {
    /// Opens `url` (scheme `s3`, `gs`, `az`, `http` or `https`), credentials and endpoints from
    /// the environment, then `options.config` on top.
    pub(crate) fn open(url: &url::Url, options: &StoreOptions) -> Result<Remote> {
        let shown = url.as_str().trim_end_matches('/').to_string();
        let build = || -> Result<(Arc<dyn ObjectStore>, &str)> {
            Ok(match url.scheme() {
                "s3" | "s3a" => (Arc::new(build_s3(url, &shown, options)?), url.path()),
                "gs" => (Arc::new(build_gcs(url, &shown, options)?), url.path()),
                "az" | "abfs" | "abfss" | "azure" => (Arc::new(build_azure(url, &shown, options)?), url.path()),
                "http" | "https" => (Arc::new(build_http(url, &shown, options)?), ""),
                other => {
                    return Err(invalid(format!(
                        "{shown}: unsupported scheme {other:?} (use s3://, gs://, az://, http(s):// or file://, or a plain path)"
                    )))
                }
            })
        };
        let (store, prefix) = contained(build).map_err(|panic| {
            invalid(format!(
                "{shown}: the object_store library failed building the store ({panic}); check the store's settings"
            ))
        })??;
        // the URL's path is percent-encoded (`my%20data`, `d%C5%9B`): the keys are its decoded
        // form (`my data`, `dś`), which the client encodes once when it sends them
        let prefix = ObjectPath::from_url_path(prefix.trim_matches('/')).map_err(|e| config_error(&shown, e))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weft-store")
            .enable_all()
            .build()
            .map_err(|e| invalid(format!("{shown}: cannot start the I/O runtime: {e}")))?;
        Ok(Remote {
            root: shown,
            prefix,
            store,
            rt,
            retry_for: options.retry_for,
        })
    }

    /// `root/name` for messages.
    pub(crate) fn describe(&self, name: &str) -> String {
        format!("{}/{name}", self.root)
    }

    /// The store path of object `name`, refusing empty names and `.`/`..` segments.
    fn path(&self, name: &str) -> Result<ObjectPath> {
        let bad =
            name.is_empty() || name.starts_with('/') || name.split('/').any(|s| s.is_empty() || s == "." || s == "..");
        if bad {
            return Err(invalid(format!(
                "{}: object name {name:?} must be a relative path inside the store",
                self.root
            )));
        }
        let joined = if self.prefix.as_ref().is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix.as_ref())
        };
        ObjectPath::parse(&joined).map_err(|e| invalid(format!("{}: {e}", self.describe(name))))
    }

    /// Runs `op` on the runtime with retries; the error names `name`'s URL.
    fn run<T, F, Fut>(&self, name: &str, op: F) -> Result<T>
    where
        F: Fn(Arc<dyn ObjectStore>, ObjectPath) -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let path = self.path(name)?;
        self.attempt(&path, op).map_err(|g| self.gave_up(name, g))
    }

    /// Runs `op` on `path` with retries, returning how it ended when it did not succeed.
    fn attempt<T, F, Fut>(&self, path: &ObjectPath, op: F) -> std::result::Result<T, GaveUp>
    where
        F: Fn(Arc<dyn ObjectStore>, ObjectPath) -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        retry::retry(self.retry_for, |left| {
            let attempt = op(self.store.clone(), path.clone());
            let run = || {
                self.rt.block_on(async move {
                    match tokio::time::timeout(left, attempt).await {
                        Ok(r) => r,
                        Err(_) => Err(object_store::Error::Generic {
                            store: "weft",
                            source: Box::new(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("no answer within {:.1} s", left.as_secs_f64()),
                            )),
                        }),
                    }
                })
            };
            // a panic inside object_store (a request it cannot build from its settings) is a
            // definite failure of this operation, not of the process
            contained(run).unwrap_or_else(|panic| {
                Err(object_store::Error::Generic {
                    store: "weft",
                    source: format!(
                        "the object_store library failed on this request ({panic}); check the store's settings"
                    )
                    .into(),
                })
            })
        })
    }

    /// One line for an operation that failed: what kind of failure, the URL, the last error.
    fn gave_up(&self, name: &str, g: GaveUp) -> Error {
        let url = self.describe(name);
        let detail = retry::chain(&g.last);
        let msg = match &g.last {
            object_store::Error::NotFound { .. } => {
                format!("{url}: not found (no such object or bucket): {detail}")
            }
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                format!("{url}: access denied; check the credentials in the environment: {detail}")
            }
            _ if g.transient => format!(
                "{url}: store unavailable, gave up after {} attempts in {:.1} s (retry bound {:.1} s): {detail}",
                g.attempts,
                g.elapsed.as_secs_f64(),
                self.retry_for.as_secs_f64()
            ),
            _ => format!("{url}: {detail}"),
        };
        Error::Invalid(msg)
    }

    /// Bytes `range` of `name`.
    pub(crate) fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        if range.end <= range.start {
            // empty or reversed: no bytes to fetch, only the range to check
            check_range(&self.describe(name), &range, self.len(name)?)?;
            return Ok(Vec::new());
        }
        let path = self.path(name)?;
        let got = self.attempt(&path, |store, path| {
            let r = range.clone();
            let want = range.end - range.start;
            async move {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(r)),
                    ..GetOptions::default()
                };
                let res = store.get_opts(&path, opts).await?;
                let size = res.meta.size;
                let bytes = body_within(res, want).await?;
                Ok((bytes, size))
            }
        });
        let what = self.describe(name);
        match got {
            Ok((Ok(bytes), _)) if bytes.len() as u64 == range.end - range.start => Ok(bytes),
            Ok((Err(more), _)) => Err(invalid(format!(
                "{what}: more than {} bytes came back for byte range {}..{} ({more} or more)",
                range.end - range.start,
                range.start,
                range.end
            ))),
            Ok((Ok(bytes), size)) => {
                check_range(&what, &range, size)?;
                Err(invalid(format!(
                    "{what}: {} bytes came back for byte range {}..{}",
                    bytes.len(),
                    range.start,
                    range.end
                )))
            }
            // a range starting past the end is refused by the server (416): say so plainly; after
            // transient failures the bound is spent, so the length is not asked for (that would
            // be a second retry loop)
            Err(g) if !g.transient => {
                if let Ok(len) = self.len(name) {
                    check_range(&what, &range, len)?;
                }
                Err(self.gave_up(name, g))
            }
            Err(g) => Err(self.gave_up(name, g)),
        }
    }

    /// The whole of `name`, at most [`MAX_WHOLE_OBJECT`] bytes.
    pub(crate) fn read(&self, name: &str) -> Result<Vec<u8>> {
        let got = self.run(name, |store, path| async move {
            body_within(store.get(&path).await?, MAX_WHOLE_OBJECT).await
        })?;
        got.map_err(|size| {
            invalid(format!(
                "{}: {size} bytes or more, over the {MAX_WHOLE_OBJECT} bytes weft reads of one object whole",
                self.describe(name)
            ))
        })
    }

    /// The length of `name` in bytes (as the store says: checked where it is used).
    pub(crate) fn len(&self, name: &str) -> Result<u64> {
        self.run(name, |store, path| async move { Ok(store.head(&path).await?.size) })
    }

    /// Whether object `name` exists: `Ok(false)` only when the store answers "not found"; any other
    /// failure (access denied, a store unavailable past the retry bound) is an error naming the
    /// URL, never taken for "absent".
    pub(crate) fn exists(&self, name: &str) -> Result<bool> {
        let path = self.path(name)?;
        match self.attempt(&path, |store, path| async move { store.head(&path).await.map(|_| ()) }) {
            Ok(()) => Ok(true),
            Err(GaveUp {
                last: object_store::Error::NotFound { .. },
                ..
            }) => Ok(false),
            Err(g) => Err(self.gave_up(name, g)),
        }
    }

    /// Writes `name` whole (one PUT: the store shows the old object or the new one).
    pub(crate) fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let payload = PutPayload::from(bytes.to_vec());
        self.run(name, |store, path| {
            let payload = payload.clone();
            async move {
                store.put(&path, payload).await?;
                Ok(())
            }
        })
    }
}

/// `s3://bucket/prefix`: `AWS_*` variables (`AWS_ENDPOINT_URL` for S3-compatible stores; an
/// `http://` endpoint is allowed without `AWS_ALLOW_HTTP`).
fn build_s3(url: &url::Url, shown: &str, options: &StoreOptions) -> Result<object_store::aws::AmazonS3> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
    for (k, v) in &options.config {
        let key: AmazonS3ConfigKey = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|_| config_error(shown, format!("unknown S3 setting {k:?}")))?;
        b = b.with_config(key, v);
    }
    check_settings(
        shown,
        applied::<AmazonS3ConfigKey>("AWS_", &[], &[], options),
        |k| match k {
            AmazonS3ConfigKey::Endpoint
            | AmazonS3ConfigKey::S3Endpoint
            | AmazonS3ConfigKey::StsEndpoint
            | AmazonS3ConfigKey::MetadataEndpoint
            | AmazonS3ConfigKey::ContainerCredentialsFullUri => Check::Url,
            // replaced by the URL's bucket; PEM text, which spans lines
            AmazonS3ConfigKey::Bucket | AmazonS3ConfigKey::Client(ClientConfigKey::ProxyCaCertificate) => Check::Free,
            _ => Check::Text,
        },
    )?;
    if let Some(ep) = b.get_config_value(&AmazonS3ConfigKey::Endpoint) {
        if ep.starts_with("http://") {
            b = b.with_allow_http(true);
        }
    }
    b.with_retry(no_retry())
        .build()
        .map_err(|e| config_error(shown, retry::chain(&e)))
}

/// `gs://bucket/prefix`: `GOOGLE_*` variables (`GOOGLE_SERVICE_ACCOUNT`, ...).
fn build_gcs(url: &url::Url, shown: &str, options: &StoreOptions) -> Result<object_store::gcp::GoogleCloudStorage> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
    for (k, v) in &options.config {
        let key: GoogleConfigKey = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|_| config_error(shown, format!("unknown GCS setting {k:?}")))?;
        b = b.with_config(key, v);
    }
    // object_store's from_env also reads SERVICE_ACCOUNT, first
    let settings = applied::<GoogleConfigKey>(
        "GOOGLE_",
        &[("SERVICE_ACCOUNT", GoogleConfigKey::ServiceAccount)],
        &[],
        options,
    );
    for (key, s) in &settings {
        match key {
            GoogleConfigKey::ServiceAccountKey => check_gcs_key(shown, &s.from, &s.value)?,
            GoogleConfigKey::ServiceAccount => {
                // the key file is read here too (a regular file only: object_store waited for
                // ever on a pipe), for its `gcs_base_url`
                let text = crate::files::read(std::path::Path::new(&s.value))
                    .map_err(|e| config_error(shown, format!("{}: {e}", s.from)))?;
                check_gcs_key(
                    shown,
                    &format!("{} ({})", s.from, s.value),
                    &String::from_utf8_lossy(&text),
                )?;
            }
            _ => {}
        }
    }
    check_settings(shown, settings, |k| match k {
        GoogleConfigKey::BaseUrl => Check::Url,
        // JSON and PEM text, which may span lines (the key's gcs_base_url is checked above); a
        // bucket the URL replaces
        GoogleConfigKey::ServiceAccountKey
        | GoogleConfigKey::Bucket
        | GoogleConfigKey::Client(ClientConfigKey::ProxyCaCertificate) => Check::Free,
        _ => Check::Text,
    })?;
    b.with_retry(no_retry())
        .build()
        .map_err(|e| config_error(shown, retry::chain(&e)))
}

/// `az://container/prefix`: `AZURE_*` variables (`AZURE_STORAGE_ACCOUNT_NAME`, ...).
fn build_azure(url: &url::Url, shown: &str, options: &StoreOptions) -> Result<object_store::azure::MicrosoftAzure> {
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
    for (k, v) in &options.config {
        let key: AzureConfigKey = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|_| config_error(shown, format!("unknown Azure setting {k:?}")))?;
        b = b.with_config(key, v);
    }
    // object_store's from_env also reads IDENTITY_ENDPOINT, after the AZURE_* variables
    let settings = applied::<AzureConfigKey>(
        "AZURE_",
        &[],
        &[("IDENTITY_ENDPOINT", AzureConfigKey::MsiEndpoint)],
        options,
    );
    check_settings(shown, settings, |k| match k {
        AzureConfigKey::Endpoint
        | AzureConfigKey::AuthorityHost
        | AzureConfigKey::MsiEndpoint
        | AzureConfigKey::FabricTokenServiceUrl => Check::Url,
        // replaced by the URL's container; PEM text, which spans lines
        AzureConfigKey::ContainerName | AzureConfigKey::Client(ClientConfigKey::ProxyCaCertificate) => Check::Free,
        _ => Check::Text,
    })?;
    b.with_retry(no_retry())
        .build()
        .map_err(|e| config_error(shown, retry::chain(&e)))
}

/// `http(s)://host/path`: objects are `GET`/`HEAD`/`PUT` at `URL/name` (a plain web server reads;
/// writing needs WebDAV).
fn build_http(url: &url::Url, shown: &str, options: &StoreOptions) -> Result<object_store::http::HttpStore> {
    let mut b = object_store::http::HttpBuilder::new().with_url(url.as_str());
    for (k, v) in &options.config {
        let key: ClientConfigKey = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|_| config_error(shown, format!("unknown HTTP client setting {k:?}")))?;
        b = b.with_config(key, v);
    }
    if url.scheme() == "http" {
        b = b.with_config(ClientConfigKey::AllowHttp, "true");
    }
    b.with_retry(no_retry())
        .build()
        .map_err(|e| config_error(shown, retry::chain(&e)))
}

/// Runs `f` (object_store code), turning a panic in it into `Err` (`it panicked: ...`), the panic
/// hook silent for it ([`crate::contain::contained`]): a last line of defence behind the checks
/// of the settings, for what they do not foresee. A panic on one of the runtime's own threads is
/// not seen here (object_store builds and signs requests on the thread that waits for them). The
/// store and its runtime hold no state a failed request leaves half made.
fn contained<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    crate::contain::contained(f).map_err(|msg| format!("it panicked: {}", short(&msg)))
}

/// The body of `res` as it arrives, at most `limit` bytes; `Ok(Err(n))` when the response claims
/// or brings more (`n`: the bytes claimed, or seen so far). object_store's `bytes()` reserves the
/// length the response claims before reading: a server that claimed 100 GB made that allocation
/// fail and the process abort.
async fn body_within(res: GetResult, limit: u64) -> object_store::Result<std::result::Result<Vec<u8>, u64>> {
    let claimed = res.range.end.saturating_sub(res.range.start);
    if claimed > limit {
        return Ok(Err(claimed));
    }
    let mut out = Vec::with_capacity(claimed as usize);
    let mut body = res.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let seen = out.len() as u64 + chunk.len() as u64;
        if seen > limit {
            return Ok(Err(seen));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_object_store_is_one_error_naming_the_url() {
        let opts = StoreOptions {
            retry_for: Duration::from_secs(5),
            config: vec![
                ("aws_access_key_id".into(), "k".into()),
                ("aws_secret_access_key".into(), "s".into()),
                ("aws_region".into(), "us-east-1".into()),
                ("aws_endpoint".into(), "http://127.0.0.1:9".into()),
            ],
        };
        let r = Remote::open(&url::Url::parse("s3://bucket/p").unwrap(), &opts).unwrap();
        let t = std::time::Instant::now();
        let e = r
            .run("index.json", |_, _| async {
                panic!("request valid: InvalidUri") as object_store::Result<()>
            })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s3://bucket/p/index.json") && e.contains("it panicked: request valid: InvalidUri"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "not retried: {:?}", t.elapsed());
        // the store still works after it (the runtime survived the unwinding)
        let e = r.run("x", |_, _| async { Ok(7) }).unwrap();
        assert_eq!(e, 7);
    }
}
