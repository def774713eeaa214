//! The planner's accounting against weft's own: its parameter counts are weft's models', its
//! memory terms weft-train's estimate, and its activation bytes what weft's autograd graph keeps
//! (tensor-parallel or not, f32 and bf16) and what an interleaved pipeline's stages held.

mod common;

use common::temp_dir;
use weft_train::config::{ModelConfig, Overrides, RunConfig};

fn config(model: &str) -> RunConfig {
    let text = format!(
        "[model]\n{model}\n[data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 8\n\
         [optim]\nkind = \"adamw\"\nlr = 0.001\n[train]\nsteps = 1\n"
    );
    let cwd = std::env::current_dir().unwrap();
    RunConfig::parse(
        &text,
        "test",
        cwd.clone(),
        &Overrides {
            unset: vec![],
            set: vec![],
            cwd,
        },
    )
    .unwrap()
}

#[test]
fn the_planners_parameter_counts_are_weft_models() {
    let gpt = config(
        "kind = \"gpt\"\nvocab_size = 67\nblock_size = 12\nn_layer = 3\nn_head = 2\nn_embd = 16\nbias = true\n\
         dropout = 0.0",
    );
    let nobias = config(
        "kind = \"gpt\"\nvocab_size = 50\nblock_size = 8\nn_layer = 2\nn_head = 4\nn_embd = 8\nbias = false\n\
         dropout = 0.0",
    );
    let llama = config(
        "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 3\nn_head = 4\nn_kv_head = 2\nn_embd = 16\n\
         intermediate_size = 24",
    );
    let tied = config(
        "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 2\nn_head = 4\nn_kv_head = 1\nn_embd = 16\n\
         intermediate_size = 40\ntie_embeddings = true",
    );
    // Qwen3's attention: heads of 6 (not 16 / 4), q and k normed per head
    let qwen3 = config(
        "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 3\nn_head = 4\nn_kv_head = 2\nn_embd = 16\n\
         head_dim = 6\nqk_norm = true\nintermediate_size = 24",
    );
    // a width that does not divide by the heads, with q, k and v biases
    let odd = config(
        "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 2\nn_head = 3\nn_kv_head = 1\nn_embd = 20\n\
         head_dim = 8\nqkv_bias = true\nintermediate_size = 24\ntie_embeddings = true",
    );
    for c in [gpt, nobias, llama, tied, qwen3, odd] {
        let shape = weft_train::plan_shape::model_shape(&c.model).unwrap();
        let built: usize = match &c.model {
            ModelConfig::Gpt(g) => {
                let m = weft_models::gpt::Gpt::new(g.to_config(), 0).unwrap();
                weft_nn::Module::parameters(&m).iter().map(|(_, t)| t.numel()).sum()
            }
            ModelConfig::Llama(l) => {
                let m = weft_models::llama::Llama::new(l.to_config(), 0).unwrap();
                weft_nn::Module::parameters(&m).iter().map(|(_, t)| t.numel()).sum()
            }
            _ => unreachable!(),
        };
        assert_eq!(shape.parameter_count(), built as f64, "{:?}", c.model);
        assert_eq!(shape.parameter_count(), weft_train::memory::parameter_count(&c.model));
    }
    // a model the planner does not plan
    let mlp = ModelConfig::Mlp(weft_train::config::MlpKeys {
        in_features: 4,
        hidden: vec![8],
        out_features: 2,
        activation: "relu".into(),
    });
    let e = weft_train::plan_shape::model_shape(&mlp).unwrap_err();
    assert!(e.contains("gpt and llama"), "{e}");
}

