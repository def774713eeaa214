//! Hugging Face checkpoint folders: configs and names read into weft's terms, damaged folders
//! refused naming the file, and folders written back read the same. The fixtures come from
//! tools/reference/make_hf_fixtures.py (transformers' save_pretrained).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use weft_core::io::safetensors;
use weft_models::hf;

/// The fixture folders read as a llama: Llama (grouped-query and sharded, tied, Llama 3.1's
/// rope scaling, linear rope scaling in the older form, heads of their own width), Qwen2, Qwen3,
/// Mistral (without a sliding window, and with one shorter than its positions) and Phi-3 (fused
/// projections, a sliding window shorter than its positions).
const LLAMA_FOLDERS: [&str; 10] = [
    "llama_gqa",
    "llama_tied",
    "llama_rope_llama3",
    "llama_rope_linear",
    "llama_head_dim",
    "qwen2",
    "qwen3",
    "mistral",
    "mistral_window",
    "phi3",
];

/// The `[model]` keys of fixture `name`'s config.json after `edit`, or the error, as text (the
/// file named `config.json`).
fn keys(
    name: &str,
    edit: &dyn Fn(&mut serde_json::Value),
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let text = std::fs::read_to_string(fixture(name).join("config.json")).unwrap();
    let mut c: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut c);
    hf::to_weft_keys(&c.to_string(), "config.json").map_err(|e| e.to_string())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-hf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Copies a fixture folder so a test can damage it.
fn copy_of(name: &str) -> PathBuf {
    copy_as(name, name)
}

