//! Run-config refusals: TOML syntax errors with their line and column, model sizes of 0, and
//! `data.feature_scale`. Each is one line naming the file and the key.

use super::*;

const MLP: &str = "[model]\nkind = \"mlp\"\nin_features = 2\nhidden = [8]\nout_features = 3\n\
                   activation = \"relu\"\n\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nlabel_column = -1\n\
                   batch_size = 4\nval_fraction = 0.25\n\n[optim]\nkind = \"adam\"\nlr = 0.01\n\n\
                   [train]\nsteps = 2\n";

const CONVNET: &str = "[model]\nkind = \"convnet\"\nin_channels = 1\nimage_size = 8\nchannels = [4, 8]\n\
                       num_classes = 10\n\n[data]\nkind = \"csv\"\npath = \"d.csv\"\nlabel_column = -1\n\
                       batch_size = 4\nval_fraction = 0.25\n\n[optim]\nkind = \"adam\"\nlr = 0.01\n\n\
                       [train]\nsteps = 2\n";

const GPT: &str = "[model]\nkind = \"gpt\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 2\n\
                   n_embd = 32\nbias = true\ndropout = 0.0\n\n[data]\nkind = \"text\"\npath = \"builtin\"\n\
                   batch_size = 4\nval_fraction = 0.1\n\n[optim]\nkind = \"adam\"\nlr = 0.01\n\n\
                   [train]\nsteps = 2\n";

const LLAMA: &str = "[model]\nkind = \"llama\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 4\n\
                     n_kv_head = 2\nn_embd = 32\nintermediate_size = 64\n\n[data]\nkind = \"text\"\n\
                     path = \"builtin\"\nbatch_size = 4\nval_fraction = 0.1\n\n[optim]\nkind = \"adam\"\n\
                     lr = 0.01\n\n[train]\nsteps = 2\n";

fn parse(text: &str, sets: &[&str]) -> Result<RunConfig> {
    let overrides = Overrides::set(sets.iter().copied());
    RunConfig::parse(text, "r.toml", PathBuf::from("."), &overrides)
}