#[test]
fn the_planners_memory_terms_are_weft_trains_estimate() {
    use weft_plan::{CommDtype, Layout, Schedule};
    let gpt = "kind = \"gpt\"\nvocab_size = 67\nblock_size = 12\nn_layer = 3\nn_head = 2\nn_embd = 16\nbias = true\n\
               dropout = 0.0";
    let llama = "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n\
                 n_embd = 16\nintermediate_size = 24";
    let qwen3 = "kind = \"llama\"\nvocab_size = 50\nblock_size = 8\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n\
                 n_embd = 16\nhead_dim = 6\nqk_norm = true\nintermediate_size = 24";
    for model in [gpt, llama, qwen3] {
        // `sp`: sequence-parallel
        for (dp, tp, zero, precision, sp) in [
            (1, 1, 0, "f32", false),
            (4, 1, 0, "f32", false),
            (4, 1, 1, "f32", false),
            (2, 2, 0, "f32", false),
            (2, 2, 1, "f32", false),
            (1, 1, 0, "bf16", false),
            (2, 2, 0, "bf16", false),
            (2, 2, 0, "f32", true),
            (2, 2, 1, "bf16", true),
        ] {
            let mut c = config(model);
            c.train.precision = precision.to_string();
            c.parallel.dp = dp;
            c.parallel.tp = tp;
            c.parallel.zero = zero;
            c.parallel.sequence_parallel = sp;
            let weft = weft_train::memory::estimate(&c);
            let work = weft_train::plan_shape::workload(&c, None).unwrap();
            let layout = Layout {
                dp,
                tp,
                pp: 1,
                zero,
                micro_batches: 1,
                schedule: Schedule::OneFOneB,
                recompute: false,
                comm_dtype: CommDtype::F32,
                pipeline_dtype: CommDtype::F32,
                sequence_parallel: sp,
                stage_blocks: vec![3],
            };
            let plan = weft_plan::memory::stage_memory(&work, &layout, 0);
            let what = format!("{model:?} dp {dp} tp {tp} zero {zero} {precision} sequence-parallel {sp}");
            // the same activation bytes, one accounting (`weft_plan::activations`)
            assert!(
                (plan.activations - weft.activations).abs() < 1e-6,
                "{what}: {plan:?} {weft:?}"
            );
            if tp == 1 {
                // whole parameters on one rank: the same bytes of gradients and optimizer state
                assert_eq!(plan.grads, weft.grads, "{what}");
                assert!((plan.optimizer - weft.optimizer).abs() < 1e-6, "{what}");
            } else {
                // weft's estimate cuts every parameter by tp; the planner keeps norms and
                // row-parallel biases whole, so it holds a little more
                assert!(plan.grads > weft.grads && plan.grads < 1.2 * weft.grads, "{what}");
            }
        }
    }
}

/// A tensor-parallel group of 2 ranks (`sequence`: sequence-parallel) whose collectives leave
/// their tensors as they are: the numbers differ from a real group's, what the autograd graph
/// keeps does not.
struct PairOfOne {
    sequence: bool,
}

impl weft_nn::parallel::TensorParallelGroup for PairOfOne {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn all_reduce(&self, _: &weft_core::Tensor, _: weft_nn::parallel::GroupReduce) -> weft_core::Result<()> {
        Ok(())
    }
    fn all_gather(&self, _: &weft_core::Tensor, _: &weft_core::Tensor) -> weft_core::Result<()> {
        Ok(())
    }
    fn reduce_scatter(&self, _: &weft_core::Tensor, _: &weft_core::Tensor) -> weft_core::Result<()> {
        Ok(())
    }
    fn sequence_parallel(&self) -> bool {
        self.sequence
    }
}

/// Bytes the autograd graph of one forward keeps (parameters left out), as weft's pipeline
/// measures its `activation_bytes`, and the planner's prediction for the same rows.
fn held_and_predicted(model: &str, tp: usize, sequence: bool, precision: &str) -> (f64, f64) {
    use std::sync::Arc;
    use weft_core::{DType, Tensor};
    use weft_models::Model;
    use weft_plan::{CommDtype, Layout, Schedule};
    let mut c = config(model);
    c.train.precision = precision.to_string();
    let group: weft_nn::parallel::TpGroup = Arc::new(PairOfOne { sequence });
    let built: Box<dyn Model> = match &c.model {
        ModelConfig::Gpt(g) => {
            let mut m = weft_models::gpt::Gpt::new(g.to_config(), 0).unwrap();
            if tp > 1 {
                m.make_tensor_parallel(&group).unwrap();
            }
            Box::new(m)
        }
        ModelConfig::Llama(l) => {
            let mut m = weft_models::llama::Llama::new(l.to_config(), 0).unwrap();
            if tp > 1 {
                m.make_tensor_parallel(&group).unwrap();
            }
            Box::new(m)
        }
        _ => unreachable!(),
    };
    let shape = weft_train::plan_shape::model_shape(&c.model).unwrap();
    let (rows, t) = (8usize, shape.seq_len as usize);
    let ids: Vec<i64> = (0..rows * t).map(|i| (i * 7 % 40) as i64).collect();
    let x = Tensor::from_vec(ids.clone(), &[rows, t]).unwrap();
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 40).collect::<Vec<_>>(), &[rows, t]).unwrap();
    let params: std::collections::HashSet<_> = weft_nn::Module::parameters(built.as_ref())
        .iter()
        .map(|(_, p)| Arc::as_ptr(p.storage()))
        .collect();
    let dtype = (precision == "bf16").then_some(DType::BF16);
    let loss = weft_core::autocast(dtype, || built.loss(&x, &y)).unwrap();
    let held = loss.graph_bytes(&|t: &Tensor| params.contains(&Arc::as_ptr(t.storage()))) as f64;
    let work = weft_train::plan_shape::workload(&c, Some(rows as u64)).unwrap();
    let layout = Layout {
        dp: 1,
        tp,
        pp: 1,
        zero: 0,
        micro_batches: 1,
        schedule: Schedule::OneFOneB,
        recompute: false,
        comm_dtype: CommDtype::F32,
        pipeline_dtype: CommDtype::F32,
        sequence_parallel: sequence,
        stage_blocks: vec![shape.n_layer as usize],
    };
    let predicted = weft_plan::memory::stage_memory(&work, &layout, 0).activations;
    (held, predicted)
}

