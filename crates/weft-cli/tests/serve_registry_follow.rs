//! `weft serve --registry` against versions that do not load or whose label is taken, through
//! the binary and a real HTTP client: a promoted version whose folder is missing is reported once
//! (again when promoted again) and loaded once the folder is back; a production version that
//! does not load at start leaves the others serving, named by the registry's model, version and
//! path, and keeps the server unready until it loads; a version served from elsewhere (`--model`,
//! `POST /models`) is neither taken for the registry's version of the same label nor unregistered
//! by a later promotion, and the registry's production version is the default of its name.

mod common;
#[allow(dead_code)]
#[path = "serve/support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::{free_port, temp_dir, wait_for, weft_command, weft_ok_with_store};
use reqwest::blocking::Client;
use reqwest::Method;
use serde_json::Value;
use support::{body_json, infer_body, train_mlp, TOKEN};

/// A running `weft serve --registry`, its stderr in a file; killed when dropped.
struct Follower {
    child: Child,
    base: String,
    management: String,
    log: PathBuf,
    client: Client,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Follower {
    /// Starts `weft serve --registry runs --registry-poll-ms 100` with `args` on free loopback
    /// ports (stderr to `dir/serve.log`) and waits until it answers.
    fn start(dir: &Path, runs: &Path, args: &[&str]) -> Follower {
        let (port, mport, xport) = (
            free_port().to_string(),
            free_port().to_string(),
            free_port().to_string(),
        );
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let log = dir.join("serve.log");
        #[rustfmt::skip]
        let mut all = vec!["serve", "--registry", runs.to_str().unwrap(), "--registry-poll-ms", "100",
            "--port", &port, "--management-port", &mport, "--metrics-port", &xport,
            "--token-file", token.to_str().unwrap()];
        all.extend(args);
        let child = weft_command(&all)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let client = Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .unwrap();
        let mut s = Follower {
            child,
            base: format!("http://127.0.0.1:{port}"),
            management: format!("http://127.0.0.1:{mport}"),
            log,
            client,
        };
        let url = format!("{}/v2/health/live", s.base);
        let up = wait_for(60, || s.client.get(&url).send().is_ok_and(|r| r.status() == 200));
        assert!(
            up,
            "weft serve answered no health check: {:?} {}",
            s.child.try_wait(),
            s.log()
        );
        s
    }

    /// What the server said on stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `(status, version that answered)` of an infer request to `model` (`NAME` or
    /// `NAME/versions/V`).
    fn infer(&self, model: &str) -> (u16, String) {
        let r = self
            .client
            .post(format!("{}/v2/models/{model}/infer", self.base))
            .body(infer_body(&[[0.3, 0.6]]))
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, body_json(r)["model_version"].as_str().unwrap_or("").to_string())
    }

    /// `GET /v2/health/ready`: `(status, body)`.
    fn ready(&self) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}/v2/health/ready", self.base))
            .send()
            .unwrap();
        (r.status().as_u16(), body_json(r))
    }

    /// A management call: `(status, body)`.
    fn manage(&self, method: Method, path: &str) -> (u16, Value) {
        let r = self
            .client
            .request(method, format!("{}{path}", self.management))
            .bearer_auth(TOKEN)
            .send()
            .unwrap();
        (r.status().as_u16(), body_json(r))
    }

    /// Every served version of `name`: `(version, modelUrl, isDefault)`.
    fn versions(&self, name: &str) -> Vec<(String, String, bool)> {
        let (status, all) = self.manage(Method::GET, &format!("/models/{name}/all"));
        assert_eq!(status, 200, "{all}");
        all.as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["modelVersion"].as_str().unwrap().to_string(),
                    v["modelUrl"].as_str().unwrap().to_string(),
                    v["isDefault"].as_bool().unwrap(),
                )
            })
            .collect()
    }
}

/// `weft models ARGS` on the run store `runs`.
fn models(runs: &Path, args: &[&str]) -> String {
    let mut all = vec!["models"];
    all.extend(args);
    weft_ok_with_store(runs, &all)
}

/// A tiny mlp checkpoint trained into `dir/NAME/mlp`; its checkpoint directory.
fn checkpoint(dir: &Path, name: &str) -> PathBuf {
    let store = dir.join(name);
    std::fs::create_dir_all(&store).unwrap();
    train_mlp(&store)
}

