//! `weft graph dump`: the graph compiled mode (`[train] compile = true`) captures for a run's
//! training step, with its fusion groups and memory plan.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DumpArgs {
    /// The run config (without one: the built-in config of `weft train`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides a config value: `section.key=value` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Removes a key from the config: `section.key` (repeatable; applied before --set).
    #[arg(long = "unset", value_name = "SECTION.KEY")]
    unset: Vec<String>,
    /// `text` (ops, shapes, fusion groups, memory plan) or `dot` (Graphviz).
    #[arg(long, default_value = "text")]
    format: String,
}

/// Prints the captured step of the config's model on its first batch.
pub fn dump(args: &DumpArgs) -> Result<(), String> {
    if !matches!(args.format.as_str(), "text" | "dot") {
        return Err(format!("--format: {:?} is not one of text, dot", args.format));
    }
    let cfg = crate::train::load_config(args.config.as_deref(), args.overrides.clone(), args.unset.clone())?;
    let step = weft_train::run::step_graph(&cfg).map_err(|e| e.to_string())?;
    if args.format == "dot" {
        return crate::print_out(&step.graph.to_dot());
    }
    let r = step.report;
    crate::print_out(&format!(
        "captured {} nodes; folded {}, merged {}, removed {}\n{}",
        r.captured,
        r.folded,
        r.merged,
        r.removed,
        step.graph.to_text()
    ))
}
