//! Autotuning (`weft_core::tune`, `graph::Autotune::Search`), in a process of its own: the
//! choices are process-wide, and tests of other files compare replays with eager runs bit for
//! bit.

use weft_core::graph::{Autotune, GraphCache};
use weft_core::op::Conv2dParams;
use weft_core::tune::{self, Kernel};
use weft_core::{DType, Generator, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn close(a: &Tensor, b: &Tensor, what: &str) {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}: element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn every_variant_computes_the_same_and_a_search_keeps_a_choice_per_shape() {
    // 1. each variant of each kernel, at shapes where they plan differently
    for (m, k, n) in [(64, 128, 10), (1024, 64, 96), (7, 300, 513), (300, 5, 2)] {
        let (a, b) = (randn(&[m, k], 1), randn(&[k, n], 2));
        let want = a.matmul(&b).unwrap();
        for v in 0..Kernel::Gemm.variants().len() as u8 {
            let got = tune::forced(Kernel::Gemm, v, || a.matmul(&b).unwrap());
            close(
                &got,
                &want,
                &format!("gemm {m}x{k}x{n} {}", Kernel::Gemm.variants()[v as usize]),
            );
        }
    }
    for (n, c, side, o, stride) in [(8, 3, 9, 5, 1), (1, 4, 8, 6, 1), (5, 2, 7, 3, 2)] {
        let (x, w, bias) = (randn(&[n, c, side, side], 3), randn(&[o, c, 3, 3], 4), randn(&[o], 5));
        let p = Conv2dParams {
            stride: (stride, stride),
            padding: (1, 1),
            ..Conv2dParams::new()
        };
        let want = x.conv2d(&w, Some(&bias), p).unwrap();
        for v in 0..Kernel::Conv2d.variants().len() as u8 {
            let got = tune::forced(Kernel::Conv2d, v, || x.conv2d(&w, Some(&bias), p).unwrap());
            close(
                &got,
                &want,
                &format!("conv2d n={n} stride={stride} {}", Kernel::Conv2d.variants()[v as usize]),
            );
        }
    }

    // attention: every tile gives the rule's output bit for bit (each row's softmax runs over its
    // own visible keys, whatever the tile) and its gradients within rounding (the key and value
    // gradients sum over tiles of queries, grouped by the tile), causal or not, with a last tile
    // cut short (t = 40) and a problem shorter than one tile (t = 7)
    for (b, t, heads, hd, causal) in [
        (2, 40, 2, 16, true),
        (1, 64, 2, 8, false),
        (3, 7, 1, 4, true),
        (1, 100, 1, 32, false),
    ] {
        let qkv = randn(&[b, t, 3 * heads * hd], 9);
        qkv.set_requires_grad(true).unwrap();
        let go = randn(&[b, t, heads * hd], 10);
        let run = || {
            qkv.set_grad(None);
            let o = qkv.qkv_attention(heads, causal, None).unwrap();
            o.backward_with(&go).unwrap();
            (o.detach(), qkv.grad().unwrap())
        };
        let (want_o, want_g) = run();
        for v in 0..Kernel::Attention.variants().len() as u8 {
            let (o, g) = tune::forced(Kernel::Attention, v, run);
            let name = format!(
                "attention t={t} causal={causal} {}",
                Kernel::Attention.variants()[v as usize]
            );
            let (got, want) = (o.to_vec::<f32>().unwrap(), want_o.to_vec::<f32>().unwrap());
            let first = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(first, None, "{name}: output differs first at element {first:?}");
            close(&g, &want_g, &format!("{name}: gradient"));
        }
        // the variants plan tiles of their own where the problem is long enough
        let plans: Vec<Vec<String>> = (0..4u8)
            .map(|v| {
                tune::planned(|| tune::forced(Kernel::Attention, v, || qkv.qkv_attention(heads, causal, None).unwrap()))
                    .1
            })
            .collect();
        assert!(plans.iter().all(|p| p.len() == 1), "{plans:?}");
        if t >= 64 {
            assert!(plans[1] != plans[2] && plans[2] != plans[3], "t={t}: {plans:?}");
        }
    }

    // 2. a search in a cache folder of this test
    let dir = std::env::temp_dir().join(format!("weft-autotune-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("WEFT_CACHE_DIR", &dir);
    let (w1, w2) = (randn(&[96, 64], 6), randn(&[10, 96], 7));
    let f = |xs: &[Tensor]| -> weft_core::Result<Vec<Tensor>> {
        Ok(vec![xs[0].linear(&w1, None)?.relu()?.linear(&w2, None)?])
    };
    let x = randn(&[256, 64], 8);
    let want = f(std::slice::from_ref(&x)).unwrap();
    let mut cache = GraphCache::new(1).with_autotune(Autotune::Search);
    cache.call(std::slice::from_ref(&x), f).unwrap(); // capture
    assert!(cache.take_tune_report().is_none());
    let tuned = cache.call(std::slice::from_ref(&x), f).unwrap(); // the search
    close(&tuned[0], &want[0], "the tuned replay");
    let report = cache.take_tune_report().expect("the first replay searched");
    assert_eq!(report.searched.len(), 2, "{report:?}");
    for e in &report.searched {
        assert!(e.key.starts_with("gemm f32 m=256 "), "{}", e.key);
        assert!(tune::chosen(&e.key).is_some());
        // a variant other than the rule only when it was faster by the margin
        assert!(e.chosen == "heuristic" || e.chosen_ms < 0.95 * e.heuristic_ms, "{e:?}");
    }
    assert!(
        report.to_table().contains("| f32 m=256 n=96 k=64 a="),
        "{}",
        report.to_table()
    );
    // later replays run the choices and search nothing
    let again = cache.call(std::slice::from_ref(&x), f).unwrap();
    close(&again[0], &want[0], "a replay after the search");
    assert!(cache.take_tune_report().is_none());

    // 3. the cache file: written, read back into a fresh table, a damaged one ignored
    let file = tune::cache_file();
    assert!(file.starts_with(&dir), "{}", file.display());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("weft-autotune-2") && text.contains("gemm f32 m=256 n=96 k=64 a="),
        "{text}"
    );
    tune::clear();
    assert_eq!(tune::load_cache(), (2, None));
    assert!(tune::chosen(&report.searched[0].key).is_some());
    std::fs::write(&file, b"{ not json").unwrap();
    tune::clear();
    let (n, warning) = tune::load_cache();
    assert_eq!(n, 0);
    let warning = warning.expect("a damaged file is named");
    assert!(
        warning.contains("not JSON") && warning.contains("rewritten"),
        "{warning}"
    );
    std::fs::write(&file, br#"{"format": "weft-autotune-1", "choices": {}}"#).unwrap();
    assert!(tune::load_cache().1.unwrap().contains("weft-autotune-1"));
    // one bad choice: none of the file's choices is taken
    let good = "gemm f32 m=1 n=2 k=3 threads=1";
    std::fs::write(
        &file,
        format!(r#"{{"format": "weft-autotune-2", "choices": {{"{good}": "one-thread", "gemm x": "fastest"}}}}"#),
    )
    .unwrap();
    let (n, warning) = tune::load_cache();
    assert_eq!(n, 0);
    assert!(warning.unwrap().contains("\"fastest\""));
    assert_eq!(tune::chosen(good), None);
    // another run's choices of other shapes are kept when this process writes the file
    std::fs::write(
        &file,
        format!(r#"{{"format": "weft-autotune-2", "choices": {{"{good}": "one-thread"}}}}"#),
    )
    .unwrap();
    // a search rewrites it
    let mut cache = GraphCache::new(1).with_autotune(Autotune::Search);
    cache.call(std::slice::from_ref(&x), f).unwrap();
    cache.call(std::slice::from_ref(&x), f).unwrap();
    assert_eq!(cache.take_tune_report().unwrap().searched.len(), 2);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("weft-autotune-2") && text.contains("gemm f32 m=256 n=96 k=64 a="),
        "{text}"
    );
    assert!(text.contains(good), "{text}");
    tune::clear();
    let _ = std::fs::remove_dir_all(&dir);
}
