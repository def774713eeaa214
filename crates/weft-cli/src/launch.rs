//! `weft launch`: the flags, mapped onto `weft_dist::launch` (see docs/launch.md).

use std::ffi::OsString;
use std::io::Write;
use weft_dist::launch::{
    parse_nnodes, parse_seconds, LaunchConfig, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_LAST_CALL, DEFAULT_MASTER_ADDR,
    DEFAULT_STOP_TIMEOUT,
};

#[derive(clap::Args)]
#[command(trailing_var_arg = true)]
pub struct LaunchArgs {
    /// Worker processes to start on this node, one per rank (at most 1024, fewer when the
    /// limits on open files or processes, `ulimit -n` / `ulimit -u`, leave room for fewer).
    #[arg(long, alias = "nproc_per_node", value_name = "N", default_value_t = 1)]
    nproc_per_node: usize,
    /// Nodes in the job: N, or MIN:MAX (elastic: the job starts with up to MAX nodes and goes
    /// on with fewer after a failure, down to MIN).
    #[arg(long, value_name = "N", default_value = "1")]
    nnodes: String,
    /// This node's rank, 0 to nnodes-1 (node 0 serves the rendezvous store).
    #[arg(long, alias = "node_rank", value_name = "R", default_value_t = 0)]
    node_rank: usize,
    /// The host of node 0, where the workers reach the store.
    #[arg(long, alias = "master_addr", value_name = "HOST", default_value = DEFAULT_MASTER_ADDR)]
    master_addr: String,
    /// The store's port [default: 29500 with --nnodes > 1; on one node any free port].
    #[arg(long, alias = "master_port", value_name = "PORT")]
    master_port: Option<u16>,
    /// How many times to restart all workers after a failure (on every node, together).
    #[arg(long, alias = "max_restarts", value_name = "K", default_value_t = 0)]
    max_restarts: u32,
    /// Elastic jobs: seconds a rendezvous round waits for more nodes once MIN have joined.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_LAST_CALL.as_secs_f64())]
    rdzv_last_call: f64,
    /// Elastic jobs: seconds node 0, its workers done, waits to hear from a node still running
    /// before counting it lost (each launcher says it is alive every fifth of this, at most
    /// every 5 s), and the other nodes wait for node 0's store to answer before counting node
    /// 0 lost; at least 1. Give every node the same value.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_HEARTBEAT_TIMEOUT.as_secs_f64())]
    rdzv_heartbeat_timeout: f64,
    /// Seconds the workers get to exit after SIGTERM (or a forwarded signal) before SIGKILL
    /// (torchrun's 30 s: time for `weft train` to finish its step and write a checkpoint); at
    /// most a year.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_STOP_TIMEOUT.as_secs_f64())]
    stop_timeout: f64,
    /// The worker program and its arguments, after `--`.
    #[arg(value_name = "PROGRAM", allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Runs the job; exits the process with the launcher's code when it is not 0.
pub fn run(args: &LaunchArgs) -> Result<(), String> {
    // at least 0 and at most a year (weft_dist::MAX_TIMEOUT), or one line naming the flag
    let stop_timeout = parse_seconds("--stop-timeout", args.stop_timeout).map_err(|e| e.to_string())?;
    let (min_nnodes, nnodes) = parse_nnodes(&args.nnodes).map_err(|e| e.to_string())?;
    let last_call = parse_seconds("--rdzv-last-call", args.rdzv_last_call).map_err(|e| e.to_string())?;
    let heartbeat_timeout =
        parse_seconds("--rdzv-heartbeat-timeout", args.rdzv_heartbeat_timeout).map_err(|e| e.to_string())?;
    let (program, rest) = match args.command.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (OsString::new(), Vec::new()),
    };
    let cfg = LaunchConfig {
        nproc_per_node: args.nproc_per_node,
        nnodes,
        min_nnodes,
        last_call,
        heartbeat_timeout,
        node_rank: args.node_rank,
        master_addr: args.master_addr.clone(),
        master_port: args.master_port,
        max_restarts: args.max_restarts,
        stop_timeout,
        ..LaunchConfig::new(args.nproc_per_node, program, rest)
    };
    match weft_dist::launch::run(&cfg).map_err(|e| e.to_string())? {
        0 => Ok(()),
        code => {
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            std::process::exit(code)
        }
    }
}