#[test]
fn the_planners_activations_are_what_weft_holds() {
    let gpt = "kind = \"gpt\"\nvocab_size = 67\nblock_size = 32\nn_layer = 3\nn_head = 2\nn_embd = 64\nbias = true\n\
               dropout = 0.0";
    let llama = "kind = \"llama\"\nvocab_size = 50\nblock_size = 32\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n\
                 n_embd = 64\nintermediate_size = 96";
    // two key/value heads per rank at tp 2: grouped-query attention there too
    let grouped = "kind = \"llama\"\nvocab_size = 50\nblock_size = 32\nn_layer = 3\nn_head = 8\nn_kv_head = 4\n\
                   n_embd = 64\nintermediate_size = 96";
    // Qwen3's attention: heads wider than n_embd / n_head (q 96 wide, k and v 48), normed
    // per head before the rotation; then narrower ones, two key/value heads a rank at tp 2
    let qwen3 = "kind = \"llama\"\nvocab_size = 50\nblock_size = 32\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n\
                 n_embd = 64\nhead_dim = 24\nqk_norm = true\nintermediate_size = 96";
    let qwen3_grouped = "kind = \"llama\"\nvocab_size = 50\nblock_size = 32\nn_layer = 3\nn_head = 8\n\
                         n_kv_head = 4\nn_embd = 64\nhead_dim = 6\nqk_norm = true\nintermediate_size = 96";
    let ratio = |model: &str, tp: usize, sequence: bool, precision: &str| {
        let (held, predicted) = held_and_predicted(model, tp, sequence, precision);
        let name = if model.contains("llama") { "llama" } else { "gpt" };
        println!("{name} tp {tp} sequence-parallel {sequence} {precision}: held {held}, predicted {predicted}");
        // the prediction also counts the f32 gradient of the logits, which the backward makes
        // first (8 x 32 tokens of V / tp)
        let vocab = if name == "gpt" { 67.0 } else { 50.0 };
        predicted / (held + 4.0 * 256.0 * vocab / tp as f64)
    };
    // what the graph keeps, within 1%: f32 and bf16 (autocast's bf16 copies of the weights and
    // of the norms' outputs), tensor-parallel or not, llama's grouped-query attention included;
    // what no backward reads (the row-parallel products' outputs, their f32 copies, the biases'
    // bf16 copies, the unrotated q and k) is not held (when it was, the graph held 1.02-2.26x
    // what it holds now); sequence-parallel, the residual stream and the norms' statistics at
    // half the tokens, the gathered inputs of the products whole
    for model in [gpt, llama, grouped, qwen3, qwen3_grouped] {
        for (tp, sequence) in [(1, false), (2, false), (2, true)] {
            for precision in ["f32", "bf16"] {
                let r = ratio(model, tp, sequence, precision);
                assert!(
                    (r - 1.0).abs() < 0.01,
                    "{model} tp {tp} sequence {sequence} {precision}: {r}"
                );
            }
        }
    }
}

/// What `head_dim` and `qk_norm` add to what the graph keeps, to the byte: the graph of a llama
/// with them less the graph of the same llama without, against the planner's two predictions'
/// difference (the 1% of `the_planners_activations_are_what_weft_holds` would let the head
/// norms' statistics, 1% of a block, go uncounted). What the planner leaves out as small, the
/// f32 rotary tables once a model (`2 x 32 x hd` f32 elements here, a power of two of
/// positions), is in the graph wherever the rotation reads them: in f32, and under bf16 after
/// the head norms (whose outputs are f32); without the norms bf16 rotates with bf16 copies of
/// them, which the planner counts per block.
#[test]
fn head_dim_and_qk_norm_keep_what_the_planner_counts() {
    let llama = |extra: &str| {
        format!(
            "kind = \"llama\"\nvocab_size = 50\nblock_size = 32\nn_layer = 3\nn_head = 4\nn_kv_head = 2\n\
             n_embd = 64\nintermediate_size = 96\n{extra}"
        )
    };
    let tables = |hd: f64| 2.0 * 32.0 * hd * 4.0;
    for (tp, sequence) in [(1, false), (2, false), (2, true)] {
        for precision in ["f32", "bf16"] {
            let f32_tables = |hd: f64, qk_norm: bool| {
                if precision == "f32" || qk_norm {
                    tables(hd)
                } else {
                    0.0
                }
            };
            let what = format!("tp {tp} sequence {sequence} {precision}");
            let (held0, predicted0) = held_and_predicted(&llama(""), tp, sequence, precision);
            // heads of 24, not 64 / 4: q and the attention's output 96 wide, k and v 48
            let (held1, predicted1) = held_and_predicted(&llama("head_dim = 24"), tp, sequence, precision);
            let untold = f32_tables(24.0, false) - f32_tables(16.0, false);
            assert_eq!(held1 - held0, predicted1 - predicted0 + untold, "head_dim, {what}");
            assert_ne!(held1, held0, "{what}");
            // and normed per head
            let (held2, predicted2) =
                held_and_predicted(&llama("head_dim = 24\nqk_norm = true"), tp, sequence, precision);
            let untold = f32_tables(24.0, true) - f32_tables(24.0, false);
            assert_eq!(held2 - held1, predicted2 - predicted1 + untold, "qk_norm, {what}");
            println!(
                "{what}: head_dim 24 keeps {} bytes more, qk_norm {} more",
                held1 - held0,
                held2 - held1
            );
        }
    }
}

