//! `weft export onnx`: a checkpoint's model as an ONNX file (see docs/compiled.md, "ONNX
//! export").

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct OnnxArgs {
    /// A checkpoint folder, a checkpoint directory (its newest checkpoint is used), or a
    /// safetensors file written by `weft checkpoint consolidate`.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The `.onnx` file to write (replaced whole, or left as it was when the export fails).
    #[arg(long)]
    output: PathBuf,
    /// For gpt and llama: a fixed sequence length (1 to block_size) instead of a dynamic axis.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    seq_len: Option<String>,
}

/// Exports, then says what was written.
pub fn onnx(args: &OnnxArgs) -> Result<(), String> {
    let seq_len = match &args.seq_len {
        None => None,
        Some(raw) => Some(
            raw.trim()
                .parse::<usize>()
                .map_err(|_| format!("--seq-len: {raw:?} is not a whole number from 1 to the model's block_size"))?,
        ),
    };
    let s = weft_train::export::export_onnx(&args.checkpoint, &args.output, seq_len).map_err(|e| e.to_string())?;
    crate::print_out(&format!(
        "wrote {} ({} bytes): {} model, opset {}, {} nodes, {} parameters; input {}, output logits\n",
        args.output.display(),
        s.bytes,
        s.kind,
        weft_core::graph::onnx::OPSET,
        s.nodes,
        s.parameters,
        s.input
    ))
}