/// Copies fixture folder `name` into a folder of its own, `tag` (tests run at the same time
/// must not share one).
fn copy_as(name: &str, tag: &str) -> PathBuf {
    let d = temp(tag);
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

#[test]
fn a_gpt2_folder_reads_as_a_gpt_with_linear_weights() {
    let ck = hf::read_folder(&fixture("gpt2")).unwrap();
    let want = json!({"kind": "gpt", "vocab_size": 61, "block_size": 16, "n_layer": 2, "n_head": 4,
                      "n_embd": 32, "bias": true, "activation": "gelu_tanh"});
    assert_eq!(json!(ck.model), want);
    assert!(
        ck.tensors.keys().all(|n| n.starts_with("transformer.")),
        "{:?}",
        ck.tensors.keys()
    );
    // Conv1D [in, out] became Linear [out, in]
    let raw = safetensors::load(&fixture("gpt2/model.safetensors")).unwrap().tensors;
    for (name, shape) in [
        ("transformer.h.0.attn.c_attn.weight", [96, 32]),
        ("transformer.h.1.mlp.c_fc.weight", [128, 32]),
        ("transformer.h.1.mlp.c_proj.weight", [32, 128]),
    ] {
        let ours = &ck.tensors[name];
        assert_eq!(ours.shape(), shape, "{name}");
        let theirs = raw[name].t().unwrap().contiguous().unwrap();
        assert_eq!(ours.to_vec_f64(), theirs.to_vec_f64(), "{name}");
    }
    // what is not a Conv1D weight is as stored
    let b = "transformer.h.0.attn.c_attn.bias";
    assert_eq!(ck.tensors[b].to_vec_f64(), raw[b].to_vec_f64());
    assert_eq!(ck.tensors.len(), raw.len());
}

#[test]
fn a_sharded_llama_folder_reads_every_shard() {
    let ck = hf::read_folder(&fixture("llama_gqa")).unwrap();
    let want = json!({"kind": "llama", "vocab_size": 53, "block_size": 32, "n_layer": 2, "n_head": 4,
                      "n_kv_head": 2, "n_embd": 32, "intermediate_size": 48, "rope_theta": 500000.0,
                      "norm_eps": 1e-5, "tie_embeddings": false});
    assert_eq!(json!(ck.model), want);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama_gqa/model.safetensors.index.json")).unwrap())
            .unwrap();
    let names: Vec<&String> = index["weight_map"].as_object().unwrap().keys().collect();
    assert_eq!(ck.tensors.keys().collect::<Vec<_>>(), names);
    assert_eq!(ck.tensors["model.layers.1.self_attn.k_proj.weight"].shape(), [16, 32]);
    assert_eq!(ck.tensors["lm_head.weight"].shape(), [53, 32]);
    let tied = hf::read_folder(&fixture("llama_tied")).unwrap();
    assert_eq!(tied.model["tie_embeddings"], json!(true));
    assert_eq!(tied.model["rope_theta"], json!(10000.0));
    assert!(!tied.tensors.contains_key("lm_head.weight"));
}

/// Opening a folder reads no tensor (a llama's; a GPT-2's reads its output layer and token
/// embedding, to compare them): names and shapes come from the headers, in weft's layout, and a
/// tensor's bytes are read when it is asked for.
#[test]
fn opening_a_folder_reads_no_tensor_until_one_is_asked_for() {
    use weft_nn::state_dict::TensorSource;
    let f = hf::open_folder(&fixture("llama_gqa")).unwrap();
    assert_eq!(f.weights.bytes_read(), 0);
    let k = "model.layers.1.self_attn.k_proj.weight";
    assert_eq!(f.weights.shape(k), Some(vec![16, 32]));
    let t = f.weights.read(k).unwrap();
    assert_eq!(f.weights.bytes_read(), 16 * 32 * t.dtype().size_in_bytes() as u64);
    let g = hf::open_folder(&fixture("gpt2")).unwrap();
    // a Conv1D weight's shape is weft's [out, in]
    let whole = hf::read_folder(&fixture("gpt2")).unwrap();
    for name in g.weights.names() {
        assert_eq!(g.weights.shape(name).unwrap(), whole.tensors[name].shape(), "{name}");
    }
}

#[test]
fn damaged_folders_are_refused_naming_the_file_and_key() {
    let err = |d: &Path| match hf::read_folder(d) {
        Ok(_) => panic!("{} read", d.display()),
        Err(e) => e.to_string(),
    };
    // a shard missing
    let d = copy_of("llama_gqa");
    std::fs::remove_file(d.join("model-00002-of-00004.safetensors")).unwrap();
    let e = err(&d);
    assert!(e.contains("model-00002-of-00004.safetensors"), "{e}");
    // an index that puts a tensor in the wrong shard
    let d = copy_of("llama_gqa");
    let p = d.join("model.safetensors.index.json");
    let mut index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().unwrap();
    let (name, file) = map
        .iter()
        .next()
        .map(|(n, f)| (n.clone(), f.as_str().unwrap().to_string()))
        .unwrap();
    let other = ["model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors"]
        .into_iter()
        .find(|f| *f != file)
        .unwrap();
    map.insert(name.clone(), json!(other));
    std::fs::write(&p, index.to_string()).unwrap();
    let e = err(&d);
    assert!(
        e.contains(&name) && e.contains(other) && e.contains("index.json"),
        "{e}"
    );
    // a file name that leaves the folder
    index["weight_map"][&name] = json!("../model.safetensors");
    std::fs::write(&p, index.to_string()).unwrap();
    assert!(err(&d).contains("not a file name in the folder"));
    // a GPT-2 file naming one parameter twice, with and without `transformer.` (one was
    // dropped unread)
    let d = copy_as("gpt2", "gpt2-twice");
    let file = d.join("model.safetensors");
    let mut tensors = safetensors::load(&file).unwrap().tensors;
    let (name, t) = tensors
        .iter()
        .find(|(n, _)| n.ends_with("ln_f.weight"))
        .map(|(n, t)| (n.clone(), t.clone()))
        .unwrap();
    let twin = match name.strip_prefix("transformer.") {
        Some(bare) => bare.to_string(),
        None => format!("transformer.{name}"),
    };
    tensors.insert(twin.clone(), t);
    safetensors::save(&file, tensors.iter().map(|(n, t)| (n.as_str(), t)), &Default::default()).unwrap();
    let e = err(&d);
    assert!(
        e.contains(&name) && e.contains(&twin) && e.contains("holds both"),
        "{e}"
    );
    // no weights at all
    let d = temp("empty");
    std::fs::copy(fixture("gpt2/config.json"), d.join("config.json")).unwrap();
    assert!(err(&d).contains("neither model.safetensors nor"));
    // configs weft cannot honour, each naming its key
    let config = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let d = copy_of(name);
        let p = d.join("config.json");
        let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(&p, c.to_string()).unwrap();
        err(&d)
    };
    let e = config("llama_tied", &|c| c["architectures"] = json!(["BertForMaskedLM"]));
    assert!(
        e.contains("config.json") && e.contains("architectures") && e.contains("BertForMaskedLM"),
        "{e}"
    );
    // rope scaling: kinds weft does not compute, and llama3's keys missing or out of range
    let e = config("llama_tied", &|c| c["rope_parameters"]["rope_type"] = json!("yarn"));
    assert!(
        e.contains("rope_parameters: rope_type: \"yarn\" is not supported"),
        "{e}"
    );
    let e = config("llama_tied", &|c| {
        c["rope_parameters"] = json!({"rope_type": "dynamic", "factor": 2.0})
    });
    assert!(e.contains("rope_type: \"dynamic\""), "{e}");
    let e = config("llama_tied", &|c| {
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0})
    });
    assert!(e.contains("given beside rope_parameters"), "{e}");
    let e = config("llama_rope_llama3", &|c| {
        c["rope_parameters"]["low_freq_factor"].take();
    });
    assert!(
        e.contains("rope_parameters: low_freq_factor: missing (rope_type \"llama3\" needs it)"),
        "{e}"
    );
    let e = config("llama_rope_llama3", &|c| {
        c["rope_parameters"]["high_freq_factor"] = json!(0.5)
    });
    assert!(
        e.contains("high_freq_factor: 0.5 must be above low_freq_factor = 1"),
        "{e}"
    );
    let e = config("llama_rope_llama3", &|c| c["rope_parameters"]["factor"] = json!("big"));
    assert!(e.contains("factor: expected a number, got \"big\""), "{e}");
    let e = config("llama_rope_linear", &|c| c["rope_scaling"]["factor"] = json!(-2.0));
    assert!(e.contains("rope_scaling: factor: -2 must be positive"), "{e}");
    let e = config("llama_rope_linear", &|c| c["rope_scaling"] = json!("linear"));
    assert!(e.contains("rope_scaling: expected an object"), "{e}");
    let e = config("llama_tied", &|c| {
        c["rope_parameters"] = json!({"full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    });
    assert!(
        e.contains("rope_parameters: full_attention: rope parameters by layer type are not supported"),
        "{e}"
    );
    let e = config("llama_tied", &|c| c["partial_rotary_factor"] = json!(0.5));
    assert!(e.contains("partial_rotary_factor: 0.5"), "{e}");
    let e = config("llama_tied", &|c| c["attention_bias"] = json!(true));
    assert!(e.contains("attention_bias"), "{e}");
    let e = config("llama_tied", &|c| c["hidden_size"] = json!(-3));
    assert!(e.contains("hidden_size") && e.contains("positive integer"), "{e}");
    let e = config("gpt2", &|c| c["activation_function"] = json!("relu"));
    assert!(e.contains("activation_function"), "{e}");
    let e = config("gpt2", &|c| c["n_inner"] = json!(100));
    assert!(e.contains("n_inner"), "{e}");
    let e = config("gpt2", &|c| c["layer_norm_epsilon"] = json!(1e-6));
    assert!(e.contains("layer_norm_epsilon"), "{e}");
    let d = copy_of("gpt2");
    std::fs::write(d.join("config.json"), "{not json").unwrap();
    assert!(err(&d).contains("not JSON"));
}

#[test]
fn a_written_folder_reads_back_the_same() {
    for name in std::iter::once("gpt2").chain(LLAMA_FOLDERS) {
        let ck = hf::read_folder(&fixture(name)).unwrap();
        let d = temp(&format!("out-{name}"));
        let aliases: &[(&str, &str)] = if name == "gpt2" {
            &[("lm_head.weight", "transformer.wte.weight")]
        } else {
            &[]
        };
        hf::write_folder(&d, &ck.model, &ck.tensors, aliases).unwrap();
        let back = hf::read_folder(&d).unwrap();
        assert_eq!(back.model, ck.model, "{name}");
        let values = |t: &BTreeMap<String, weft_core::Tensor>| {
            t.iter()
                .map(|(n, v)| (n.clone(), v.shape().to_vec(), v.to_vec_f64()))
                .collect::<Vec<_>>()
        };
        assert_eq!(values(&back.tensors), values(&ck.tensors), "{name}");
        // stored as transformers stores them: Conv1D [in, out], no tied head, format pt
        let file = safetensors::load(&d.join("model.safetensors")).unwrap();
        assert_eq!(file.metadata.get("format").map(String::as_str), Some("pt"));
        assert!(
            !file.tensors.contains_key("lm_head.weight")
                || [
                    "llama_gqa",
                    "llama_rope_linear",
                    "llama_head_dim",
                    "mistral",
                    "mistral_window",
                    "phi3"
                ]
                .contains(&name)
        );
        if name == "gpt2" {
            assert_eq!(file.tensors["transformer.h.0.attn.c_attn.weight"].shape(), [32, 96]);
        }
        // a llama with biases on q, k and v is written as Qwen2 (Llama's attention_bias would
        // put one on o_proj too); a Mistral model as the llama it computes
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
        let arch = match name {
            "gpt2" => "GPT2LMHeadModel",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            _ => "LlamaForCausalLM",
        };
        assert_eq!(written["architectures"], json!([arch]), "{name}");
        // a head width of its own is written (Qwen3's always: its config's default is 128)
        let head_dim = match name {
            "qwen3" => json!(16),
            "llama_head_dim" => json!(12),
            _ => serde_json::Value::Null,
        };
        assert_eq!(written["head_dim"], head_dim, "{name}");
    }
    // a gpt without biases has no GPT-2 form
    let keys = json!({"kind": "gpt", "vocab_size": 8, "block_size": 4, "n_layer": 1, "n_head": 1,
                      "n_embd": 4, "bias": false});
    let e = hf::write_folder(&temp("nobias"), keys.as_object().unwrap(), &BTreeMap::new(), &[]).unwrap_err();
    assert!(e.to_string().contains("model.bias"), "{e}");
}

/// The logits transformers computed for a fixture (`expected.json`): ids `[2, T]` and the
/// logits flattened.
fn expected(name: &str) -> (weft_core::Tensor, Vec<f64>) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
    let ids: Vec<Vec<i64>> = serde_json::from_value(v[name]["ids"].clone()).unwrap();
    let t = ids[0].len();
    let flat: Vec<i64> = ids.concat();
    let logits: Vec<f64> = serde_json::from_value(v[name]["logits"].clone()).unwrap();
    (weft_core::Tensor::from_vec(flat, &[2, t]).unwrap(), logits)
}

fn assert_logits(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(
        worst <= 1e-5 * scale.max(1.0),
        "{name}: largest difference {worst} (logits up to {scale})"
    );
}

#[test]
fn a_gpt2_folder_computes_the_logits_transformers_does() {
    use weft_models::gpt::{Gpt, GptConfig};
    use weft_models::Model;
    let ck = hf::read_folder(&fixture("gpt2")).unwrap();
    let n = |k: &str| ck.model[k].as_u64().unwrap() as usize;
    let config = GptConfig {
        vocab_size: n("vocab_size"),
        block_size: n("block_size"),
        n_layer: n("n_layer"),
        n_head: n("n_head"),
        n_embd: n("n_embd"),
        bias: true,
        dropout: 0.0,
        activation: weft_core::UnaryOp::GeluTanh,
    };
    let gpt = Gpt::new(config.clone(), 0).unwrap();
    weft_nn::state_dict::load_state_dict(&gpt, &ck.tensors, gpt.aliases(), "gpt2").unwrap();
    let (ids, want) = expected("gpt2");
    let got = gpt.forward(&ids).unwrap().to_vec_f64();
    assert_logits("gpt2", &got, &want);
    // the exact GELU is not what GPT-2 computes: the check can tell them apart
    let exact = Gpt::new(
        GptConfig {
            activation: weft_core::UnaryOp::Gelu,
            ..config
        },
        0,
    )
    .unwrap();
    weft_nn::state_dict::load_state_dict(&exact, &ck.tensors, exact.aliases(), "gpt2").unwrap();
    let off = exact.forward(&ids).unwrap().to_vec_f64();
    let worst = off.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst > 1e-4, "{worst}");
}

#[test]
fn llama_folders_compute_the_logits_transformers_does() {
    use weft_models::llama::Llama;
    use weft_models::Model;
    for name in LLAMA_FOLDERS {
        let ck = hf::read_folder(&fixture(name)).unwrap();
        let config = support::llama_config(&serde_json::Value::Object(ck.model.clone()));
        let llama = Llama::new(config.clone(), 0).unwrap();
        weft_nn::state_dict::load_state_dict(&llama, &ck.tensors, llama.aliases(), name).unwrap();
        let (ids, want) = expected(name);
        let got = llama.forward(&ids).unwrap().to_vec_f64();
        assert_logits(name, &got, &want);
        if config.rope_scaling.is_some() {
            // the same weights without the scaling compute other logits: the check can tell
            let plain = Llama::new(
                weft_models::llama::LlamaConfig {
                    rope_scaling: None,
                    ..config
                },
                0,
            )
            .unwrap();
            weft_nn::state_dict::load_state_dict(&plain, &ck.tensors, plain.aliases(), name).unwrap();
            let off = plain.forward(&ids).unwrap().to_vec_f64();
            let worst = off.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst > 1e-3, "{name}: {worst}");
        }
        if config.qk_norm {
            // the head norms are read and used: without them the logits differ
            let mut tensors = ck.tensors.clone();
            for (n, t) in tensors.iter_mut() {
                if n.ends_with("q_norm.weight") || n.ends_with("k_norm.weight") {
                    *t = weft_core::Tensor::ones(t.shape(), t.dtype()).unwrap();
                }
            }
            let plain = Llama::new(config.clone(), 0).unwrap();
            weft_nn::state_dict::load_state_dict(&plain, &tensors, plain.aliases(), name).unwrap();
            let off = plain.forward(&ids).unwrap().to_vec_f64();
            let worst = off.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst > 1e-3, "{name}: {worst}");
        }
        if config.qkv_bias {
            // the biases are read and used: the same weights without them compute other logits
            let mut tensors = ck.tensors.clone();
            for (n, t) in tensors.iter_mut() {
                if n.ends_with("_proj.bias") {
                    *t = weft_core::Tensor::zeros(t.shape(), t.dtype()).unwrap();
                }
            }
            let unbiased = Llama::new(config.clone(), 0).unwrap();
            weft_nn::state_dict::load_state_dict(&unbiased, &tensors, unbiased.aliases(), name).unwrap();
            let off = unbiased.forward(&ids).unwrap().to_vec_f64();
            let worst = off.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst > 1e-3, "{name}: {worst}");
        }
    }
}

