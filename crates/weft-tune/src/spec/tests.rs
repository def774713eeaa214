use super::*;

fn parse(text: &str) -> Result<SweepSpec> {
    SweepSpec::parse(text, "s.toml", "s", Path::new("/sweeps"))
}

/// Trials 0-3 of a random sweep (seed 0) over `model.n_layer` in 1..=8 and `optim.wd` in
/// [0, 0.2] by 0.05, as the samplers drew them before ranges were counted arithmetically.
const DRAWN_BEFORE: [&str; 4] = ["8 0.1", "7 0.15", "8 0.15", "3 0.05"];

const PARAMS: &str = "[sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-2 }\n";

#[test]
fn defaults_and_every_key() {
    let s = parse(&format!(
        "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\ntrials = 8\n{PARAMS}"
    ))
    .unwrap();
    assert_eq!(s.name, "s");
    assert_eq!(s.experiment, "s");
    assert_eq!(s.base, Path::new("/sweeps/run.toml"));
    assert_eq!(
        (s.goal, s.method, s.trials, s.parallel, s.nproc_per_trial),
        (Goal::Minimize, Method::Tpe, 8, 1, 1)
    );
    assert_eq!(s.pruner.kind, PrunerKind::None);
    assert!(!s.multivariate);
    assert!(s.constant_liar);
    let honest = parse(&format!(
        "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\ntrials = 8\nconstant_liar = false\n{PARAMS}"
    ))
    .unwrap();
    assert!(!honest.constant_liar);
    let mv = parse(&format!(
        "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\ntrials = 8\nmultivariate = true\n{PARAMS}"
    ))
    .unwrap();
    assert!(mv.multivariate);
    assert_eq!(s.gamma, 0.1);
    let g = parse(&format!(
        "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\ntrials = 8\ngamma = 0.3\n{PARAMS}"
    ))
    .unwrap();
    assert_eq!(g.gamma, 0.3);
    let s = parse(&format!(
        "[sweep]\nname = \"lr\"\nbase = \"/abs/run.toml\"\nmetric = \"val_accuracy\"\ngoal = \"maximize\"\n\
         method = \"random\"\ntrials = 3\nparallel = 2\nnproc_per_trial = 2\nseed = 5\n\
         [sweep.pruner]\nkind = \"asha\"\nmin_steps = 10\nreduction_factor = 3\n{PARAMS}"
    ))
    .unwrap();
    assert_eq!(
        (s.name.as_str(), s.goal, s.method, s.parallel, s.nproc_per_trial, s.seed),
        ("lr", Goal::Maximize, Method::Random, 2, 2, 5)
    );
    assert_eq!(s.base, Path::new("/abs/run.toml"));
    assert_eq!(
        s.pruner,
        PrunerSpec {
            kind: PrunerKind::Asha,
            min_steps: 10,
            reduction_factor: 3
        }
    );
    let g = parse("[sweep]\nbase = \"r.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\n[sweep.parameters]\n\
                   \"optim.lr\" = { values = [0.1, 0.2] }\n\"model.n_layer\" = { distribution = \"int_uniform\", min = 1, max = 3 }\n")
        .unwrap();
    assert_eq!(g.trials, 6);
}

