//! `weft export onnx`: each model kind's inference forward, exported and run by another ONNX
//! runtime (tract), gives weft's logits within 1e-5 (of their largest magnitude), at batch and sequence sizes other than the
//! ones traced (the axes are dynamic).

use tract_onnx::prelude::*;
use weft_core::{DType, Tensor};
use weft_train::config::ModelConfig;
use weft_train::export::export_model;

/// Largest `|a - b|`, relative to the logits' scale: `max(1, max |b|)`.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, y| m.max(y.abs()));
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

/// Exports the model of `config` (drawn from `seed`) and compares tract's logits with weft's on
/// each input of `inputs`.
fn check(config: serde_json::Value, seed: u64, seq_len: Option<usize>, inputs: &[Tensor]) -> usize {
    let cfg: ModelConfig = serde_json::from_value(config).unwrap();
    let model = weft_train::run::build_model(&cfg, seed).unwrap();
    // weights of std 0.5 rather than 0.02, so that activations and logits are of order one and
    // a mistake (a mask, a constant) shows far above the tolerance
    for (_, p) in model.parameters() {
        if p.rank() >= 2 {
            p.copy_from(&p.mul_scalar(25.0).unwrap()).unwrap();
        }
    }
    let (exported, summary) = export_model(model.as_ref(), &cfg, None, "a test", seq_len).unwrap();
    assert_eq!(summary.kind, cfg.kind());
    for x in inputs {
        let want: Vec<f32> = weft_core::no_grad(|| model.logits(x)).unwrap().to_vec::<f32>().unwrap();
        let shape: TVec<usize> = x.shape().iter().copied().collect();
        let (fact, input): (InferenceFact, TValue) = match x.dtype() {
            DType::I64 => (
                InferenceFact::dt_shape(i64::datum_type(), shape.clone()),
                tract_ndarray::ArrayD::from_shape_vec(shape.to_vec(), x.to_vec::<i64>().unwrap())
                    .unwrap()
                    .into_tvalue(),
            ),
            _ => (
                InferenceFact::dt_shape(f32::datum_type(), shape.clone()),
                tract_ndarray::ArrayD::from_shape_vec(shape.to_vec(), x.to_vec::<f32>().unwrap())
                    .unwrap()
                    .into_tvalue(),
            ),
        };
        let runnable = tract_onnx::onnx()
            .model_for_read(&mut exported.bytes.as_slice())
            .unwrap()
            .with_input_fact(0, fact)
            .unwrap()
            .into_optimized()
            .unwrap()
            .into_runnable()
            .unwrap();
        let out = runnable.run(tvec!(input)).unwrap();
        let got = out[0].clone().into_tensor();
        let got = got.to_plain_array_view::<f32>().unwrap();
        let got_shape = got.shape().to_vec();
        let got: Vec<f32> = got.iter().copied().collect();
        let mut want_shape = x.shape()[..x.rank().min(2)].to_vec();
        if x.dtype() != DType::I64 {
            want_shape.truncate(1);
        }
        assert_eq!(&got_shape[..want_shape.len()], want_shape.as_slice(), "{:?}", x.shape());
        let err = worst(&got, &want);
        assert!(
            err <= 1e-5,
            "{}: input {:?}: worst difference {err} of the logits' scale",
            cfg.kind(),
            x.shape()
        );
    }
    exported.nodes
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut weft_core::Generator::new(seed)).unwrap()
}

fn ids(b: usize, t: usize, vocab: usize) -> Tensor {
    let v: Vec<i64> = (0..b * t).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
    Tensor::from_vec(v, &[b, t]).unwrap()
}

#[test]
fn an_mlp_exports_with_a_dynamic_batch() {
    let cfg = serde_json::json!({"kind": "mlp", "in_features": 20, "hidden": [32, 16], "out_features": 5,
        "activation": "gelu"});
    check(cfg, 1, None, &[randn(&[1, 20], 2), randn(&[7, 20], 3)]);
    let cfg = serde_json::json!({"kind": "mlp", "in_features": 6, "hidden": [8], "out_features": 3,
        "activation": "tanh"});
    check(cfg, 4, None, &[randn(&[5, 6], 5)]);
}

#[test]
fn a_convnet_exports_with_a_dynamic_batch() {
    let cfg = serde_json::json!({"kind": "convnet", "in_channels": 1, "image_size": 8, "channels": [4, 8],
        "num_classes": 10});
    check(cfg, 1, None, &[randn(&[1, 1, 8, 8], 2), randn(&[6, 1, 8, 8], 3)]);
}

#[test]
fn a_gpt_exports_with_dynamic_batch_and_sequence() {
    for (bias, activation) in [(true, "gelu"), (false, "gelu_tanh")] {
        let cfg = serde_json::json!({"kind": "gpt", "vocab_size": 50, "block_size": 16, "n_layer": 2,
            "n_head": 2, "n_embd": 16, "bias": bias, "dropout": 0.0, "activation": activation});
        check(cfg, 7, None, &[ids(1, 1, 50), ids(2, 7, 50), ids(4, 16, 50)]);
    }
    // a fixed length
    let cfg = serde_json::json!({"kind": "gpt", "vocab_size": 50, "block_size": 16, "n_layer": 1,
        "n_head": 2, "n_embd": 16, "bias": true, "dropout": 0.1});
    check(cfg, 8, Some(6), &[ids(3, 6, 50)]);
}