fn refused(text: &str, sets: &[&str]) -> String {
    let e = parse(text, sets)
        .expect_err(&format!("{sets:?} should be refused"))
        .to_string();
    assert!(e.contains("r.toml"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn a_syntax_error_names_its_line_and_column() {
    let e = refused("[model]\nkind = \"mlp\"\nhidden = [1, 2\n", &[]);
    assert!(e.contains("r.toml (line 4, column 1): "), "{e}");
    assert!(e.contains("invalid array"), "{e}");
    let e = refused("[train]\nsteps = = 3\n", &[]);
    assert!(e.contains("(line 2, column 9)"), "{e}");
    // the column counts characters, not bytes
    let e = refused("# é\n[train]\nname = \"ü\" x\n", &[]);
    assert!(e.contains("(line 3, column 12)"), "{e}");
}

#[test]
fn model_sizes_of_0_are_refused_naming_their_key() {
    let cases: [(&str, &[&str]); 4] = [
        (MLP, &["in_features", "out_features"]),
        (CONVNET, &["in_channels", "image_size", "num_classes"]),
        (GPT, &["vocab_size", "block_size"]),
        (LLAMA, &["vocab_size", "block_size"]),
    ];
    for (text, keys) in cases {
        parse(text, &[]).unwrap();
        for key in keys {
            let set = format!("model.{key}=0");
            let e = refused(text, &[&set]);
            assert!(e.contains(&format!("model.{key}: must be at least 1")), "{set}: {e}");
        }
    }
    let e = refused(MLP, &["model.hidden=[8, 0]"]);
    assert!(e.contains("model.hidden[1]: must be at least 1"), "{e}");
    let e = refused(CONVNET, &["model.channels=[4, 0]"]);
    assert!(e.contains("model.channels[1]: must be at least 1"), "{e}");
    let e = refused(CONVNET, &["model.channels=[]"]);
    assert!(e.contains("model.channels: is empty"), "{e}");
    // an mlp without hidden layers is a linear model
    parse(MLP, &["model.hidden=[]"]).unwrap();
    // a language model's own check names the counts it refuses, when the config is read
    for (text, keys) in [
        (GPT, &["n_layer", "n_head", "n_embd"][..]),
        (
            LLAMA,
            &["n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size"][..],
        ),
    ] {
        for key in keys {
            let set = format!("model.{key}=0");
            let e = refused(text, &[&set]);
            assert!(
                e.contains(&format!("r.toml: model.{key}: must be positive")),
                "{set}: {e}"
            );
        }
    }
}

/// The model's own checks run when the config is read, naming the file: a run refused after
/// it had claimed its checkpoint folder had already removed the folder's earlier checkpoints
/// (`train.overwrite`).
#[test]
fn the_models_own_checks_name_the_config_file() {
    for (text, set, want) in [
        (
            GPT,
            "model.n_head=3",
            "config: r.toml: model.n_embd: 32 does not divide by n_head = 3",
        ),
        (
            GPT,
            "model.dropout=1.0",
            "config: r.toml: model.dropout: 1 is outside [0, 1)",
        ),
        (
            LLAMA,
            "model.n_kv_head=3",
            "config: r.toml: model.n_head: 4 does not divide by n_kv_head = 3",
        ),
        (
            MLP,
            "model.activation=\"swish\"",
            "config: r.toml: model.activation: \"swish\" is not one of",
        ),
        (
            CONVNET,
            "model.image_size=6",
            "config: r.toml: model.image_size: 6 does not divide by 2^2",
        ),
    ] {
        let e = refused(text, &[set]);
        assert!(e.contains(want), "{set}: {e}");
        assert!(!e.contains("model config:"), "{set}: {e}");
    }
}

#[test]
fn feature_scale_is_a_positive_f32() {
    for v in ["0.0", "-0.0", "-1.0", "nan", "inf", "-inf", "1e39", "1e-39"] {
        let set = format!("data.feature_scale={v}");
        let e = refused(MLP, &[&set]);
        assert!(e.contains("data.feature_scale: "), "{v}: {e}");
        assert!(e.contains("must be a positive number"), "{v}: {e}");
    }
    for v in ["1.0", "0.0625", "1e38", "1e-30"] {
        let set = format!("data.feature_scale={v}");
        let c = parse(MLP, &[&set]).unwrap();
        let DataConfig::Csv(k) = c.data else { panic!("csv") };
        assert_eq!(k.feature_scale, v.parse::<f64>().unwrap());
    }
}

/// A missing key is named with its section (`model.bias`), as any other key is, not as the
/// section's table (`model: .: missing field`).
#[test]
fn a_missing_key_is_named_with_its_section() {
    let no_bias = GPT.replace("bias = true\n", "");
    let e = refused(&no_bias, &[]);
    assert!(e.contains("r.toml: model.bias: missing field `bias`"), "{e}");
    let e = refused(GPT, &["schedule.kind=\"cosine\""]);
    assert!(
        e.contains("r.toml: schedule.warmup_steps: missing field `warmup_steps`"),
        "{e}"
    );
    let e = refused(MLP, &["data.kind=\"text\"", "data.label_column=1"]);
    assert!(e.contains("r.toml: data.label_column: unknown field"), "{e}");
    let e = refused(GPT, &["model.n_layer=\"x\""]);
    assert!(e.contains("r.toml: model.n_layer: invalid type"), "{e}");
    let e = refused(&GPT.replace("kind = \"gpt\"\n", ""), &[]);
    assert!(e.contains("r.toml: model: missing key `kind`"), "{e}");
    let e = refused(&GPT.replace("[optim]\nkind = \"adam\"\nlr = 0.01\n", ""), &[]);
    assert!(
        e.contains("r.toml: optim: missing field `optim`") && !e.contains(": .:"),
        "{e}"
    );
}

/// `[model] rope_scaling` of a llama: transformers' two kinds read into the model's config; a kind
/// weft does not compute, a key it does not know and values out of range are refused naming
/// the key.
#[test]
fn rope_scaling_is_read_and_checked() {
    let llama3 = "model.rope_scaling={ rope_type = \"llama3\", factor = 8, low_freq_factor = 1.0, \
                  high_freq_factor = 4.0, original_max_position_embeddings = 8192 }";
    let c = parse(LLAMA, &[llama3]).unwrap();
    let ModelConfig::Llama(l) = &c.model else {
        panic!("{:?}", c.model)
    };
    assert_eq!(
        l.to_config().rope_scaling,
        Some(weft_models::llama::RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
    let c = parse(LLAMA, &["model.rope_scaling={ rope_type = \"linear\", factor = 2.5 }"]).unwrap();
    let ModelConfig::Llama(l) = &c.model else { panic!() };
    assert_eq!(
        l.to_config().rope_scaling,
        Some(weft_models::llama::RopeScaling::Linear { factor: 2.5 })
    );
    let ModelConfig::Llama(l) = &parse(LLAMA, &[]).unwrap().model else {
        panic!()
    };
    assert_eq!(l.rope_scaling, None);
    for (set, want) in [
        (
            "model.rope_scaling={ rope_type = \"yarn\", factor = 2.0 }",
            "model.rope_scaling",
        ),
        ("model.rope_scaling={ rope_type = \"yarn\", factor = 2.0 }", "yarn"),
        (
            "model.rope_scaling={ rope_type = \"linear\", factor = 2.0, beta = 1.0 }",
            "beta",
        ),
        ("model.rope_scaling={ factor = 2.0 }", "rope_type"),
        (
            "model.rope_scaling={ rope_type = \"linear\", factor = 0.0 }",
            "model.rope_scaling.factor: 0 must be positive and finite",
        ),
        (
            &llama3.replace("high_freq_factor = 4.0", "high_freq_factor = 1.0"),
            "model.rope_scaling.high_freq_factor: 1 must be above low_freq_factor = 1",
        ),
        (
            &llama3.replace("= 8192", "= 0"),
            "model.rope_scaling.original_max_position_embeddings: 0 must be positive",
        ),
    ] {
        let e = refused(LLAMA, &[set]);
        assert!(e.contains(want), "{set}: {e}");
    }
}

/// `[model] head_dim` of a llama: one equal to `n_embd / n_head` is the same model and is
/// recorded without the key (a checkpoint written with it resumes without it, and the other
/// way), another kept; above its bound, refused naming it.
#[test]
fn a_head_dim_of_n_embd_over_n_head_is_recorded_as_none() {
    let head_dim = |set: &str| match parse(LLAMA, &[set]).unwrap().model {
        ModelConfig::Llama(l) => l.head_dim,
        other => panic!("{other:?}"),
    };
    assert_eq!(head_dim("model.head_dim=8"), None);
    assert_eq!(head_dim("model.head_dim=12"), Some(12));
    assert_eq!(head_dim("model.qk_norm=true"), None);
    let e = refused(LLAMA, &["model.head_dim=131072"]);
    assert!(e.contains("model.head_dim"), "{e}");
}
