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

/// Prints the steps compiled mode captures for the config's model on its first batches: the
/// whole step it replays at every step once captured (from the second; the first for SGD without
/// momentum) (the last micro-batch's forward and
/// backward, the gradients' norm, clipping and the update), and with `train.grad_accum` above 1
/// the graph of each earlier micro-batch. `dot` prints the whole step alone. When the whole step
/// cannot be captured, the micro-batch graph, saying why.
pub fn dump(args: &DumpArgs) -> Result<(), String> {
    if !matches!(args.format.as_str(), "text" | "dot") {
        return Err(format!("--format: {:?} is not one of text, dot", args.format));
    }
    let cfg = args.config.load()?;
    let micro = || weft_train::run::step_graph(&cfg).map_err(|e| e.to_string());
    let whole = weft_train::run::whole_step_graph(&cfg).map_err(|e| e.to_string());
    if args.format == "dot" {
        let step = match whole {
            Ok(w) => w,
            Err(why) => {
                weft_core::errln!("weft: {why}; printing the micro-batch graph");
                micro()?
            }
        };
        return crate::print_out(&step.graph.to_dot());
    }
    let mut text = String::new();
    match whole {
        Ok(w) => {
            text += "the whole step, replayed at every step once captured (the last micro-batch's forward and \
                     backward, the gradients' norm, clipping and the optimizer's update):\n";
            text += &describe(&w);
            if cfg.train.grad_accum > 1 {
                text += "\neach earlier micro-batch of a step (forward and backward; its gradients are added to \
                         the parameters'):\n";
                text += &describe(&micro()?);
            }
        }
        Err(why) => {
            text += &format!("{why}; the micro-batch graph (forward and backward), the update running eagerly:\n");
            text += &describe(&micro()?);
        }
    }
    crate::print_out(&text)
}

/// A captured graph in text: what the passes did, then its nodes, fusion groups and memory plan.
fn describe(step: &weft_train::run::StepGraph) -> String {
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
    format!(
        "captured {} nodes; folded {}, merged {}, removed {}{recomputed}\n{}",
        r.captured,
        r.folded,
        r.merged,
        r.removed,
        step.graph.to_text()
    )
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