#[test]
fn a_promoted_version_that_failed_to_load_is_tried_again_and_warned_about_once_per_promotion() {
    let dir = temp_dir("registry-follow-retry");
    let runs = dir.join("runs");
    let one = checkpoint(&dir, "one");
    let two = checkpoint(&dir, "two");
    models(&runs, &["register", one.to_str().unwrap(), "--name", "m"]);
    models(&runs, &["promote", "m", "1", "--stage", "production"]);
    models(&runs, &["register", two.to_str().unwrap(), "--name", "m"]);
    // version 2's checkpoint is still being copied when it is promoted
    let copying = dir.join("two").join("mlp.copying");
    std::fs::rename(&two, &copying).unwrap();
    let s = Follower::start(&dir, &runs, &[]);
    assert_eq!(s.infer("m"), (200, "1".to_string()));

    models(&runs, &["promote", "m", "2", "--stage", "production"]);
    let warning = "warning: model m version 2 of the registry (";
    assert!(wait_for(20, || s.log().contains(warning)), "{}", s.log());
    // many reads of the registry later: said once, and version 1 answers
    std::thread::sleep(std::time::Duration::from_millis(800));
    let log = s.log();
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    let line = log.lines().find(|l| l.contains(warning)).unwrap();
    assert!(
        line.contains(&two.display().to_string()) && line.contains("version 1 of the registry goes on answering"),
        "{line}"
    );
    assert!(!line.contains("--model-store"), "{line}");
    assert_eq!(s.infer("m"), (200, "1".to_string()));

    // promoted again, still missing: tried at once and said again
    models(&runs, &["promote", "m", "2", "--stage", "production"]);
    assert!(wait_for(20, || s.log().matches(warning).count() == 2), "{}", s.log());

    // the copy has finished: loaded (before the next 5 s retry: its folder changed)
    std::fs::rename(&copying, &two).unwrap();
    let moved = wait_for(4, || s.infer("m") == (200, "2".to_string()));
    assert!(moved, "version 2 was not loaded once its folder was back: {}", s.log());
    assert!(
        s.log().contains("loaded model m version 2 (mlp) from the registry (")
            && s.log().contains(") on a later try: it is the default now"),
        "{}",
        s.log()
    );
    assert!(wait_for(20, || s.infer("m/versions/1").0 == 404), "{}", s.log());
    assert_eq!(s.log().matches(warning).count(), 2, "{}", s.log());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_production_version_that_does_not_load_at_start_leaves_the_others_serving() {
    let dir = temp_dir("registry-follow-start");
    let runs = dir.join("runs");
    let good = checkpoint(&dir, "good");
    let old = checkpoint(&dir, "old");
    models(&runs, &["register", good.to_str().unwrap(), "--name", "good"]);
    models(&runs, &["promote", "good", "1", "--stage", "production"]);
    models(&runs, &["register", old.to_str().unwrap(), "--name", "other"]);
    models(&runs, &["promote", "other", "1", "--stage", "production"]);
    // an old run's checkpoints cleaned up
    let away = dir.join("old").join("away");
    std::fs::rename(&old, &away).unwrap();
    // before, the server did not start (exit 1, naming a --model-store never given)
    let s = Follower::start(&dir, &runs, &[]);
    assert_eq!(s.infer("good"), (200, "1".to_string()));
    assert_eq!(s.infer("other").0, 404);
    let (status, ready) = s.ready();
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["failed"][0]["model"], "other", "{ready}");
    assert_eq!(ready["failed"][0]["version"], "1", "{ready}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = s.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("model other version 1")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].starts_with("weft serve: error: model other version 1 of the registry (")
            && lines[0].contains(&old.display().to_string())
            && lines[0].contains("No such file or directory")
            && lines[0].contains("serving the other models"),
        "{}",
        lines[0]
    );
    assert!(!log.contains("--model-store"), "{log}");

    // its checkpoint back: loaded by a retry, and the server is ready
    std::fs::rename(&away, &old).unwrap();
    assert!(wait_for(20, || s.ready().0 == 200), "{}", s.log());
    assert_eq!(s.infer("other"), (200, "1".to_string()));
    assert_eq!(s.infer("good"), (200, "1".to_string()));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_version_served_from_elsewhere_is_neither_taken_for_the_registrys_nor_unregistered() {
    let dir = temp_dir("registry-follow-others");
    let runs = dir.join("runs");
    let reg = checkpoint(&dir, "reg");
    // the model store of --model and POST /models: its checkpoint `mlp`
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    train_mlp(&store);
    let r = |args: &[&str]| models(&runs, args);
    let reg_path = reg.to_str().unwrap();
    for name in ["m", "n"] {
        r(&["register", reg_path, "--name", name]);
        r(&["promote", name, "1", "--stage", "production"]);
    }
    #[rustfmt::skip]
    let s = Follower::start(&dir, &runs, &["--model-store", store.to_str().unwrap(),
        "--model", "m=mlp:2", "--model", "n=mlp:1"]);
    let from_store = |v: &str| (v.to_string(), "mlp".to_string());
    let url_of = |name: &str, v: &str| -> (String, String) {
        let all = s.versions(name);
        let found = all
            .iter()
            .find(|(x, _, _)| x == v)
            .unwrap_or_else(|| panic!("{name} {v}: {all:?}"));
        (found.0.clone(), found.1.clone())
    };
    // at start: the registry's production version is the default, the --model version beside it
    assert_eq!(s.infer("m"), (200, "1".to_string()));
    assert_eq!(url_of("m", "2"), from_store("2"));
    assert_ne!(url_of("m", "1").1, "mlp");
    // n's registry version 1 has the label of a --model: not loaded, the --model's stays
    assert_eq!(s.versions("n"), [("1".to_string(), "mlp".to_string(), true)]);
    let log = s.log();
    assert!(
        log.contains("warning: model n version 1 of the registry (")
            && log.contains("is production, but model n version 1 is already served from mlp"),
        "{log}"
    );

    // registry version 2 of m promoted while --model m=mlp:2 is served: not adopted
    r(&["register", reg_path, "--name", "m"]);
    r(&["promote", "m", "2", "--stage", "production"]);
    let conflict = "is production, but model m version 2 is already served from mlp";
    assert!(wait_for(20, || s.log().contains(conflict)), "{}", s.log());
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(s.log().matches(conflict).count(), 1, "{}", s.log());
    assert_eq!(s.infer("m"), (200, "1".to_string()));
    assert_eq!(url_of("m", "2"), from_store("2"));

    // the next promotion replaces the registry's version 1 only
    r(&["register", reg_path, "--name", "m"]);
    r(&["promote", "m", "3", "--stage", "production"]);
    assert!(wait_for(20, || s.infer("m") == (200, "3".to_string())), "{}", s.log());
    assert!(wait_for(20, || s.versions("m").len() == 2), "{:?}", s.versions("m"));
    assert_eq!(url_of("m", "2"), from_store("2"));
    assert_ne!(url_of("m", "3").1, "mlp");

    // a version registered through the management API is left alone as well ...
    let (status, answer) = s.manage(Method::POST, "/models?url=mlp&model_name=m&version=4");
    assert_eq!(status, 200, "{answer}");
    r(&["register", reg_path, "--name", "m"]);
    r(&["promote", "m", "4", "--stage", "production"]);
    let conflict = "is production, but model m version 4 is already served from mlp";
    assert!(wait_for(20, || s.log().contains(conflict)), "{}", s.log());
    assert_eq!(s.infer("m"), (200, "3".to_string()));
    // ... until it is unregistered: then the registry's version 4 is loaded in its place
    let (status, answer) = s.manage(Method::DELETE, "/models/m/4");
    assert_eq!(status, 200, "{answer}");
    assert!(wait_for(20, || s.infer("m") == (200, "4".to_string())), "{}", s.log());
    assert_ne!(url_of("m", "4").1, "mlp");
    assert!(wait_for(20, || s.versions("m").len() == 2), "{:?}", s.versions("m"));
    assert_eq!(url_of("m", "2"), from_store("2"));

    // the follower's own version unregistered through the management API is its own no more:
    // another checkpoint registered under its label is warned about, not taken for the
    // registry's (the follower held it, and took the newcomer silently)
    let (status, answer) = s.manage(Method::PUT, "/models/m/2/set-default");
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.manage(Method::DELETE, "/models/m/4");
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.manage(Method::POST, "/models?url=mlp&model_name=m&version=4");
    if status == 200 {
        assert!(wait_for(20, || s.log().matches(conflict).count() == 2), "{}", s.log());
        assert_eq!(url_of("m", "4"), from_store("4"));
    } else {
        // the follower's next read came first (100 ms polls): the label was free, so it
        // loaded the registry's version 4 again, which the old follower never did
        assert_eq!(status, 409, "{answer}");
        assert_ne!(url_of("m", "4").1, "mlp");
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