/// Qwen2 folders read as a llama with biases on q, k and v; Mistral folders without a sliding
/// window shorter than their positions as a plain llama. Sliding-window attention is refused
/// naming the key.
#[test]
fn qwen2_and_mistral_folders_read_as_llama() {
    let qwen2 = hf::read_folder(&fixture("qwen2")).unwrap();
    assert_eq!(qwen2.model["kind"], json!("llama"));
    assert_eq!(qwen2.model["qkv_bias"], json!(true));
    assert_eq!(qwen2.model["rope_theta"], json!(1000000.0));
    assert_eq!(qwen2.model["norm_eps"], json!(1e-6));
    assert_eq!(qwen2.tensors["model.layers.1.self_attn.k_proj.bias"].shape(), [16]);
    let mistral = hf::read_folder(&fixture("mistral")).unwrap();
    assert_eq!(mistral.model["kind"], json!("llama"));
    assert_eq!(mistral.model["n_kv_head"], json!(1));
    assert!(!mistral.model.contains_key("qkv_bias"));
    let e = keys("qwen2", &|c| c["use_sliding_window"] = json!(true)).unwrap_err();
    assert!(e.contains("config.json: use_sliding_window: true"), "{e}");
    let e = keys("qwen2", &|c| {
        c["layer_types"] = json!(["full_attention", "sliding_attention"])
    })
    .unwrap_err();
    assert!(e.contains("config.json: layer_types"), "{e}");
    // a window shorter than the positions is the longest sequence: within it, sliding-window
    // attention reads every earlier position, as weft's llama does (the mistral_window fixture's
    // logits, at ids as long as its window, are transformers')
    assert_eq!(
        hf::read_folder(&fixture("mistral_window")).unwrap().model["block_size"],
        json!(6)
    );
    let k = keys("mistral", &|c| c["sliding_window"] = json!(4)).unwrap();
    assert_eq!(k["block_size"], json!(4));
    // a window as long as the positions, or none, leaves them
    let k = keys("mistral", &|c| c["sliding_window"] = json!(64)).unwrap();
    assert_eq!(k["block_size"], json!(32));
    for bad in [json!(0), json!(-3), json!("4096")] {
        let e = keys("mistral", &|c| c["sliding_window"] = bad.clone()).unwrap_err();
        assert!(
            e.contains("config.json: sliding_window: expected a positive integer or null"),
            "{e}"
        );
    }
    // absent, transformers' default window (4096) and key/value heads (Mistral's 8, Qwen2's 32):
    // Mistral 7B v0.1's 32768 positions under a window of 4096
    let k = keys("mistral", &|c| {
        c["max_position_embeddings"] = json!(32768);
        c.as_object_mut().unwrap().remove("sliding_window");
    })
    .unwrap();
    assert_eq!(k["block_size"], json!(4096));
    let k = keys("mistral", &|c| {
        c["num_attention_heads"] = json!(16);
        c.as_object_mut().unwrap().remove("head_dim");
        c.as_object_mut().unwrap().remove("num_key_value_heads");
    })
    .unwrap();
    assert_eq!(k["n_kv_head"], json!(8));
    let k = keys("qwen2", &|c| {
        c["num_attention_heads"] = json!(32);
        c.as_object_mut().unwrap().remove("num_key_value_heads");
    })
    .unwrap();
    assert_eq!(k["n_kv_head"], json!(32));
    let k = keys("qwen2", &|c| {
        c["num_attention_heads"] = json!(16);
        c["num_key_value_heads"] = serde_json::Value::Null;
    })
    .unwrap();
    assert_eq!(k["n_kv_head"], json!(16));
    // the kind from model_type when architectures is absent
    let k = keys("qwen2", &|c| {
        c.as_object_mut().unwrap().remove("architectures");
    })
    .unwrap();
    assert_eq!(k["qkv_bias"], json!(true));
}