#[test]
fn an_interleaved_pipelines_activations_are_what_its_stages_held() {
    // the built-in gpt (4 blocks) at pp = 2 with 2 chunks a stage, 4 micro-batches (and 3 of a
    // batch of 12, one group of 3), and at 1F1B for reference, in f32 and in bf16 (whose
    // micro-batches in flight share one autocast copy of their stage's weights): each stage's
    // logged peak of activation bytes beside the planner's
    use weft_plan::{CommDtype, Layout, Schedule};
    let out = temp_dir("plan-interleaved-memory");
    let mut built = RunConfig::parse(
        weft_train::builtin::CONFIG,
        "built-in",
        std::env::current_dir().unwrap(),
        &Overrides::default(),
    )
    .unwrap();
    let shape = weft_train::plan_shape::model_shape(&built.model).unwrap();
    for (precision, schedule, set, m) in [
        ("f32", Schedule::Interleaved(2), "parallel.schedule=\"interleaved\"", 4),
        ("f32", Schedule::Interleaved(2), "parallel.schedule=\"interleaved\"", 3),
        ("f32", Schedule::OneFOneB, "parallel.schedule=\"1f1b\"", 4),
        ("bf16", Schedule::Interleaved(2), "parallel.schedule=\"interleaved\"", 4),
        ("bf16", Schedule::Interleaved(2), "parallel.schedule=\"interleaved\"", 3),
        ("bf16", Schedule::OneFOneB, "parallel.schedule=\"1f1b\"", 4),
    ] {
        built.train.precision = precision.into();
        let mut work = weft_train::plan_shape::workload(&built, None).unwrap();
        // rows of 4 a micro-batch either way
        work.global_batch = 4 * m as u64;
        let metrics = out.join(format!("{}-{precision}-m{m}.jsonl", schedule.name()));
        let sets = [
            common::path_set("train.metrics", &metrics),
            "train.steps=1".into(),
            "parallel.pp=2".into(),
            format!("parallel.micro_batches={m}"),
            format!("data.batch_size={}", 4 * m),
            format!("train.precision=\"{precision}\""),
            set.into(),
        ];
        common::launch_train_ok(2, None, &[], &sets);
        let logged: Vec<f64> = common::read_metrics(&metrics)[0]["activation_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_f64().unwrap())
            .collect();
        let blocks = shape.n_layer as usize / 2;
        let layout = Layout {
            dp: 1,
            tp: 1,
            pp: 2,
            zero: 0,
            micro_batches: m,
            schedule,
            recompute: false,
            comm_dtype: CommDtype::F32,
            pipeline_dtype: CommDtype::F32,
            sequence_parallel: false,
            stage_blocks: vec![blocks, blocks],
        };
        for (stage, &held) in logged.iter().enumerate() {
            let predicted = weft_plan::memory::stage_memory(&work, &layout, stage).activations;
            println!(
                "{} {precision} m {m} stage {stage}: held {held}, predicted {predicted}",
                schedule.name()
            );
            // measured: 1F1B within 0.02% (f32) and 0.1% (bf16); interleaved 1.2-5.4% under
            // at m 4 and 2.9-6.3% at m 3 (each virtual stage counted with its own blocks and
            // ends, in the runtime's order of passes; what is held beyond the count is whole
            // f32 micro-batch inputs of 131 KB: 133 and 262 KB at m 4, 393-399 KB at m 3, in
            // both precisions, a larger share of bf16's smaller total)
            let within = if schedule.chunks() > 1 { 0.07 } else { 0.01 };
            assert!(
                (predicted / held - 1.0).abs() < within,
                "{schedule:?} {precision} m {m} stage {stage}: {predicted} vs {held}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
