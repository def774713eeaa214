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
        ("[[step]]\nname = \"a\"\nkind = \"deploy\"\n", "not built yet"),
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
        p.hash(step, &BTreeMap::from([("tune".to_string(), format!("KEY:{out}"))]))
            .unwrap()
    };
    assert_eq!(key(0.01), key(0.01));
    assert_ne!(key(0.01), key(0.02));
    assert_eq!(p.descendants("tune"), BTreeSet::from(["long".to_string()]));
    assert_eq!(p.ancestors("long"), BTreeSet::from(["tune".to_string()]));
    let _ = std::fs::remove_dir_all(&dir);
}