/// Phi-3 folders read as a llama: the fused `qkv_proj` and `gate_up_proj` split into weft's
/// projections by rows (only those rows read), the sliding window as for Mistral (absent: none,
/// Phi-3's default). A fused tensor of other rows than the config makes, and dropout, are refused.
#[test]
fn phi3_folders_read_as_llama() {
    let folder = hf::open_folder(&fixture("phi3")).unwrap();
    assert_eq!(folder.model["kind"], json!("llama"));
    assert_eq!(folder.model["block_size"], json!(8));
    // q 4 heads of 8, k and v 2 heads of 8; gate and up 40 rows each
    let q = folder.weights.read("model.layers.0.self_attn.q_proj.weight").unwrap();
    let k = folder.weights.read("model.layers.0.self_attn.k_proj.weight").unwrap();
    let v = folder.weights.read("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!(
        (q.shape(), k.shape(), v.shape()),
        ([32, 32].as_slice(), [16, 32].as_slice(), [16, 32].as_slice())
    );
    // only the rows asked for are read: k's 16 x 32 f32
    let before = folder.weights.bytes_read();
    folder.weights.read("model.layers.1.self_attn.k_proj.weight").unwrap();
    assert_eq!(folder.weights.bytes_read() - before, 16 * 32 * 4);
    let file = safetensors::load(&fixture("phi3").join("model.safetensors")).unwrap();
    let qkv = file.tensors["model.layers.0.self_attn.qkv_proj.weight"].clone();
    let parts = weft_core::Tensor::cat(&[&q, &k, &v], 0).unwrap();
    assert_eq!(parts.to_vec_f64(), qkv.to_vec_f64());
    let gate = folder.weights.read("model.layers.1.mlp.gate_proj.weight").unwrap();
    let up = folder.weights.read("model.layers.1.mlp.up_proj.weight").unwrap();
    let fused = file.tensors["model.layers.1.mlp.gate_up_proj.weight"].clone();
    assert_eq!(gate.to_vec_f64(), fused.narrow(0, 0, 40).unwrap().to_vec_f64());
    assert_eq!(up.to_vec_f64(), fused.narrow(0, 40, 40).unwrap().to_vec_f64());
    use weft_nn::state_dict::TensorSource;
    assert!(!folder
        .weights
        .names()
        .iter()
        .any(|n| n.contains("qkv_proj") || n.contains("gate_up")));
    // absent, Phi-3 has no window (Mistral's default is 4096)
    let k = keys("phi3", &|c| {
        c.as_object_mut().unwrap().remove("sliding_window");
    })
    .unwrap();
    assert_eq!(k["block_size"], json!(32));
    for key in ["resid_pdrop", "embd_pdrop", "attention_dropout"] {
        let e = keys("phi3", &|c| c[key] = json!(0.1)).unwrap_err();
        assert!(
            e.contains(&format!("config.json: {key}: 0.1: weft's llama has no dropout")),
            "{e}"
        );
    }
    // Llama's attention dropout too; the residual and embedding dropouts are Phi-3's keys alone
    let e = keys("llama_gqa", &|c| c["attention_dropout"] = json!(0.1)).unwrap_err();
    assert!(e.contains("config.json: attention_dropout: 0.1"), "{e}");
    keys("llama_gqa", &|c| c["resid_pdrop"] = json!(0.1)).unwrap();
    // absent, Phi3Config's epsilon (1e-5; transformers' others default to 1e-6)
    let k = keys("phi3", &|c| {
        c.as_object_mut().unwrap().remove("rms_norm_eps");
    })
    .unwrap();
    assert_eq!(k["norm_eps"], json!(1e-5));
    // pad_token_id is the embedding's padding row (0 included), written back as such; one
    // past the vocabulary is refused
    let k = keys("phi3", &|c| c["pad_token_id"] = json!(0)).unwrap();
    assert_eq!(k["padding_idx"], json!(0));
    let written = hf::from_weft_keys(&keys("phi3", &|c| c["pad_token_id"] = json!(32)).unwrap()).unwrap();
    assert_eq!(written["pad_token_id"], json!(32));
    let e = keys("phi3", &|c| c["pad_token_id"] = json!(33)).unwrap_err();
    assert!(
        e.contains("config.json: pad_token_id: 33 is not a token id (vocab_size 33)"),
        "{e}"
    );
    let e = keys("phi3", &|c| c["rope_parameters"]["partial_rotary_factor"] = json!(0.75)).unwrap_err();
    assert!(e.contains("partial_rotary_factor: 0.75"), "{e}");
    // a config whose sizes do not make the fused tensor's rows names the tensor
    let d = copy_as("phi3", "heads");
    let path = d.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["num_key_value_heads"] = json!(4);
    std::fs::write(&path, c.to_string()).unwrap();
    let e = hf::open_folder(&d).err().unwrap().to_string();
    assert!(
        e.contains("self_attn.qkv_proj.weight has shape [64, 32], but the config's sizes make it 96 rows"),
        "{e}"
    );
}