#[test]
fn a_llama_exports_with_dynamic_batch_and_sequence() {
    // grouped-query attention, and tied embeddings
    for (kv, tied) in [(2, false), (4, true)] {
        let cfg = serde_json::json!({"kind": "llama", "vocab_size": 40, "block_size": 32, "n_layer": 2,
            "n_head": 4, "n_kv_head": kv, "n_embd": 32, "intermediate_size": 40, "tie_embeddings": tied});
        check(cfg, 9, None, &[ids(1, 1, 40), ids(3, 9, 40), ids(2, 32, 40)]);
    }
    // Qwen3's attention: heads of their own width, an RMSNorm over each query and key head
    let cfg = serde_json::json!({"kind": "llama", "vocab_size": 40, "block_size": 32, "n_layer": 2,
        "n_head": 4, "n_kv_head": 2, "n_embd": 32, "intermediate_size": 40, "head_dim": 12,
        "qk_norm": true});
    check(cfg, 10, None, &[ids(1, 1, 40), ids(3, 9, 40)]);
}

#[test]
fn a_language_model_declares_its_input_with_named_axes() {
    use tract_onnx::pb::tensor_shape_proto::dimension::Value as D;
    use tract_onnx::pb::type_proto::Value as T;
    use tract_onnx::tract_hir::infer::Factoid;
    let cfg: ModelConfig = serde_json::from_value(serde_json::json!({"kind": "llama", "vocab_size": 40,
        "block_size": 16, "n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "intermediate_size": 24}))
    .unwrap();
    let model = weft_train::run::build_model(&cfg, 3).unwrap();
    let (exported, _) = export_model(model.as_ref(), &cfg, None, "a test", None).unwrap();
    // as the file declares it
    let proto = tract_onnx::onnx()
        .proto_model_for_read(&mut exported.bytes.as_slice())
        .unwrap();
    let graph = proto.graph.unwrap();
    let input = &graph.input[0];
    assert_eq!(input.name, "input_ids");
    let Some(T::TensorType(t)) = input.r#type.as_ref().and_then(|t| t.value.clone()) else {
        panic!("input 0 has no tensor type: {input:?}")
    };
    assert_eq!(t.elem_type, 7, "INT64");
    let dims: Vec<Option<D>> = t.shape.unwrap().dim.into_iter().map(|d| d.value).collect();
    assert_eq!(
        dims,
        vec![Some(D::DimParam("batch".into())), Some(D::DimParam("seq".into()))]
    );
    // and as tract reads it, with no input fact given
    let model = tract_onnx::onnx()
        .model_for_read(&mut exported.bytes.as_slice())
        .unwrap();
    let fact = model.input_fact(0).unwrap();
    assert_eq!(fact.datum_type.concretize(), Some(i64::datum_type()));
    let shape = format!("{:?}", fact.shape);
    assert!(shape.contains("batch") && shape.contains("seq"), "{shape}");
}

#[test]
fn bad_requests_are_refused_with_one_line() {
    let cfg: ModelConfig = serde_json::from_value(serde_json::json!({"kind": "gpt", "vocab_size": 50,
        "block_size": 4, "n_layer": 1, "n_head": 2, "n_embd": 8, "bias": true, "dropout": 0.0}))
    .unwrap();
    let model = weft_train::run::build_model(&cfg, 1).unwrap();
    let e = export_model(model.as_ref(), &cfg, None, "t", Some(5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--seq-len: 5") && e.contains("block_size 4") && !e.contains('\n'),
        "{e}"
    );
    let e = export_model(model.as_ref(), &cfg, None, "t", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("too short") && e.contains("--seq-len") && !e.contains('\n'),
        "{e}"
    );
    assert!(export_model(model.as_ref(), &cfg, None, "t", Some(4)).is_ok());
    // a block_size whose rotary tables cannot be held is refused, without allocating them
    for block in [1usize << 40, 1 << 62] {
        let cfg: ModelConfig = serde_json::from_value(serde_json::json!({"kind": "llama", "vocab_size": 40,
            "block_size": block, "n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16,
            "intermediate_size": 24}))
        .unwrap();
        let model = weft_train::run::build_model(&cfg, 1).unwrap();
        let e = export_model(model.as_ref(), &cfg, None, "t", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rotary embeddings") && !e.contains('\n'), "{e}");
        // a --seq-len beyond it is checked first
        let e = export_model(model.as_ref(), &cfg, None, "t", Some(block + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--seq-len"), "{e}");
        // a short fixed length needs short tables only
        assert!(export_model(model.as_ref(), &cfg, None, "t", Some(4)).is_ok());
    }
}
