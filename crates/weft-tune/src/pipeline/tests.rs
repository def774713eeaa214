//! Pipeline files: order, refusals, `from_sweep` checks, cache keys.

use super::*;

fn load(name: &str, text: &str) -> Result<Pipeline> {
    let dir = std::env::temp_dir().join(format!("weft-tune-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    Pipeline::load(&file)
}

#[test]
fn steps_are_ordered_and_bad_files_refused() {
    let p = load(
        "ok",
        "[[step]]\nname = \"gate\"\nkind = \"condition\"\nmetric = \"loss\"\nrun = \"t\"\nop = \"<\"\nvalue = 9\n\
         depends_on = [\"t\"]\n\
         [[step]]\nname = \"t\"\nkind = \"command\"\nargv = [\"true\"]\n",
    );
    assert!(p.unwrap_err().to_string().contains("no train step"));
    let p = load(
        "ok2",
        "[[step]]\nname = \"b\"\nkind = \"command\"\nargv = [\"true\"]\ndepends_on = [\"a\"]\n\
         [[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"true\"]\n",
    )
    .unwrap();
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let cases = [
        ("[[step]]\nname = \"a\"\nkind = \"teleport\"\n", "unknown kind"),
        ("[[step]]\nname = \"a\"\nkind = \"deploy\"\n", "give either `step`"),
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"x\"]\ndepends_on = [\"z\"]\n",
            "no step",
        ),
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"x\"]\ndepends_on = [\"b\"]\n\
             [[step]]\nname = \"b\"\nkind = \"command\"\nargv = [\"x\"]\ndepends_on = [\"a\"]\n",
            "cycle",
        ),
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"x\"]\nfoo = 1\n",
            "unknown key",
        ),
    ];
    for (text, want) in cases {
        let e = load("bad", text).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{e}");
    }
}

const SWEEP: &str = "[[step]]\nname = \"tune\"\nkind = \"sweep\"\nconfig = \"s.toml\"\n";

#[test]
fn from_sweep_must_name_a_sweep_step_it_depends_on() {
    let train = |from: &str, deps: &str| {
        format!(
            "[[step]]\nname = \"long\"\nkind = \"train\"\nconfig = \"r.toml\"\nfrom_sweep = {from}\n\
             depends_on = {deps}\n"
        )
    };
    let p = load("hand", &format!("{SWEEP}{}", train("\"tune\"", "[\"tune\"]"))).unwrap();
    let Action::Train { from_sweep, .. } = &p.step("long").unwrap().action else {
        panic!()
    };
    assert_eq!(from_sweep.as_deref(), Some("tune"));
    let cmd = "[[step]]\nname = \"c\"\nkind = \"command\"\nargv = [\"true\"]\n";
    let cases = [
        (
            format!("{SWEEP}{}", train("\"zz\"", "[\"tune\"]")),
            "step \"long\" uses \"zz\", which is no step",
        ),
        (
            format!("{cmd}{}", train("\"c\"", "[\"c\"]")),
            "step \"long\": \"c\" is no sweep step",
        ),
        (
            format!("{SWEEP}{}", train("\"tune\"", "[]")),
            "step \"long\" uses step \"tune\": list it in depends_on",
        ),
        (
            format!("{SWEEP}{}", train("3", "[\"tune\"]")),
            "step \"long\": `from_sweep` must be a string",
        ),
    ];
    for (text, want) in cases {
        let e = load("hand-bad", &text).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
    }
}