/// Qwen3 folders read as a llama with norms on the query and key heads and heads of their own
/// width; a Llama `head_dim` other than `hidden_size / num_attention_heads` is kept, one equal
/// to it left out. Qwen3's biases (on o_proj too) and sliding windows are refused naming the key.
#[test]
fn qwen3_and_head_dim_folders_read_as_llama() {
    let qwen3 = hf::read_folder(&fixture("qwen3")).unwrap();
    assert_eq!(qwen3.model["kind"], json!("llama"));
    assert_eq!(qwen3.model["qk_norm"], json!(true));
    assert_eq!(qwen3.model["head_dim"], json!(16));
    assert_eq!(qwen3.model["n_kv_head"], json!(2));
    assert!(!qwen3.model.contains_key("qkv_bias"));
    assert_eq!(qwen3.tensors["model.layers.1.self_attn.k_norm.weight"].shape(), [16]);
    assert_eq!(
        qwen3.tensors["model.layers.0.self_attn.q_proj.weight"].shape(),
        [64, 32]
    );
    assert_eq!(
        qwen3.tensors["model.layers.0.self_attn.o_proj.weight"].shape(),
        [32, 64]
    );
    let wide = hf::read_folder(&fixture("llama_head_dim")).unwrap();
    assert_eq!(wide.model["head_dim"], json!(12));
    assert!(!wide.model.contains_key("qk_norm"));
    // absent, Qwen3's default head width is a fixed 128; Llama's hidden_size / heads
    let k = keys("qwen3", &|c| {
        c.as_object_mut().unwrap().remove("head_dim");
    })
    .unwrap();
    assert_eq!(k["head_dim"], json!(128));
    let k = keys("llama_head_dim", &|c| {
        c.as_object_mut().unwrap().remove("head_dim");
    })
    .unwrap();
    assert!(!k.contains_key("head_dim"));
    // equal to hidden_size / heads (8 here) it is the same model, and left out
    let k = keys("qwen3", &|c| c["head_dim"] = json!(8)).unwrap();
    assert!(!k.contains_key("head_dim"));
    let e = keys("llama_head_dim", &|c| c["head_dim"] = json!(0)).unwrap_err();
    assert!(
        e.contains("config.json: head_dim: expected a positive integer, got 0"),
        "{e}"
    );
    let e = keys("qwen3", &|c| c["attention_bias"] = json!(true)).unwrap_err();
    assert!(e.contains("config.json: attention_bias: true"), "{e}");
    let e = keys("qwen3", &|c| c["use_sliding_window"] = json!(true)).unwrap_err();
    assert!(e.contains("config.json: use_sliding_window: true"), "{e}");
    let e = keys("qwen3", &|c| {
        c["layer_types"] = json!(["sliding_attention", "full_attention"])
    })
    .unwrap_err();
    assert!(e.contains("config.json: layer_types"), "{e}");
    // the kind from model_type when architectures is absent
    let k = keys("qwen3", &|c| {
        c.as_object_mut().unwrap().remove("architectures");
    })
    .unwrap();
    assert_eq!(k["qk_norm"], json!(true));
    // a [model] head width the weights do not have names the key and the tensor
    let mut cfg = support::llama_config(&serde_json::Value::Object(wide.model.clone()));
    cfg.head_dim = Some(16);
    let shapes: BTreeMap<String, Vec<usize>> = wide
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.shape().to_vec()))
        .collect();
    let e = cfg.check_shapes(&shapes).unwrap_err().to_string();
    assert!(
        e.contains("model.head_dim: 16, but model.layers.0.self_attn.q_proj.weight has shape [48, 32], not [n_head * head_dim, n_embd] = [64, 32]"),
        "{e}"
    );
    // Qwen3's attention with biases on q, k and v has no form transformers reads as weft computes
    let mut both = qwen3.model.clone();
    both.insert("qkv_bias".into(), json!(true));
    let e = hf::write_folder(&temp("qwen3-biased"), &both, &BTreeMap::new(), &[]).unwrap_err();
    assert!(e.to_string().contains("model.qkv_bias with model.qk_norm"), "{e}");
}

