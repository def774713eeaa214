//! `weft graph dump` follows `[parallel]` as a run does: a layout whose run is eager (tensor
//! or pipeline parallelism, ZeRO stage 3) prints one line with the reason the run logs, exit 0
//! (`--format dot`: that line is the error, exit 1); data parallelism and ZeRO stages 1 and 2
//! print the micro-batch graph one rank captures, at its rows, as a 2-rank run captures it. (It
//! printed the one-process whole step for all of them.)

mod common;

use std::process::Stdio;

use common::{fails_with, fixture_config, temp_dir, train_fixture, weft_command, weft_ok, SMALL_GPT};

fn sets(items: &[&str]) -> Vec<String> {
    items
        .iter()
        .flat_map(|s| ["--set".to_string(), s.to_string()])
        .collect()
}

/// `weft graph dump --config <the gpt fixture> --set ...`: its stdout.
fn dump(layout: &[&str]) -> String {
    let c = fixture_config("gpt_adamw");
    let mut args = vec![
        "graph".to_string(),
        "dump".into(),
        "--config".into(),
        c.to_str().unwrap().into(),
    ];
    args.extend(sets(layout));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    String::from_utf8(weft_ok(&args).stdout).unwrap()
}

/// Trains the gpt fixture on 2 ranks for one step with compile on: its stderr.
fn run_on_2_ranks(tag: &str, layout: &[&str]) -> String {
    let out = temp_dir(&format!("dump-layouts-{tag}"));
    let mut all = vec!["train.compile=true".to_string(), "train.steps=1".to_string()];
    all.extend(layout.iter().map(|s| s.to_string()));
    let run = train_fixture("gpt_adamw", 2, &out.join("m.jsonl"), &[], &all);
    let _ = std::fs::remove_dir_all(&out);
    String::from_utf8_lossy(&run.stderr).into_owned()
}

#[test]
fn layouts_that_run_eagerly_say_why_in_the_runs_words() {
    const LINE: &str = "train.compile: running eagerly: ";
    for (tag, layout) in [
        ("tp2", ["parallel.tp=2"].as_slice()),
        ("pp2", ["parallel.pp=2"].as_slice()),
        ("zero3", ["parallel.dp=2", "parallel.zero=3"].as_slice()),
    ] {
        let text = dump(layout);
        assert_eq!(text.lines().count(), 1, "{tag}: {text}");
        let why = text
            .trim_end()
            .strip_prefix(LINE)
            .and_then(|l| l.strip_suffix("; nothing is captured"))
            .unwrap_or_else(|| panic!("{tag}: {text}"));
        // the reason a run of the layout logs
        let err = run_on_2_ranks(tag, layout);
        assert!(
            err.contains(&format!("weft: {LINE}{why}\n")),
            "{tag}: {why:?} in:\n{err}"
        );
        assert!(!err.contains("captured the"), "{tag}: {err}");
        // no graph to draw
        let c = fixture_config("gpt_adamw");
        let mut args = vec!["graph", "dump", "--config", c.to_str().unwrap(), "--format", "dot"];
        for s in layout {
            args.extend(["--set", s]);
        }
        fails_with(&args, &[why, "no graph to draw"]);
    }
}

/// The graph's `captured N nodes; folded F, merged M, removed R` line, as the nodes a run's
/// `captured the step: K nodes` line counts (K = N - F - M - R).
fn nodes_kept(text: &str) -> usize {
    let line = text.lines().find(|l| l.starts_with("captured ")).unwrap();
    let n: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(4)
        .map(|s| s.parse().unwrap())
        .collect();
    n[0] - n[1] - n[2] - n[3]
}

#[test]
fn data_parallel_dumps_print_one_ranks_micro_batch_graph_at_its_rows() {
    let single = dump(&[]);
    assert!(single.starts_with("the whole step") && single.contains("input 0 : i64[4, 16]"));
    for (zero, layout) in [
        (0, ["parallel.dp=2"].as_slice()),
        (1, ["parallel.dp=2", "parallel.zero=1"].as_slice()),
        (2, ["parallel.dp=2", "parallel.zero=2"].as_slice()),
    ] {
        let text = dump(layout);
        let title = text.lines().next().unwrap();
        assert!(
            title.starts_with("one rank's step of dp = 2 ranks") && title.contains("on its 2 of the batch's 4 rows"),
            "{title}"
        );
        assert_eq!(title.contains(&format!("ZeRO stage {zero}")), zero > 0, "{title}");
        // the fixture's batches file holds 4 rows a step: 2 a rank
        assert!(text.contains("input 0 : i64[2, 16]"), "zero {zero}: {text}");
        assert!(
            !text.contains("CustomOp"),
            "zero {zero}: no update in a rank's graph: {text}"
        );
        assert_eq!(text.matches("memory plan:").count(), 1, "{text}");
    }
    // what a 2-rank run captures
    let text = dump(&["parallel.dp=2"]);
    let err = run_on_2_ranks("dp2", &["parallel.dp=2"]);
    let want = format!("captured the step: {} nodes", nodes_kept(&text));
    assert!(err.contains(&want), "{want:?} in:\n{err}");
    assert!(!err.contains("whole step"), "{err}");

    // text data: `data.batch_size / dp` rows; the scratch file of a batches file is gone
    let mut args = vec!["graph", "dump"];
    args.extend(SMALL_GPT);
    args.extend(["--set", "parallel.dp=2"]);
    let text = String::from_utf8(weft_ok(&args).stdout).unwrap();
    assert!(
        text.contains("on its 4 of the batch's 8 rows") && text.contains("input 0 : i64[4, 32]"),
        "{text}"
    );
    let c = fixture_config("gpt_adamw");
    let child = weft_command(&[
        "graph",
        "dump",
        "--config",
        c.to_str().unwrap(),
        "--set",
        "parallel.dp=2",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let prefix = format!("weft-graph-dump-{}-", child.id());
    assert!(child.wait_with_output().unwrap().status.success());
    let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // a batch that does not split
    fails_with(
        &[
            "graph",
            "dump",
            "--config",
            c.to_str().unwrap(),
            "--set",
            "parallel.dp=3",
        ],
        &["4 rows does not split evenly across dp = 3"],
    );
}

/// ZeRO with `dp` unset (the job's ranks): the dump is one process's step, and says so and what
/// a rank of a real job does.
#[test]
fn zero_with_dp_unset_is_dumped_as_one_process_with_a_note() {
    let c = fixture_config("gpt_adamw");
    for (zero, what) in [
        ("3", "the run does not capture its step"),
        ("2", "a rank captures its micro-batch's step"),
    ] {
        let set = format!("parallel.zero={zero}");
        let out = weft_ok(&["graph", "dump", "--config", c.to_str().unwrap(), "--set", &set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("parallel.dp is unset, so it is the job's ranks") && err.contains(what),
            "{err}"
        );
    }
}
