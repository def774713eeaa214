//! `weft graph dump`: the graph compiled mode (`[train] compile = true`) captures for a run's
//! training step, with its fusion groups and memory plan.

#[derive(clap::Args)]
pub struct DumpArgs {
    #[command(flatten)]
    config: crate::train::ConfigArgs,
    /// `text` (ops, shapes, fusion groups, memory plan) or `dot` (Graphviz).
    #[arg(long, default_value = "text")]
    format: String,
}

/// Prints the captured step of the config's model on its first batch.
pub fn dump(args: &DumpArgs) -> Result<(), String> {
    if !matches!(args.format.as_str(), "text" | "dot") {
        return Err(format!("--format: {:?} is not one of text, dot", args.format));
    }
    let cfg = args.config.load()?;
    let step = weft_train::run::step_graph(&cfg).map_err(|e| e.to_string())?;
    if args.format == "dot" {
        return crate::print_out(&step.graph.to_dot());
    }
    let (r, m) = (step.report, step.remat);
    let recomputed = if m.recomputed > 0 {
        format!(
            "; {} activations recomputed in the backward (train.compile_recompute), peak {:.2} -> {:.2} MiB",
            m.recomputed,
            m.peak_before as f64 / (1 << 20) as f64,
            m.peak_after as f64 / (1 << 20) as f64
        )
    } else {
        String::new()
    };
    crate::print_out(&format!(
        "captured {} nodes; folded {}, merged {}, removed {}{recomputed}\n{}",
        r.captured,
        r.folded,
        r.merged,
        r.removed,
        step.graph.to_text()
    ))
}

#[derive(clap::Args)]
pub struct TuneArgs {
    #[command(flatten)]
    config: crate::train::ConfigArgs,
    /// Time every kernel call again instead of starting from this machine's cache file.
    #[arg(long)]
    fresh: bool,
}

/// Times each kernel variant of the config's captured step and prints the choices.
pub fn tune(args: &TuneArgs) -> Result<(), String> {
    let cfg = args.config.load()?;
    let r = weft_train::run::tune_step(&cfg, args.fresh).map_err(|e| e.to_string())?;
    for w in &r.warnings {
        weft_core::errln!("weft: warning: {w}");
    }
    let written = if r.searched.is_empty() {
        "nothing new to write".to_string()
    } else if !r.warnings.iter().any(|w| w.contains("could not be written")) {
        format!("choices written to {}", weft_core::tune::cache_file().display())
    } else {
        "see the warning above".to_string()
    };
    crate::print_out(&format!(
        "searched {} kernel calls in {:.2} s ({} of the step's calls already chosen, {} choices read from the cache \
         file); {written}\n{}",
        r.searched.len(),
        r.seconds,
        r.known,
        r.from_file,
        r.to_table()
    ))
}