/// Llama 3.1's rope scaling, as transformers 5 saves it (`rope_parameters`), and linear scaling in
/// the older form (`rope_scaling` with `type`, a top-level `rope_theta`), both read into weft's
/// `[model] rope_scaling`.
#[test]
fn rope_scaling_reads_in_both_of_transformers_forms() {
    let llama3 = hf::read_folder(&fixture("llama_rope_llama3")).unwrap().model;
    assert_eq!(llama3["rope_theta"], json!(10000.0));
    assert_eq!(
        llama3["rope_scaling"],
        json!({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64})
    );
    let linear = hf::read_folder(&fixture("llama_rope_linear")).unwrap().model;
    assert_eq!(linear["rope_theta"], json!(1000.0));
    assert_eq!(linear["rope_scaling"], json!({"rope_type": "linear", "factor": 2.5}));
    // without `original_max_position_embeddings` llama3 takes max_position_embeddings, and a
    // top-level one comes first (as transformers reads them)
    let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
        keys("llama_rope_llama3", edit).unwrap()["rope_scaling"]["original_max_position_embeddings"].clone()
    };
    assert_eq!(
        edited(&|c| {
            c["rope_parameters"]["original_max_position_embeddings"].take();
        }),
        json!(128)
    );
    assert_eq!(
        edited(&|c| c["original_max_position_embeddings"] = json!(32)),
        json!(32)
    );
    // a plain folder has no rope_scaling key
    let plain = hf::read_folder(&fixture("llama_tied")).unwrap().model;
    assert!(!plain.contains_key("rope_scaling"), "{plain:?}");
}