/// A seed range of 2^52 integers (or a q of 1e-20) is drawn from, not listed: reading the
/// file listed every value to count the grid, whatever the method, and aborted on a
/// petabyte allocation (or a vector's capacity overflow). A grid that large is refused,
/// naming the parameter.
#[test]
fn huge_ranges_sample_and_a_huge_grid_is_refused_by_name() {
    use crate::sampler::{from_spec, Random, Sampler};
    use crate::space::Value;
    let head = "[sweep]\nbase = \"r.toml\"\nmetric = \"loss\"\ntrials = 1\n";
    let params = "[sweep.parameters]\n\
                  \"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 4503599627370496 }\n\
                  \"optim.lr\" = { distribution = \"uniform\", min = 0.0, max = 0.01, q = 1e-20 }\n";
    for method in ["random", "tpe"] {
        let s = parse(&format!("{head}method = \"{method}\"\n{params}")).unwrap();
        let mut sampler = from_spec(&s);
        let v = sampler.suggest(0, &s.space, &[]).unwrap();
        let [Value::Float(lr), Value::Int(seed)] = v[..] else {
            panic!("{v:?}")
        };
        assert!(
            (0.0..=0.01).contains(&lr) && (0..=4503599627370496).contains(&seed),
            "{v:?}"
        );
    }
    // past its random start, TPE's estimators over the same ranges stay inside them
    let s = parse(&format!("{head}method = \"tpe\"\nstartup_trials = 2\n{params}")).unwrap();
    let mut tpe = from_spec(&s);
    let mut history = Vec::new();
    for n in 0..6 {
        let values = tpe.suggest(n, &s.space, &history).unwrap();
        let [Value::Float(lr), Value::Int(seed)] = values[..] else {
            panic!("{values:?}")
        };
        assert!(
            (0.0..=0.01).contains(&lr) && (0..=4503599627370496).contains(&seed),
            "{values:?}"
        );
        history.push(crate::sampler::Observation {
            values,
            outcome: crate::sampler::Outcome::Finished((lr - 0.005).abs()),
        });
    }
    // ordinary ranges draw what they drew before (the first draws of seed 0)
    let small = parse(&format!(
        "{head}method = \"random\"\n[sweep.parameters]\n\
         \"model.n_layer\" = {{ distribution = \"int_uniform\", min = 1, max = 8 }}\n\
         \"optim.wd\" = {{ distribution = \"uniform\", min = 0.0, max = 0.2, q = 0.05 }}\n"
    ))
    .unwrap();
    let drawn: Vec<String> = (0..4)
        .map(|n| {
            let v = Random::new(0).suggest(n, &small.space, &[]).unwrap();
            let text: Vec<String> = v.iter().zip(&small.space.params).map(|(v, p)| p.text(*v)).collect();
            text.join(" ")
        })
        .collect();
    assert_eq!(drawn, DRAWN_BEFORE);
    // a grid sweep runs every point unless `trials` says fewer
    let head = "[sweep]\nbase = \"r.toml\"\nmetric = \"loss\"\n";
    let part = parse(&format!("{head}trials = 20\nmethod = \"grid\"\n{params}")).unwrap();
    assert_eq!(part.trials, 20);
    let e = parse(&format!("{head}method = \"grid\"\n{params}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "sweep.method: the grid has 4.504e33 points, more than the 100000 a grid sweep may have; \
                    sweep.parameters.\"optim.lr\" alone has 1000000000000000129"
        ),
        "{e}"
    );
    let seed = params.lines().take(2).collect::<Vec<_>>().join("\n");
    let e = parse(&format!("{head}method = \"grid\"\n{seed}\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the grid has 4503599627370497 points") && e.contains("\"train.seed\" alone has 4503599627370497"),
        "{e}"
    );
    let e = parse(&format!(
        "{head}method = \"grid\"\n[sweep.parameters]\n\
         \"a.b\" = {{ distribution = \"int_uniform\", min = 1, max = 1000 }}\n\
         \"c.d\" = {{ distribution = \"int_uniform\", min = 1, max = 101 }}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("the grid has 101000 points") && e.contains("\"a.b\" alone has 1000"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn bad_files_are_one_line_naming_the_key() {
    let head = "[sweep]\nbase = \"r.toml\"\nmetric = \"loss\"\ntrials = 2\n";
    let cases = [
        (
            format!("{head}method = \"bayes\"\n{PARAMS}"),
            "sweep.method: \"bayes\" is not one of tpe, random, grid",
        ),
        (format!("{head}goal = \"down\"\n{PARAMS}"), "sweep.goal"),
        (
            format!("{head}constant_liar = \"yes\"\n{PARAMS}"),
            "sweep.constant_liar: expected true or false, found \"yes\"",
        ),
        (
            format!("{head}{PARAMS}[sweep.pruner]\nkind = \"sha\"\n"),
            "sweep.pruner.kind: \"sha\" is not one of",
        ),
        (
            format!("{head}{PARAMS}[sweep.pruner]\nkind = \"asha\"\nreduction_factor = 1\n"),
            "sweep.pruner.reduction_factor",
        ),
        (
            format!("{head}parallel = 0\n{PARAMS}"),
            "sweep.parallel: expected a whole number >= 1",
        ),
        (format!("{head}colour = 1\n{PARAMS}"), "sweep.colour: unknown key"),
        (
            format!("{head}multivariate = 1\n{PARAMS}"),
            "sweep.multivariate: expected true or false, found 1",
        ),
        (
            format!("{head}gamma = 0.0\n{PARAMS}"),
            "sweep.gamma: expected a number in (0, 1]",
        ),
        (
            format!("{head}gamma = 1.5\n{PARAMS}"),
            "sweep.gamma: expected a number in (0, 1]",
        ),
        (head.to_string(), "[sweep.parameters] is missing"),
        (
            format!("[sweep]\nmetric = \"loss\"\ntrials = 2\n{PARAMS}"),
            "sweep.base: missing",
        ),
        (
            format!("[sweep]\nbase = \"r.toml\"\ntrials = 2\n{PARAMS}"),
            "sweep.metric: missing",
        ),
        (
            format!("[sweep]\nbase = \"r.toml\"\nmetric = \"loss\"\n{PARAMS}"),
            "sweep.trials: missing",
        ),
        (
            format!("{head}method = \"grid\"\n{PARAMS}"),
            "grid needs every parameter",
        ),
        (format!("[train]\nsteps = 1\n{head}{PARAMS}"), "unknown section"),
        ("[sweep\n".to_string(), "s.toml (line 1, column 7): "),
        (
            format!("{head}{PARAMS}x = [1, 2\n"),
            "s.toml (line 8, column 1): invalid array expected `]`",
        ),
    ];
    for (text, want) in cases {
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}\n=> {e}");
        assert!(e.starts_with("s.toml"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
