//! Kernel variants chosen per shape (autotuning). Three CPU kernels have variants that no fixed
//! rule picks best for every shape and machine:
//!
//! - **gemm** (every matrix product: matmul, linear, the convolutions' products): how
//!   [`crate::cpu::matmul::gemm_parallel_then`] spreads a product over the threads: the
//!   heuristic (blocks of the longer side, at least 16 rows or columns each), one thread,
//!   blocks of rows, or blocks of columns;
//! - **conv2d** (the forward of a 2-D convolution): its algorithm (the shifted products of a
//!   padded copy, for stride 1, or im2col then one product) and whether images run in parallel
//!   or one after the other with each product split across the threads;
//! - **attention** (the fused attention's forward and backward): the queries per tile (the rule:
//!   16 with the causal mask, 64 without; or 16, 32 or 64).
//!
//! By default (`heuristic`) the kernels decide by their rules. A search ([`crate::graph`]'s
//! tuning replay, `[train] autotune = "search"`) times each variant of each kernel call of a
//! captured graph and records the fastest per key (the kernel, its shapes, the dtype and the
//! thread count); the kernels then look the key up. The choices are kept in a file per machine
//! under [`cache_dir`] so that the next run starts with them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// A kernel with variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Gemm,
    Conv2d,
    Attention,
}

impl Kernel {
    /// Every kernel with variants.
    pub const ALL: [Kernel; 3] = [Kernel::Gemm, Kernel::Conv2d, Kernel::Attention];

    /// The variants' names; variant 0 is the kernel's own rule.
    pub fn variants(self) -> &'static [&'static str] {
        match self {
            Kernel::Gemm => &["heuristic", "one-thread", "split-rows", "split-columns"],
            Kernel::Conv2d => &[
                "heuristic",
                "shifted-images-parallel",
                "shifted-gemm-parallel",
                "im2col-images-parallel",
                "im2col-gemm-parallel",
            ],
            Kernel::Attention => &["heuristic", "tile-16", "tile-32", "tile-64"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Gemm => "gemm",
            Kernel::Conv2d => "conv2d",
            Kernel::Attention => "attention",
        }
    }

    fn parse(name: &str) -> Option<Kernel> {
        match name {
            "gemm" => Some(Kernel::Gemm),
            "conv2d" => Some(Kernel::Conv2d),
            "attention" => Some(Kernel::Attention),
            _ => None,
        }
    }
}

/// The variant the kernel's own rule stands for.
pub const HEURISTIC: u8 = 0;

static CHOSEN: RwLock<Option<HashMap<String, u8>>> = RwLock::new(None);
/// Whether [`CHOSEN`] holds anything (so that untuned runs build no keys).
static ANY: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A variant forced on this thread (while a search times it).
    static FORCE: Cell<Option<(Kernel, u8)>> = const { Cell::new(None) };
    /// The keys looked up on this thread while a search watches.
    static SEEN: RefCell<Option<Vec<(Kernel, String)>>> = const { RefCell::new(None) };
    /// What the kernels did, while a search watches (see [`plan`]).
    static PLANS: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Called by a kernel with variants after choosing: `what()` describes what it will do (e.g.
/// "2 blocks of rows"), so that a search can tell variants that come to the same plan at a
/// shape apart from those that differ.
pub(crate) fn plan(what: impl FnOnce() -> String) {
    PLANS.with(|p| {
        if let Some(plans) = p.borrow_mut().as_mut() {
            plans.push(what());
        }
    });
}

/// Runs `f` and returns the plans the kernels it ran described (see [`plan`]).
pub fn planned<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    let before = PLANS.with(|p| p.replace(Some(Vec::new())));
    let out = f();
    let plans = PLANS.with(|p| p.replace(before)).unwrap_or_default();
    (out, plans)
}

