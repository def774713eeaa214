//! `weft export onnx`: a trained model's inference forward (logits) as an ONNX file, traced by
//! the graph capture (`weft_core::graph::onnx`) with a dynamic batch axis, and for language
//! models a dynamic sequence axis unless a fixed length is asked for.

use std::path::Path;

use weft_core::graph::onnx::{self, DynamicAxis, Exported, OnnxSpec};
use weft_core::{DType, Tensor};
use weft_nn::state_dict;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::generate::{read_trained, recorded_model};

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    /// `[model] kind`.
    pub kind: &'static str,
    /// The graph input, as `name: dtype [dims]` with the dynamic axes named.
    pub input: String,
    /// ONNX nodes and initializers written.
    pub nodes: usize,
    pub parameters: usize,
    /// Bytes of the file.
    pub bytes: usize,
}

/// The sizes of the traces: the batch at 2 then 3; the sequence at 3 then 5 (or fixed).
const BATCH: [usize; 2] = [2, 3];
const SEQ: [usize; 2] = [3, 5];

/// Exports the model of `checkpoint` (a checkpoint folder or directory, or a consolidated
/// file) to `output`: see [`export_model`]. Nothing is written when the model cannot be
/// exported, nor over what it reads (an `output` inside the checkpoint folder, or the file
/// itself, is refused before anything is read).
pub fn export_onnx(checkpoint: &Path, output: &Path, seq_len: Option<usize>) -> Result<ExportSummary> {
    let reads = if checkpoint.is_file() || weft_models::hf::is_checkpoint_folder(checkpoint) {
        checkpoint.to_path_buf()
    } else {
        crate::checkpoint::resolve(checkpoint)?
    };
    crate::checkpoint::check_output_apart(&reads, output, "--output")?;
    let trained = read_trained(checkpoint)?;
    let cfg = recorded_model(&trained)?;
    let model = crate::run::build_model(&cfg, 0)?;
    state_dict::load_state_dict(
        model.as_ref(),
        trained.params.as_ref(),
        model.aliases(),
        &checkpoint.display().to_string(),
    )?;
    let (exported, summary) = export_model(
        model.as_ref(),
        &cfg,
        trained.tokenizer.as_deref(),
        &trained.source,
        seq_len,
    )?;
    weft_core::io::atomic::write(output, &exported.bytes)?;
    Ok(summary)
}

/// The ONNX model of `model` (built from `cfg`), opset [`onnx::OPSET`]: input `input` (f32
/// features or images, `[batch, ...]`) or `input_ids` (I64 `[batch, seq]`), output `logits`;
/// the parameters under their names; `cfg` (and `tokenizer`) in the metadata (`weft.model`,
/// `weft.tokenizer`). `seq_len` fixes a language model's sequence length (1 to its
/// `block_size`; given for another model, an error); otherwise the sequence axis is dynamic.
/// `source` is named in the doc string. The model is put in eval mode. A model whose file
/// would pass protobuf's 2 GiB limit is refused ([`onnx::MAX_FILE_BYTES`]).
pub fn export_model(
    model: &dyn weft_models::Model,
    cfg: &ModelConfig,
    tokenizer: Option<&str>,
    source: &str,
    seq_len: Option<usize>,
) -> Result<(Exported, ExportSummary)> {
    model.context().set_training(false);
    let kind = cfg.kind();
    if let (Some(t), ModelConfig::Mlp(_) | ModelConfig::Convnet(_)) = (seq_len, cfg) {
        return Err(Error::Config(format!(
            "--seq-len {t}: fixes the sequence length of gpt and llama models; this {kind} model has no sequence axis"
        )));
    }
    let batch = DynamicAxis {
        name: "batch".into(),
        input: 0,
        dim: 0,
    };
    // inputs of each trace, and the axes
    let (input_name, sets, axes): (&str, Vec<Tensor>, Vec<DynamicAxis>) = match &cfg {
        ModelConfig::Mlp(m) => {
            let make = |b: usize| Tensor::zeros(&[b, m.in_features], DType::F32);
            ("input", vec![make(BATCH[0])?, make(BATCH[1])?], vec![batch])
        }
        ModelConfig::Convnet(c) => {
            let make = |b: usize| Tensor::zeros(&[b, c.in_channels, c.image_size, c.image_size], DType::F32);
            ("input", vec![make(BATCH[0])?, make(BATCH[1])?], vec![batch])
        }
        ModelConfig::Gpt(_) | ModelConfig::Llama(_) => {
            let (vocab, block) = cfg.language_model_sizes().unwrap_or((1, 1));
            let ids = |b: usize, t: usize| {
                let v: Vec<i64> = (0..b * t).map(|i| (i % vocab) as i64).collect();
                Tensor::from_vec(v, &[b, t])
            };
            if let Some(t) = seq_len.filter(|&t| t == 0 || t > block) {
                return Err(Error::Config(format!(
                    "--seq-len: {t} is not from 1 to the model's block_size {block}"
                )));
            }
            // tables a model grows on demand (llama's rotary embeddings) are made for the
            // longest sequence first, so that the traces read them and the file holds them whole
            let longest = seq_len.unwrap_or(block);
            model
                .reserve_positions(longest)
                .map_err(|e| Error::Run(format!("{kind}: sequences of {longest} positions: {e}")))?;
            match seq_len {
                Some(t) => ("input_ids", vec![ids(BATCH[0], t)?, ids(BATCH[1], t)?], vec![batch]),
                None if block < SEQ[1] => {
                    return Err(Error::Config(format!(
                        "the model's block_size {block} is too short to trace a dynamic sequence axis; give \
                         --seq-len"
                    )))
                }
                None => {
                    let seq = DynamicAxis {
                        name: "seq".into(),
                        input: 0,
                        dim: 1,
                    };
                    let sets = vec![ids(BATCH[0], SEQ[0])?, ids(BATCH[1], SEQ[0])?, ids(BATCH[0], SEQ[1])?];
                    ("input_ids", sets, vec![batch, seq])
                }
            }
        }
    };
    let mut traces = Vec::with_capacity(sets.len());
    for x in sets {
        let graph = onnx::trace_inference(std::slice::from_ref(&x), |xs| Ok(vec![model.logits(&xs[0])?]))
            .map_err(|e| Error::Run(format!("{kind}: {e}")))?;
        traces.push(graph);
    }
    let named = model.parameters();
    let mut metadata = vec![("weft.model".to_string(), serde_json::to_string(cfg).unwrap_or_default())];
    if let Some(tok) = tokenizer {
        metadata.push(("weft.tokenizer".to_string(), tok.to_string()));
    }
    let spec = OnnxSpec {
        name: format!("weft_{kind}"),
        doc: format!("weft {kind}: logits of its inference forward, exported from {source}"),
        input_names: vec![input_name.to_string()],
        output_names: vec!["logits".to_string()],
        axes: axes.clone(),
        named: named.clone(),
        metadata,
    };
    let exported = onnx::to_onnx(&traces, &spec).map_err(|e| Error::Run(format!("{kind}: {e}")))?;
    let base = &traces[0].values[traces[0].inputs[0]];
    let dims: Vec<String> = base
        .shape
        .iter()
        .enumerate()
        .map(|(d, n)| match axes.iter().find(|a| a.dim == d) {
            Some(a) => a.name.clone(),
            None => n.to_string(),
        })
        .collect();
    let summary = ExportSummary {
        kind,
        input: format!("{input_name}: {:?} [{}]", base.dtype, dims.join(", ")),
        nodes: exported.nodes,
        parameters: named.len(),
        bytes: exported.bytes.len(),
    };
    Ok((exported, summary))
}
