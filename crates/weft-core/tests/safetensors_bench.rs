//! A measurement, not a check: writes, opens or loads a GPT-sized safetensors file and says how
//! long it took (peak memory comes from the caller, `/usr/bin/time -v`). Ignored by default;
//! docs/benchmarks.md gives the commands:
//!
//! `WEFT_ST_BENCH=write:/path/model.safetensors cargo test --release -p weft-core --test
//! safetensors_bench -- --ignored` writes a GPT-2-style checkpoint (n_embd 1024, n_layer 24,
//! vocab 50304, block 1024: 355M f32 values, 1.42 GB); `load:PATH` reads every tensor of it
//! through `safetensors::load`; `open:PATH` opens it lazily and reads one block's weights.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use weft_core::io::safetensors;
use weft_core::{DType, Tensor};

const EMBD: usize = 1024;
const LAYERS: usize = 24;

fn gpt_shapes() -> Vec<(String, Vec<usize>)> {
    let mut v = vec![
        ("transformer.wte.weight".to_string(), vec![50304, EMBD]),
        ("transformer.wpe.weight".to_string(), vec![1024, EMBD]),
        ("transformer.ln_f.weight".to_string(), vec![EMBD]),
        ("transformer.ln_f.bias".to_string(), vec![EMBD]),
    ];
    for l in 0..LAYERS {
        let p = format!("transformer.h.{l}");
        for (n, s) in [
            ("ln_1.weight", vec![EMBD]),
            ("ln_1.bias", vec![EMBD]),
            ("attn.c_attn.weight", vec![3 * EMBD, EMBD]),
            ("attn.c_attn.bias", vec![3 * EMBD]),
            ("attn.c_proj.weight", vec![EMBD, EMBD]),
            ("attn.c_proj.bias", vec![EMBD]),
            ("ln_2.weight", vec![EMBD]),
            ("ln_2.bias", vec![EMBD]),
            ("mlp.c_fc.weight", vec![4 * EMBD, EMBD]),
            ("mlp.c_fc.bias", vec![4 * EMBD]),
            ("mlp.c_proj.weight", vec![EMBD, 4 * EMBD]),
            ("mlp.c_proj.bias", vec![EMBD]),
        ] {
            v.push((format!("{p}.{n}"), s));
        }
    }
    v
}

#[test]
#[ignore = "a measurement: run with WEFT_ST_BENCH=write|open|load:PATH (see docs/benchmarks.md)"]
fn safetensors_bench() {
    let Ok(spec) = std::env::var("WEFT_ST_BENCH") else {
        writeln!(
            std::io::stderr(),
            "skipped: WEFT_ST_BENCH=write|open|load:PATH is not set"
        )
        .unwrap();
        return;
    };
    let (mode, path) = spec.split_once(':').expect("WEFT_ST_BENCH is MODE:PATH");
    let path = Path::new(path);
    let t0 = Instant::now();
    let (tensors, bytes) = match mode {
        "write" => {
            let named: Vec<(String, Tensor)> = gpt_shapes()
                .into_iter()
                .map(|(n, s)| (n, Tensor::full(&s, 0.5, DType::F32).unwrap()))
                .collect();
            let t0 = Instant::now();
            safetensors::save(path, named.iter().map(|(n, t)| (n.as_str(), t)), &BTreeMap::new()).unwrap();
            writeln!(std::io::stderr(), "write: {:.3} s", t0.elapsed().as_secs_f64()).unwrap();
            let bytes: usize = named.iter().map(|(_, t)| t.numel() * 4).sum();
            (named.len(), bytes)
        }
        "load" => {
            let file = safetensors::load(path).unwrap();
            let bytes = file.tensors.values().map(|t| t.numel() * 4).sum();
            (file.tensors.len(), bytes)
        }
        "open" => {
            let file = safetensors::SafeTensorsFile::open(path).unwrap();
            let t = file.tensor("transformer.h.0.mlp.c_fc.weight").unwrap();
            (file.names().count(), t.numel() * 4)
        }
        m => panic!("WEFT_ST_BENCH mode {m:?} is not write, open or load"),
    };
    writeln!(
        std::io::stderr(),
        "{mode}: {tensors} tensors, {bytes} tensor bytes in memory, {:.3} s",
        t0.elapsed().as_secs_f64()
    )
    .unwrap();
}
