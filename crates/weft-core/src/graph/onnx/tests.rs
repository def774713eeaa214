use super::*;
use crate::DType;

fn spec(axes: Vec<DynamicAxis>) -> OnnxSpec {
    OnnxSpec {
        name: "t".into(),
        input_names: vec!["x".into()],
        output_names: vec!["y".into()],
        axes,
        ..Default::default()
    }
}

fn batch() -> DynamicAxis {
    DynamicAxis {
        name: "batch".into(),
        input: 0,
        dim: 0,
    }
}

#[test]
fn an_op_without_an_onnx_form_is_named() {
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let targets = Tensor::from_vec(vec![0i64, 2], &[2]).unwrap();
    let g = trace_inference(&[x], |xs| Ok(vec![xs[0].cross_entropy(&targets, -100, 0.0)?])).unwrap();
    let e = to_onnx(&[g], &spec(vec![])).unwrap_err().to_string();
    assert!(e.contains("cross_entropy") && e.contains("no ONNX form"), "{e}");
}

#[test]
fn a_size_that_is_no_product_of_the_axes_is_refused() {
    // the batch minus one
    let f = |xs: &[Tensor]| Ok(vec![xs[0].narrow(0, 1, xs[0].dim(0)? - 1)?.exp()?]);
    let traces: Vec<Graph> = [2, 3]
        .iter()
        .map(|&b| trace_inference(&[Tensor::zeros(&[b, 4], DType::F32).unwrap()], f).unwrap())
        .collect();
    let e = to_onnx(&traces, &spec(vec![batch()])).unwrap_err().to_string();
    assert!(e.contains("no product of the dynamic axes"), "{e}");
    // traces that do not differ in the axis are refused too
    let same = vec![traces[0].clone(), traces[0].clone()];
    let e = to_onnx(&same, &spec(vec![batch()])).unwrap_err().to_string();
    assert!(e.contains("two sizes"), "{e}");
}

#[test]
fn a_computation_that_changes_with_an_axis_is_refused() {
    // one more op at batch 3
    let f = |xs: &[Tensor]| {
        let y = xs[0].exp()?;
        Ok(vec![if xs[0].dim(0)? > 2 { y.exp()? } else { y }])
    };
    let traces: Vec<Graph> = [2, 3]
        .iter()
        .map(|&b| trace_inference(&[Tensor::zeros(&[b, 4], DType::F32).unwrap()], f).unwrap())
        .collect();
    let e = to_onnx(&traces, &spec(vec![batch()])).unwrap_err().to_string();
    assert!(e.contains("changes with dynamic axis batch"), "{e}");
}

fn seq() -> DynamicAxis {
    DynamicAxis {
        name: "seq".into(),
        input: 0,
        dim: 1,
    }
}

#[test]
fn a_constant_that_changes_with_an_axis_is_refused() {
    // the mean over the sequence written as a sum scaled by 1 / T: the scale is an attribute
    let f = |xs: &[Tensor]| {
        let t = xs[0].dim(1)? as f64;
        Ok(vec![xs[0].sum(&[1], false)?.mul_scalar(1.0 / t)?])
    };
    let traces: Vec<Graph> = [(2, 3), (3, 3), (2, 5)]
        .iter()
        .map(|&(b, t)| trace_inference(&[Tensor::zeros(&[b, t], DType::F32).unwrap()], f).unwrap())
        .collect();
    let e = to_onnx(&traces, &spec(vec![batch(), seq()])).unwrap_err().to_string();
    assert!(
        e.contains("dynamic axis seq") && e.contains("affine") && e.contains("node 1"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // with the sequence fixed, the batch alone is dynamic and the scale is right
    assert!(to_onnx(&traces[..2], &spec(vec![batch()])).is_ok());
}

#[test]
fn a_tensor_read_by_reference_must_be_the_same_in_every_trace() {
    let (a, b) = (
        Tensor::ones(&[4], DType::F32).unwrap(),
        Tensor::ones(&[4], DType::F32).unwrap(),
    );
    let traces: Vec<Graph> = [(2, &a), (3, &b)]
        .iter()
        .map(|&(n, w)| {
            trace_inference(&[Tensor::zeros(&[n, 4], DType::F32).unwrap()], |xs| {
                Ok(vec![xs[0].mul(w)?])
            })
            .unwrap()
        })
        .collect();
    let e = to_onnx(&traces, &spec(vec![batch()])).unwrap_err().to_string();
    assert!(
        e.contains("another tensor in each trace") && e.contains("node 0 (binary)"),
        "{e}"
    );
}

#[test]
fn a_capture_spoiled_by_a_lazy_cache_is_run_again() {
    let cache = std::cell::OnceCell::new();
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        let c = cache.get_or_init(|| Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap());
        Ok(vec![xs[0].add(c)?])
    })
    .unwrap();
    assert_eq!(g.nodes.len(), 1);
}