#[test]
fn a_gpt2_head_must_be_the_token_embedding() {
    let d = copy_of("gpt2");
    let file = d.join("model.safetensors");
    let mut tensors = safetensors::load(&file).unwrap().tensors;
    let wte = tensors["transformer.wte.weight"].clone();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    // a head equal to the embedding (as older files hold it) is taken
    tensors.insert("lm_head.weight".into(), wte.contiguous().unwrap());
    safetensors::save(&file, tensors.iter().map(|(n, t)| (n.as_str(), t)), &meta).unwrap();
    let ck = hf::read_folder(&d).unwrap();
    assert!(!ck.tensors.contains_key("lm_head.weight"));
    // one that differs is not: weft's gpt ties them
    tensors.insert("lm_head.weight".into(), wte.affine(1.0, 1e-3).unwrap());
    safetensors::save(&file, tensors.iter().map(|(n, t)| (n.as_str(), t)), &meta).unwrap();
    let e = hf::read_folder(&d)
        .err()
        .expect("an untied head is refused")
        .to_string();
    assert!(e.contains("lm_head.weight differs"), "{e}");
}

/// Replaces tensor `name` of `file` by `t`.
fn replace_tensor(file: &Path, name: &str, t: weft_core::Tensor) {
    let mut tensors = safetensors::load(file).unwrap().tensors;
    tensors.insert(name.into(), t);
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::save(file, tensors.iter().map(|(n, t)| (n.as_str(), t)), &meta).unwrap();
}