/// The variant of `kernel` to run for the call `key()` describes: a forced one, else the one
/// recorded for the key, else [`HEURISTIC`]. Builds the key only when something was recorded
/// or a search runs.
pub(crate) fn pick(kernel: Kernel, key: impl FnOnce() -> String) -> u8 {
    let forced = FORCE.with(|f| f.get());
    let watching = SEEN.with(|s| s.borrow().is_some());
    if forced.is_none() && !watching && !ANY.load(Ordering::Relaxed) {
        return HEURISTIC;
    }
    let key = format!("{} {}", kernel.name(), key());
    if watching {
        SEEN.with(|s| {
            if let Some(seen) = s.borrow_mut().as_mut() {
                if !seen.iter().any(|(_, k)| *k == key) {
                    seen.push((kernel, key.clone()));
                }
            }
        });
    }
    if let Some((k, v)) = forced {
        if k == kernel {
            return v;
        }
    }
    chosen(&key).unwrap_or(HEURISTIC)
}

/// The variant recorded for `key`, if any.
pub fn chosen(key: &str) -> Option<u8> {
    CHOSEN.read().ok()?.as_ref()?.get(key).copied()
}

/// Records `variant` for `key` (a key as the kernels build them, starting with the kernel's
/// name).
pub fn record(key: &str, variant: u8) {
    if let Ok(mut table) = CHOSEN.write() {
        table.get_or_insert_with(HashMap::new).insert(key.to_string(), variant);
        // a choice of the rule changes nothing: untuned calls need not look keys up for it
        if variant != HEURISTIC {
            ANY.store(true, Ordering::Relaxed);
        }
    }
}

/// Forgets every recorded choice (the kernels' rules decide again).
pub fn clear() {
    if let Ok(mut table) = CHOSEN.write() {
        *table = None;
        ANY.store(false, Ordering::Relaxed);
    }
}

/// Runs `f` with `variant` of `kernel` forced on this thread (what a search does; tests use it
/// to check that every variant computes the same).
pub fn forced<R>(kernel: Kernel, variant: u8, f: impl FnOnce() -> R) -> R {
    /// Puts the earlier forced variant back, also when `f` panics.
    struct Restore(Option<(Kernel, u8)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FORCE.with(|c| c.replace(Some((kernel, variant)))));
    f()
}

/// Runs `f` and returns the keys of the kernel calls it made on this thread.
pub(crate) fn watched<R>(f: impl FnOnce() -> R) -> (R, Vec<(Kernel, String)>) {
    let before = SEEN.with(|s| s.replace(Some(Vec::new())));
    let out = f();
    let seen = SEEN.with(|s| s.replace(before)).unwrap_or_default();
    (out, seen)
}

/// The folder weft keeps caches in: `$WEFT_CACHE_DIR`, else `$XDG_CACHE_HOME/weft`, else
/// `$HOME/.cache/weft`, else a folder under the system's temporary folder.
pub fn cache_dir() -> PathBuf {
    let from = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(d) = from("WEFT_CACHE_DIR") {
        return d;
    }
    if let Some(x) = from("XDG_CACHE_HOME") {
        return x.join("weft");
    }
    if let Some(h) = from("HOME") {
        return h.join(".cache").join("weft");
    }
    std::env::temp_dir().join("weft-cache")
}

/// The file format's name; a file of another is ignored (with a warning) and rewritten.
const FORMAT: &str = "weft-autotune-2";

/// What this machine is, for the cache: the CPU's model name and the threads weft uses.
pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{model}; {} threads", crate::cpu::threads::num_threads())
}

/// This machine's cache file: `autotune-<hash of machine()>.json` in [`cache_dir`].
pub fn cache_file() -> PathBuf {
    // FNV-1a of the machine's description
    let h = machine().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    cache_dir().join(format!("autotune-{h:016x}.json"))
}

/// The longest autotuning cache file read, in bytes (a choice takes about 80).
pub const MAX_CACHE_FILE: u64 = 16 << 20;