#[test]
fn the_values_handed_over_are_in_the_cache_key() {
    let dir = std::env::temp_dir().join(format!("weft-tune-pipeline-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("r.toml"), "[train]\nsteps = 1\n").unwrap();
    std::fs::write(dir.join("s.toml"), "[sweep]\n").unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(
        &file,
        format!(
            "{SWEEP}[[step]]\nname = \"long\"\nkind = \"train\"\nconfig = \"r.toml\"\nfrom_sweep = \"tune\"\n\
             depends_on = [\"tune\"]\n"
        ),
    )
    .unwrap();
    let p = Pipeline::load(&file).unwrap();
    let step = p.step("long").unwrap();
    let best = |lr: f64| {
        let mut params = toml::Table::new();
        params.insert("optim.lr".into(), toml::Value::Float(lr));
        handover::Best {
            trial: 0,
            run: "r".into(),
            value: 1.0,
            params,
        }
    };
    let key = |lr: f64| {
        let out = handover::sweep_output("s", Some(&best(lr)));
        p.hash(
            step,
            &BTreeMap::from([("tune".to_string(), format!("KEY:{out}"))]),
            &BTreeMap::new(),
        )
        .unwrap()
    };
    assert_eq!(key(0.01), key(0.01));
    assert_ne!(key(0.01), key(0.02));
    assert_eq!(p.descendants("tune"), BTreeSet::from(["long".to_string()]));
    assert_eq!(p.ancestors("long"), BTreeSet::from(["tune".to_string()]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// prepare -> train on its data -> evaluate -> a gate on the evaluated value -> register ->
/// deploy, each step after the one before.
const FLOW: &str = "[[step]]\nname = \"prep\"\nkind = \"prepare\"\ntokenizer = \"char\"\ninput = [\"a.txt\"]\n\
    output = \"data\"\nval_fraction = 0.2\nshard_tokens = 1000\n\n\
    [[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"r.toml\"\n\
    set = [\"data.path=\\\"${steps.prep.data}\\\"\", \"model.vocab_size=${steps.prep.vocab_size}\"]\n\
    depends_on = [\"prep\"]\n\n\
    [[step]]\nname = \"eval\"\nkind = \"evaluate\"\nstep = \"train\"\nbatches = 2\ndepends_on = [\"train\"]\n\n\
    [[step]]\nname = \"gate\"\nkind = \"condition\"\nstep = \"eval\"\nop = \"<\"\nvalue = 9\ndepends_on = [\"eval\"]\n\n\
    [[step]]\nname = \"reg\"\nkind = \"register\"\nstep = \"train\"\nmodel = \"m\"\ndepends_on = [\"gate\"]\n\n\
    [[step]]\nname = \"ship\"\nkind = \"deploy\"\nstep = \"reg\"\nmodel = \"m\"\ndepends_on = [\"reg\"]\n";

#[test]
fn the_new_kinds_parse_with_their_defaults() {
    let p = load("flow", FLOW).unwrap();
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["prep", "train", "eval", "gate", "reg", "ship"]);
    assert_eq!(
        p.step("prep").unwrap().action,
        Action::Prepare(Prepare {
            tokenizer: "char".into(),
            input: vec!["a.txt".into()],
            output: "data".into(),
            val_fraction: Some(0.2),
            shard_tokens: Some(1000),
        })
    );
    assert_eq!(
        p.step("eval").unwrap().action,
        Action::Evaluate(Evaluate {
            step: "train".into(),
            config: None,
            batches: Some(2),
            data: None,
        })
    );
    assert_eq!(
        p.step("gate").unwrap().action,
        Action::Condition {
            gate: Gate::Output {
                step: "eval".into(),
                key: "value".into()
            },
            op: Op::Lt,
            value: "9".into()
        }
    );
    let Action::Deploy(d) = &p.step("ship").unwrap().action else {
        panic!()
    };
    assert_eq!(
        (
            d.step.as_deref(),
            d.version.as_deref(),
            d.stage.as_str(),
            d.server.as_deref(),
            d.timeout
        ),
        (Some("reg"), None, "production", None, 60.0)
    );
    assert!(!p.step("ship").unwrap().never_cached());
    let refs: Vec<String> = p
        .step("train")
        .unwrap()
        .references()
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(refs, ["${steps.prep.data}", "${steps.prep.vocab_size}"]);
    // the values substitute into the action
    let values = p
        .step("train")
        .unwrap()
        .values(&BTreeMap::from([(
            "prep".to_string(),
            refs::output(&[("data", "/d d".into()), ("vocab_size", "12".into())]),
        )]))
        .unwrap();
    let Action::Train { set, .. } = p.step("train").unwrap().action.resolve(&values).unwrap() else {
        panic!()
    };
    assert_eq!(set, ["data.path=\"/d d\"", "model.vocab_size=12"]);
    // a deploy that tells a server always runs
    let server = FLOW.replace(
        "model = \"m\"\ndepends_on = [\"reg\"]",
        "model = \"m\"\nserver = \"http://127.0.0.1:1\"\ntoken_file = \"t\"\ntimeout = 5\ndepends_on = [\"reg\"]",
    );
    assert!(load("flow-server", &server)
        .unwrap()
        .step("ship")
        .unwrap()
        .never_cached());
}

#[test]
fn references_must_be_well_formed_and_name_a_step_depended_on() {
    let cmd = |name: &str, argv: &str, deps: &str| {
        format!("[[step]]\nname = \"{name}\"\nkind = \"command\"\nargv = [{argv}]\ndepends_on = [{deps}]\n")
    };
    // an indirect dependency is enough; a shell's own ${VAR} is text
    let ok = [
        cmd("a", "\"true\"", ""),
        cmd("b", "\"true\"", "\"a\""),
        cmd("c", "\"echo\", \"${steps.a.exit} ${HOME}\"", "\"b\""),
    ]
    .concat();
    assert!(load("refs-ok", &ok).is_ok());
    let cases = [
        (
            [
                cmd("a", "\"true\"", ""),
                cmd("c", "\"echo\", \"${steps.zz.exit}\"", "\"a\""),
            ]
            .concat(),
            "step \"c\": `argv`: ${steps.zz.exit} names no step \"zz\"",
        ),
        (
            [cmd("a", "\"true\"", ""), cmd("c", "\"echo\", \"${steps.a.exit}\"", "")].concat(),
            "step \"c\": `argv`: ${steps.a.exit}: step \"a\" is not a step it depends on",
        ),
        (
            [cmd("a", "\"true\"", ""), cmd("c", "\"echo\", \"${steps.a}\"", "\"a\"")].concat(),
            "step \"c\": `argv`: ${steps.a} in \"${steps.a}\": a reference is ${steps.STEP.KEY}",
        ),
        (
            [
                cmd("a", "\"true\"", ""),
                cmd("c", "\"echo\", \"${steps.a.exit\"", "\"a\""),
            ]
            .concat(),
            "is not closed",
        ),
        // a step after it is no dependency either
        (
            [
                cmd("c", "\"echo\", \"${steps.a.exit}\"", ""),
                cmd("a", "\"true\"", "\"c\""),
            ]
            .concat(),
            "step \"a\" is not a step it depends on",
        ),
        (
            FLOW.replace("set = [\"data.path", "set = [\"x=${steps.eval.value}\", \"data.path"),
            "step \"train\": `set`: ${steps.eval.value}: step \"eval\" is not a step it depends on",
        ),
    ];
    for (text, want) in cases {
        let e = load("refs-bad", &text).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
    }
}

#[test]
fn bad_settings_of_the_new_kinds_are_refused_in_one_line() {
    let cases = [
        (
            FLOW.replace("step = \"train\"\nbatches", "step = \"prep\"\nbatches"),
            "step \"eval\": \"prep\" is no train step",
        ),
        (
            FLOW.replace("batches = 2", "batches = 0"),
            "`batches` must be a whole number >= 1",
        ),
        (
            FLOW.replace("input = [\"a.txt\"]", "input = []"),
            "`input` must list at least one file",
        ),
        (
            FLOW.replace("val_fraction = 0.2", "val_fraction = 1.5"),
            "`val_fraction` 1.5 is not in [0, 1)",
        ),
        (FLOW.replace("output = \"data\"\n", ""), "`output` is missing"),
        (
            FLOW.replace("step = \"reg\"\nmodel", "step = \"train\"\nmodel"),
            "\"train\" is no register step",
        ),
        (
            FLOW.replace("step = \"reg\"\nmodel", "version = 1\nstep = \"reg\"\nmodel"),
            "give either `step`",
        ),
        (
            FLOW.replace("step = \"reg\"\nmodel", "version = \"x\"\nmodel"),
            "`version` \"x\" is not a version",
        ),
        (
            FLOW.replace("step = \"reg\"\nmodel", "step = \"reg\"\nstage = \"live\"\nmodel"),
            "unknown stage \"live\"",
        ),
        (
            FLOW.replace(
                "step = \"reg\"\nmodel",
                "step = \"reg\"\nserver = \"http://h:1\"\nmodel",
            ),
            "`server` needs `token_file`",
        ),
        (
            FLOW.replace(
                "step = \"reg\"\nmodel",
                "step = \"reg\"\nserver = \"h:1\"\ntoken_file = \"t\"\nmodel",
            ),
            "must be the management API's URL",
        ),
        (
            FLOW.replace(
                "step = \"reg\"\nmodel",
                "step = \"reg\"\nserver = \"http://h:1\"\ntoken_file = \"t\"\nstage = \"staging\"\nmodel",
            ),
            "give `model_store`",
        ),
        (
            FLOW.replace("step = \"reg\"\nmodel", "step = \"reg\"\ntoken_file = \"t\"\nmodel"),
            "`token_file` needs `server`",
        ),
        (
            FLOW.replace("step = \"eval\"\nop", "step = \"eval\"\nrun = \"train\"\nop"),
            "give either `run` and `metric`",
        ),
        (
            FLOW.replace("value = 9", "value = \"x\""),
            "`value` \"x\" must be a number",
        ),
        // a comparison with NaN or an infinity says nothing: `!=` held for NaN
        (
            FLOW.replace("value = 9", "value = nan"),
            "step \"gate\": `value` \"NaN\" must be a finite number",
        ),
        (
            FLOW.replace("value = 9", "value = -inf"),
            "step \"gate\": `value` \"-inf\" must be a finite number",
        ),
        (
            FLOW.replace("value = 9", "value = \"nan\""),
            "step \"gate\": `value` \"nan\" must be a finite number",
        ),
        (
            FLOW.replace("step = \"eval\"\nop", "step = \"eval\"\nmetric = \"m\"\nop"),
            "`metric` goes with `run`",
        ),
        (
            FLOW.replace("step = \"eval\"\nop", "step = \"zz\"\nop"),
            "uses \"zz\", which is no step",
        ),
    ];
    for (text, want) in cases {
        let e = load("kinds-bad", &text).unwrap_err().to_string();
        assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
    }
}

#[test]
fn input_bytes_and_reference_values_are_in_the_cache_key() {
    let dir = std::env::temp_dir().join(format!("weft-tune-pipeline-lineage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "hello").unwrap();
    std::fs::write(dir.join("r.toml"), "[train]\nsteps = 1\n").unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(&file, FLOW).unwrap();
    let p = Pipeline::load(&file).unwrap();
    let prep = p.step("prep").unwrap();
    let none = BTreeMap::new();
    let first = p.hash(prep, &none, &none).unwrap();
    assert_eq!(first, p.hash(prep, &none, &none).unwrap());
    std::fs::write(dir.join("a.txt"), "hellO").unwrap();
    let changed = p.hash(prep, &none, &none).unwrap();
    assert_ne!(first, changed);
    std::fs::remove_file(dir.join("a.txt")).unwrap();
    let e = p.hash(prep, &none, &none).unwrap_err().to_string();
    assert!(e.contains("a.txt") && !e.contains('\n'), "{e}");
    // the train step's key follows the values of its references
    let train = p.step("train").unwrap();
    let key = |data: &str| {
        let outputs = BTreeMap::from([(
            "prep".to_string(),
            refs::output(&[("data", data.into()), ("vocab_size", "5".into())]),
        )]);
        p.hash(train, &none, &train.values(&outputs).unwrap()).unwrap()
    };
    assert_eq!(key("/x"), key("/x"));
    assert_ne!(key("/x"), key("/y"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_syntax_error_names_its_line_and_column() {
    let e = load(
        "syntax",
        "[[step]]\nname = \"t\"\nkind = \"command\"\nargv = [\"true\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("syntax.toml (line 5, column 1): invalid array"), "{e}");
    let e = load("syntax2", "[[step]]\nname = = \"t\"\n").unwrap_err().to_string();
    assert!(e.contains("syntax2.toml (line 2, column 8): "), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// A sweep step's key follows its sweep file's base config (`base = ...` inside the sweep file,
/// resolved against the sweep file's folder, the pipeline file's own folder given relative),
/// and a step's key follows the inputs the caller found it to read.
#[test]
fn a_sweep_steps_key_follows_its_base_config_and_inputs() {
    let dir = std::env::temp_dir().join(format!("weft-tune-pipeline-sweep-base-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sweeps")).unwrap();
    std::fs::write(dir.join("sweeps/base.toml"), "[train]\nsteps = 1\n").unwrap();
    std::fs::write(
        dir.join("sweeps/s.toml"),
        "[sweep]\nbase = \"base.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\n\
         [sweep.parameters]\n\"optim.lr\" = { values = [0.1] }\n",
    )
    .unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(
        &file,
        "[[step]]\nname = \"tune\"\nkind = \"sweep\"\nconfig = \"sweeps/s.toml\"\n",
    )
    .unwrap();
    // the pipeline named relative to the working directory, as `weft pipeline run flow.toml`
    let cwd = std::env::current_dir().unwrap();
    let relative: PathBuf = std::iter::repeat_n("..", cwd.components().count())
        .collect::<PathBuf>()
        .join(dir.strip_prefix("/").unwrap())
        .join("flow.toml");
    let p = Pipeline::load(&relative).unwrap();
    let tune = p.step("tune").unwrap();
    let none = BTreeMap::new();
    let first = p.hash(tune, &none, &none).unwrap();
    assert_eq!(first, p.hash(tune, &none, &none).unwrap());
    std::fs::write(dir.join("sweeps/base.toml"), "[train]\nsteps = 2\n").unwrap();
    let changed = p.hash(tune, &none, &none).unwrap();
    assert_ne!(first, changed, "an edited base config keeps the sweep step's key");
    let input = |d: &str| {
        p.hash_with_inputs(tune, &none, &none, &[("data.path a.txt".into(), d.into())])
            .unwrap()
    };
    assert_eq!(input("sha256:1"), input("sha256:1"));
    assert_ne!(input("sha256:1"), input("sha256:2"));
    assert_ne!(input("sha256:1"), changed);
    // a sweep file that does not read is the step's error, in one line
    std::fs::write(dir.join("sweeps/s.toml"), "[sweep]\nmetric = \"loss\"\n").unwrap();
    let e = p.hash(tune, &none, &none).unwrap_err().to_string();
    assert!(e.contains("sweep.base: missing") && !e.contains('\n'), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
