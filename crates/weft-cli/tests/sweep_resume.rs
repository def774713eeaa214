//! `weft sweep --resume` with a changed sweep file: a changed search space, metric or base
//! config is refused in one line naming the change (the trials recorded were run with the old
//! one), more trials and more at once are taken; `weft sweep status` reads the trials with the
//! values they were drawn from after the file changed.

mod common;

use std::path::Path;
use std::process::Output;

use common::temp_dir;

fn weft_with(store: &Path, args: &[&str]) -> Output {
    common::weft_with_store(store, args)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A random sweep of the tiny mlp (`mlp.toml`, 2 steps) over `params`, `trials` trials.
fn sweep_file(params: &str, trials: u64, parallel: u64) -> String {
    format!(
        "[sweep]\nname = \"r\"\nbase = \"mlp.toml\"\nmetric = \"loss\"\nmethod = \"random\"\ntrials = {trials}\n\
         parallel = {parallel}\n[sweep.parameters]\n{params}\n"
    )
}

const LR: &str = "\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-3, max = 1e-1 }";
const HIDDEN: &str = "\"model.hidden\" = { values = [[8], [5]] }";

#[test]
fn a_resume_with_a_changed_sweep_is_refused_naming_the_change() {
    let dir = temp_dir("sweep-resume-changed");
    let store = dir.join("store");
    common::write_tiny_mlp(&dir, "steps = 2\nlog_every = 1\n");
    let file = dir.join("sweep.toml");
    let f = file.to_str().unwrap();
    std::fs::write(&file, sweep_file(&format!("{LR}\n{HIDDEN}"), 2, 1)).unwrap();
    let out = weft_with(&store, &["sweep", "--config", f]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches(": started (").count(), 2, "{stdout}");

    // each change a resume cannot take: refused in one line, nothing run
    let mlp = std::fs::read_to_string(dir.join("mlp.toml")).unwrap();
    let wd = "\"optim.weight_decay\" = { distribution = \"uniform\", min = 0.0, max = 0.2 }";
    let cases: Vec<(String, Option<String>, &str)> = vec![
        (
            sweep_file(&format!("{wd}\n{HIDDEN}"), 3, 1),
            None,
            "sweep.parameters.\"optim.lr\" is no longer swept (was {",
        ),
        (
            sweep_file(&format!("{}\n{HIDDEN}", LR.replace("1e-1", "0.5")), 3, 1),
            None,
            "sweep.parameters.\"optim.lr\" was {",
        ),
        (
            sweep_file(&format!("{LR}\n{HIDDEN}"), 1, 1),
            None,
            "sweep.trials is 1, below the 2 trials already recorded",
        ),
        (
            sweep_file(&format!("{LR}\n{HIDDEN}"), 3, 1).replace("metric = \"loss\"", "metric = \"grad_norm\""),
            None,
            "sweep.metric was \"loss\", now \"grad_norm\"",
        ),
        (
            sweep_file(&format!("{LR}\n{HIDDEN}"), 3, 1),
            Some(mlp.replace("batch_size = 4", "batch_size = 8")),
            "the base config's data.batch_size was \"4\", now \"8\"",
        ),
    ];
    for (sweep, config, want) in &cases {
        std::fs::write(&file, sweep).unwrap();
        std::fs::write(dir.join("mlp.toml"), config.as_deref().unwrap_or(&mlp)).unwrap();
        let out = weft_with(&store, &["sweep", "--config", f, "--resume"]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{want}: {stdout}\n{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("--resume: sweep \"r\" was started with another definition: ") && stderr.contains(want),
            "{want}: {stderr}"
        );
        assert!(stderr.contains("give the sweep another name"), "{stderr}");
        assert!(!stdout.contains("started"), "{stdout}");
    }
    std::fs::write(dir.join("mlp.toml"), &mlp).unwrap();

    // more trials, more at once: the resume runs trial 2 only
    std::fs::write(&file, sweep_file(&format!("{LR}\n{HIDDEN}"), 3, 2)).unwrap();
    let out = weft_with(&store, &["sweep", "--config", f, "--resume"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches(": started (").count(), 1, "{stdout}");
    assert!(stdout.contains("trial 2: started ("), "{stdout}");

    // status after the listed values changed: the values as drawn, typed, and a note why
    std::fs::write(
        &file,
        sweep_file(&format!("{LR}\n\"model.hidden\" = {{ values = [[7]] }}"), 3, 2),
    )
    .unwrap();
    let out = weft_with(&store, &["sweep", "status", "--json", "--config", f]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("was started with another definition (sweep.parameters.\"model.hidden\" was"),
        "{stderr}"
    );
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for t in status["trials"].as_array().unwrap() {
        let hidden = &t["params"]["model.hidden"];
        assert!(
            hidden == &serde_json::json!([8]) || hidden == &serde_json::json!([5]),
            "{t}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