#[test]
fn dead_values_are_dropped() {
    let w = Tensor::ones(&[3], DType::F32).unwrap();
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        let _unused = xs[0].mul(&w)?.exp()?;
        Ok(vec![xs[0].exp()?])
    })
    .unwrap();
    assert_eq!((g.nodes.len(), g.values.len()), (1, 2));
    let mut s = spec(vec![]);
    s.named = vec![("w".into(), w.clone())];
    let out = to_onnx(&[g], &s).unwrap();
    assert_eq!(out.initializers, 0);
}

#[test]
fn names_that_clash_are_refused() {
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        Ok(vec![xs[0].exp()?])
    })
    .unwrap();
    let mut s = spec(vec![]);
    s.output_names = vec!["x".into()];
    let e = to_onnx(std::slice::from_ref(&g), &s).unwrap_err().to_string();
    assert!(e.contains("\"x\" is both an input and a graph output"), "{e}");
    // a name the exporter makes up is no clash for an ordinary one
    s.output_names = vec!["t1".into()];
    assert!(to_onnx(std::slice::from_ref(&g), &s).is_ok());
    // but one in its reserved prefix is caught
    s.output_names = vec!["/weft/t1".into()];
    let e = to_onnx(&[g], &s).unwrap_err().to_string();
    assert!(e.contains("\"/weft/t1\" is both"), "{e}");
}

#[test]
fn parameters_are_named_by_storage_and_layout() {
    let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let row = p.narrow(0, 1, 1).unwrap();
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        Ok(vec![xs[0].mul(&p)?.add(&row)?])
    })
    .unwrap();
    let named = vec![("p".to_string(), p.clone())];
    let (names, externals) = emit::initial_names(&g, &["x".to_string()], &named).unwrap();
    let mut held: Vec<(String, Vec<usize>)> = externals
        .iter()
        .map(|(v, n)| (n.clone(), g.values[*v].shape.clone()))
        .collect();
    held.sort();
    assert_eq!(
        held,
        vec![("/weft/const.1".to_string(), vec![1, 3]), ("p".to_string(), vec![2, 3])]
    );
    assert_eq!(names[g.inputs[0]], "x");
    // one name for two different tensors
    let q = Tensor::ones(&[2, 3], DType::F32).unwrap();
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        Ok(vec![xs[0].mul(&p)?.add(&q)?])
    })
    .unwrap();
    let named = vec![("w".to_string(), p.clone()), ("w".to_string(), q.clone())];
    let e = emit::initial_names(&g, &["x".to_string()], &named)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"w\" would hold two different tensors"), "{e}");
}

#[test]
fn a_model_past_protobufs_2_gib_is_refused_from_its_shapes() {
    // a weight of 2^31 f32 (8 GiB) read by reference: a broadcast view of one element, so
    // nothing of it is allocated, and the refusal comes before its bytes would be
    let big = Tensor::from_vec(vec![1.0f32], &[1, 1])
        .unwrap()
        .expand(&[1 << 16, 1 << 15])
        .unwrap();
    let g = trace_inference(&[Tensor::zeros(&[1, 1 << 15], DType::F32).unwrap()], |xs| {
        Ok(vec![xs[0].add(&big.narrow(0, 0, 1)?)?])
    })
    .unwrap();
    let mut s = spec(vec![]);
    s.named = vec![("big".into(), big.clone())];
    let e = to_onnx(&[g], &s).unwrap_err().to_string();
    assert!(
        // 8 GiB, and the slice's starts, ends and axes
        e.contains("take 8589934616 bytes (8.00 GiB)") && e.contains("2147483647 bytes (2 GiB)"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // the limit itself: 2 GiB less one byte is the largest message protobuf reads
    assert!(within_protobuf_limit(u128::from(MAX_FILE_BYTES), "x").is_ok());
    let e = within_protobuf_limit(1 << 31, "the ONNX file would take")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the ONNX file would take 2147483648 bytes (2.00 GiB)"),
        "{e}"
    );
    assert_eq!(data_bytes([&big]), 1 << 33);
}

#[test]
fn an_identity_affine_is_an_identity_and_u8_constants_are_written() {
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        Ok(vec![xs[0].affine(1.0, 0.0)?])
    })
    .unwrap();
    let out = to_onnx(&[g], &spec(vec![])).unwrap();
    // the affine's Identity and the output's
    assert_eq!((out.nodes, out.initializers), (2, 0));
    let g = trace_inference(&[Tensor::zeros(&[2, 3], DType::F32).unwrap()], |xs| {
        Ok(vec![Tensor::full(&[3], 7.0, DType::U8)?
            .cast(DType::F32)?
            .add(&xs[0].sum(&[0], false)?)?])
    })
    .unwrap();
    to_onnx(&[g], &spec(vec![])).unwrap();
}
