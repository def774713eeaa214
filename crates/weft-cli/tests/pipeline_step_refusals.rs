//! `weft pipeline` refusing in one line: references to steps a step does not depend on, to no
//! step, or without a key, unknown output keys and kinds (before anything runs, or when the
//! step comes to run), and an `evaluate` step of a step that is not a train step, or of a
//! checkpoint `weft evaluate` refuses.

mod common;

use common::temp_dir;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn bad_references_and_kinds_fail_in_one_line() {
    let dir = temp_dir("pipeline-steps-bad");
    let runs = dir.join("runs");
    let cmd = |name: &str, argv: &str, deps: &str| {
        format!("[[step]]\nname = \"{name}\"\nkind = \"command\"\nargv = [{argv}]\ndepends_on = [{deps}]\n\n")
    };
    // refused before anything runs (`run` and `show`)
    let cases = [
        (
            [cmd("a", "\"true\"", ""), cmd("b", "\"echo\", \"${steps.a.exit}\"", "")].concat(),
            "step \"b\": `argv`: ${steps.a.exit}: step \"a\" is not a step it depends on",
        ),
        (
            [
                cmd("a", "\"true\"", ""),
                cmd("b", "\"echo\", \"${steps.zz.exit}\"", "\"a\""),
            ]
            .concat(),
            "${steps.zz.exit} names no step \"zz\"",
        ),
        (
            [cmd("a", "\"true\"", ""), cmd("b", "\"echo\", \"${steps.a}\"", "\"a\"")].concat(),
            "a reference is ${steps.STEP.KEY}",
        ),
        (
            format!(
                "{}[[step]]\nname = \"e\"\nkind = \"evaluate\"\nstep = \"a\"\ndepends_on = [\"a\"]\n",
                cmd("a", "\"true\"", "")
            ),
            "step \"e\": \"a\" is no train step",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let file = dir.join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        for verb in ["run", "show"] {
            let out = common::weft_with_store(&runs, &["pipeline", verb, file.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(want), "{want}: {err}");
        }
    }
    // a key the output does not have: the step fails when it would run, the step after it is
    // skipped, and the pipeline exits 1 naming both the reference and the output
    let file = dir.join("key.toml");
    let text = [
        cmd("a", "\"true\"", ""),
        cmd("b", "\"echo\", \"${steps.a.foo}\"", "\"a\""),
        cmd("c", "\"true\"", "\"b\""),
    ]
    .concat();
    std::fs::write(&file, text).unwrap();
    let out = common::weft_with_store(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "the steps [\"b\"] failed (b: ${steps.a.foo}: the output of step \"a\" (\"exit=0\") has no key \"foo\""
        ),
        "{err}"
    );
    assert!(
        stdout.contains("step a: finished") && stdout.contains("step c: skipped"),
        "{stdout}"
    );

    // a program hands values to later steps through WEFT_STEP_OUTPUT: key=value lines
    let file = dir.join("handed.toml");
    let text = [
        cmd(
            "a",
            "\"sh\", \"-c\", \"printf 'lr=0.003\\\\nnote=two words\\\\n\\\\nlr=0.01\\\\n' > \\\"$WEFT_STEP_OUTPUT\\\"\"",
            "",
        ),
        cmd("b", "\"sh\", \"-c\", \"echo $0 \\\"$1\\\" > got.txt\", \"${steps.a.lr}\", \"${steps.a.note}\"", "\"a\""),
    ]
    .concat();
    std::fs::write(&file, text).unwrap();
    let out = common::weft_ok_with_store(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    assert!(
        out.contains("step a: finished: exit=0 lr=0.01 note=\"two words\""),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("got.txt")).unwrap(),
        "0.01 two words\n"
    );
    // a line that is not key=value fails the step, naming the line
    let file = dir.join("badline.toml");
    std::fs::write(
        &file,
        cmd("a", "\"sh\", \"-c\", \"echo oops > \\\"$WEFT_STEP_OUTPUT\\\"\"", ""),
    )
    .unwrap();
    let out = common::weft_with_store(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("WEFT_STEP_OUTPUT line 1: \"oops\": not key=value"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn weft_evaluate_refuses_bad_input_in_one_line() {
    let dir = temp_dir("evaluate-bad");
    let config = common::write_tiny_mlp(&dir, "steps = 2\ncheckpoint_dir = \"ckpt\"\n");
    let c = config.to_str().unwrap();
    common::weft_ok(&["train", "--config", c]);
    let ckpt = dir.join("ckpt");
    let k = ckpt.to_str().unwrap();
    // a classifier: the loss and the accuracy of the checkpoint's step
    let out = common::weft_ok(&["evaluate", "--config", c, "--checkpoint", k, "--json"]);
    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["step"], 2, "{v}");
    assert!(
        v["val_loss"].as_f64().is_some() && v["val_accuracy"].as_f64().is_some(),
        "{v}"
    );
    for (args, want) in [
        (vec!["--checkpoint", dir.join("nope").to_str().unwrap()], "nope"),
        (
            vec!["--checkpoint", k, "--batches", "0"],
            "--batches: \"0\" is not a whole number >= 1",
        ),
        (vec!["--checkpoint", k, "--set", "model.hidden=[5]"], "hidden"),
        (
            vec!["--checkpoint", k, "--set", "data.val_fraction=0.0"],
            "no validation split",
        ),
    ] {
        let mut all = vec!["evaluate", "--config", c];
        all.extend(args);
        let out = common::weft(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{want}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