/// A GPT-2 Conv1D weight that is not a matrix is named with its file and its shape as stored,
/// before the transpose (which failed with only "t: needs rank >= 2, got shape [768]", or
/// quoted a 3-D shape transposed).
#[test]
fn a_gpt2_conv1d_weight_of_another_rank_is_named_as_stored() {
    let name = "transformer.h.0.attn.c_attn.weight";
    for shape in [vec![3072], vec![2, 32, 48]] {
        let d = copy_as("gpt2", &format!("conv1d-rank-{}", shape.len()));
        let file = d.join("model.safetensors");
        let shape_i: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        let raw = safetensors::load(&file).unwrap().tensors[name]
            .reshape(&shape_i)
            .unwrap();
        replace_tensor(&file, name, raw);
        let e = hf::read_folder(&d)
            .err()
            .expect("a Conv1D weight that is not a matrix is refused")
            .to_string();
        let want = format!(
            "{}: {name} has shape {shape:?}, but a GPT-2 Conv1D weight is a matrix",
            file.display()
        );
        assert!(e.contains(&want), "{e}\nshould contain {want}");
    }
}

/// Makes a FIFO at `path`.
#[cfg(unix)]
fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

/// A weights file or index that is there but is not a regular file (a FIFO, a directory, a
/// link to /dev/zero) is named as such, not taken for a missing one ("holds neither ...").
#[cfg(unix)]
#[test]
fn weights_that_are_not_files_are_named_as_such() {
    let cases: [(&str, &str, &str); 6] = [
        ("llama_gqa", "model.safetensors.index.json", "fifo"),
        ("llama_gqa", "model.safetensors.index.json", "dir"),
        ("llama_gqa", "model.safetensors.index.json", "zero"),
        ("gpt2", "model.safetensors", "fifo"),
        ("gpt2", "model.safetensors", "dir"),
        ("gpt2", "model.safetensors", "zero"),
    ];
    for (fixture_name, file, kind) in cases {
        let d = copy_as(fixture_name, &format!("not-a-file-{fixture_name}-{kind}"));
        let p = d.join(file);
        std::fs::remove_file(&p).unwrap();
        let want = match kind {
            "fifo" => {
                mkfifo(&p);
                "not a file (a FIFO)"
            }
            "dir" => {
                std::fs::create_dir(&p).unwrap();
                "not a file (a directory)"
            }
            _ => {
                std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
                "not a file (a character device)"
            }
        };
        let e = match hf::read_folder(&d) {
            Ok(_) => panic!("{file} as a {kind} read"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&format!("{}: {want}", p.display())), "{file} ({kind}): {e}");
    }
}

/// Writing into a folder that holds a sharded checkpoint (or any weights the write would not
/// replace) is refused naming them, and nothing is written: the new model.safetensors beside the
/// old index made weft (index first) and transformers (model.safetensors first) load different
/// weights from one folder. A folder written before is replaced.
#[test]
fn writing_over_other_weights_is_refused() {
    let ck = hf::read_folder(&fixture("llama_tied")).unwrap();
    let d = copy_as("llama_gqa", "over-shards");
    let before: Vec<(String, Vec<u8>)> = {
        let mut v: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let e = hf::write_folder(&d, &ck.model, &ck.tensors, &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "{}: holds model-00001-of-00004.safetensors, model-00002-of-00004.safetensors, \
             model-00003-of-00004.safetensors, model-00004-of-00004.safetensors, model.safetensors.index.json: \
             weights an export would leave beside",
            d.display()
        )),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    let mut after: Vec<(String, Vec<u8>)> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    after.sort();
    assert!(after == before, "the folder changed");
    // PyTorch weights too
    let d = temp("over-bin");
    std::fs::write(d.join("pytorch_model.bin"), b"x").unwrap();
    let e = hf::write_folder(&d, &ck.model, &ck.tensors, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds pytorch_model.bin: weights"), "{e}");
    assert!(!d.join("config.json").exists() && !d.join("model.safetensors").exists());
    // many shards: the first few are listed, the rest counted
    let d = temp("over-many");
    for i in 1..=9 {
        std::fs::write(d.join(format!("model-{i:05}-of-00009.safetensors")), b"x").unwrap();
    }
    let e = hf::write_folder(&d, &ck.model, &ck.tensors, &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model-00006-of-00009.safetensors and 3 more: weights"),
        "{e}"
    );
    // a config.json that is not a file is refused before model.safetensors is written
    let d = temp("over-config-dir");
    std::fs::create_dir(d.join("config.json")).unwrap();
    let e = hf::write_folder(&d, &ck.model, &ck.tensors, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json: not a file (a directory)"), "{e}");
    assert!(!d.join("model.safetensors").exists());
    // a folder written before (config.json, model.safetensors, a tokenizer.json) is replaced
    let d = temp("over-written");
    let gpt = hf::read_folder(&fixture("gpt2")).unwrap();
    hf::write_folder(&d, &gpt.model, &gpt.tensors, &[]).unwrap();
    std::fs::write(d.join("tokenizer.json"), "{}").unwrap();
    hf::write_folder(&d, &ck.model, &ck.tensors, &[]).unwrap();
    assert_eq!(hf::read_folder(&d).unwrap().model, ck.model);
}