/// Reads a file of weft's cache folder ([`cache_dir`]) of at most `cap` bytes: `Ok(None)` when
/// there is none; an error saying why when it cannot be used: not a regular file (a FIFO would
/// wait for a writer for ever, a device such as `/dev/zero` never end; a symlink is followed
/// and what it leads to must be a regular file), longer than `cap`, or unreadable. A FIFO is
/// never opened in blocking mode, and at most `cap + 1` bytes are read.
pub fn read_cache_file(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, String> {
    crate::io::regular::read_capped(path, cap)
}

/// Reads this machine's cache file into the recorded choices. Returns how many were read, or
/// (when the file is corrupt, of another format, not a regular file or too long: see
/// [`read_cache_file`]) a warning saying it is ignored; a missing file is no choices and no
/// warning.
pub fn load_cache() -> (usize, Option<String>) {
    let path = cache_file();
    let ignored = |why: String| {
        (
            0,
            Some(format!(
                "{}: {why}; it is ignored and will be rewritten",
                path.display()
            )),
        )
    };
    let bytes = match read_cache_file(&path, MAX_CACHE_FILE) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return (0, None),
        Err(e) => {
            // the path leads the message already
            let why = e
                .strip_prefix(&format!("{}: ", path.display()))
                .unwrap_or(&e)
                .to_string();
            return ignored(why);
        }
    };
    let v: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return ignored(format!("not JSON ({e})")),
    };
    if v["format"] != FORMAT {
        return ignored(format!("format {} is not {FORMAT:?}", v["format"]));
    }
    let Some(entries) = v["choices"].as_object() else {
        return ignored("no \"choices\" object".into());
    };
    let mut read = Vec::with_capacity(entries.len());
    for (key, name) in entries {
        match parse_choice(key, name) {
            Some(variant) => read.push((key, variant)),
            None => return ignored(format!("choice {key:?} = {name} names no variant")),
        }
    }
    let n = read.len();
    for (key, variant) in read {
        record(key, variant);
    }
    (n, None)
}

/// The variant `name` names for `key` (whose first word is its kernel).
fn parse_choice(key: &str, name: &serde_json::Value) -> Option<u8> {
    let kernel = key.split(' ').next().and_then(Kernel::parse)?;
    kernel
        .variants()
        .iter()
        .position(|v| Some(*v) == name.as_str())
        .map(|v| v as u8)
}

/// Whether this process read the machine's cache file yet (or chose not to).
static FILE_READ: AtomicBool = AtomicBool::new(false);

/// [`load_cache`] the first time it is called in the process (or after [`ignore_cache_file`]:
/// never); `(0, None)` after that.
pub fn load_cache_once() -> (usize, Option<String>) {
    if FILE_READ.swap(true, Ordering::Relaxed) {
        return (0, None);
    }
    load_cache()
}

/// Makes this process's searches time every kernel call again rather than start from the
/// cache file's choices (which they then replace).
pub fn ignore_cache_file() {
    FILE_READ.store(true, Ordering::Relaxed);
}

/// Writes every recorded choice to this machine's cache file (atomically), keeping the choices
/// the file holds for other keys. Whatever is at the path and is not a regular file (a FIFO, a
/// device, a symlink, which would be written through) is replaced by one.
pub fn save_cache() -> crate::Result<PathBuf> {
    let path = cache_file();
    // what the file holds now (another run may have written choices of other shapes), then
    // this process's choices over it
    let mut choices = serde_json::Map::new();
    if let Some(on_file) = read_cache_file(&path, MAX_CACHE_FILE)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter(|v| v["format"] == FORMAT)
    {
        if let Some(entries) = on_file["choices"].as_object() {
            for (key, name) in entries {
                if parse_choice(key, name).is_some() {
                    choices.insert(key.clone(), name.clone());
                }
            }
        }
    }
    if let Ok(table) = CHOSEN.read() {
        for (key, &v) in table.iter().flatten() {
            let kernel = key.split(' ').next().and_then(Kernel::parse);
            if let Some(name) = kernel.and_then(|k| k.variants().get(usize::from(v))) {
                choices.insert(key.clone(), serde_json::Value::from(*name));
            }
        }
    }
    let doc = serde_json::json!({ "format": FORMAT, "machine": machine(), "choices": choices });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::error::invalid("autotune", format!("{}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    // not through a symlink, nor into a FIFO or device (which `atomic::write` refuses): the
    // entry itself goes and a regular file takes its place (a folder there stays, an error)
    if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        std::fs::remove_file(&path)
            .map_err(|e| crate::error::invalid("autotune", format!("{}: {e}", path.display())))?;
    }
    crate::io::atomic::write(&path, text.as_bytes())?;
    Ok(path)
}
