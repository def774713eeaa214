//! `weft models lineage NAME VERSION`: a model version's lineage (`weft_tune::lineage`) as
//! text or JSON.

use serde_json::{json, Value};
use weft_tune::lineage::Lineage;
use weft_tune::pipeline::cache::Execution;

use crate::runs::{input_line, utc};

/// `pipeline P step S (execution N, ended T UTC)`.
fn execution_text(e: &Execution) -> String {
    format!(
        "pipeline {} step {} (execution {}, ended {} UTC)",
        e.pipeline,
        e.step,
        e.id,
        utc(e.end)
    )
}

fn execution_json(e: &Execution) -> Value {
    json!({"pipeline": e.pipeline, "step": e.step, "execution": e.id, "end": e.end, "output": e.output})
}

/// The lineage as `weft models lineage` prints it.
pub fn text(l: &Lineage) -> String {
    let v = &l.version;
    let mut out = format!(
        "model {} version {} ({}): {}\n",
        v.name,
        v.version,
        v.stage,
        v.path.display()
    );
    if l.runs.is_empty() {
        out += "  made by no run of this store (registered from a folder no run recorded, or its run was deleted)\n";
    }
    for r in &l.runs {
        out += &format!("run {} ({}): {}\n", r.id, r.name, r.status);
        for e in &r.made_by {
            out += &format!("  made by {}\n", execution_text(e));
        }
        for i in &r.inputs {
            out += &format!("  {}\n", input_line(&i.input));
            for e in &i.made_by {
                out += &format!("    made by {}\n", execution_text(e));
            }
        }
        if r.inputs.is_empty() {
            out += "  no inputs recorded (a run recorded before inputs were)\n";
        }
        out += &format!("  {} params (weft runs show {})\n", r.params.len(), r.id);
    }
    out
}

/// The lineage as `--json` prints it.
pub fn json(l: &Lineage) -> Value {
    let runs: Vec<Value> = l
        .runs
        .iter()
        .map(|r| {
            let inputs: Vec<Value> = r
                .inputs
                .iter()
                .map(|i| {
                    let mut v = weft_track::ui::json::input(&i.input);
                    v["made_by"] = i.made_by.iter().map(execution_json).collect();
                    v
                })
                .collect();
            json!({
                "id": r.id,
                "name": r.name,
                "status": r.status,
                "params": r.params,
                "made_by": r.made_by.iter().map(execution_json).collect::<Vec<_>>(),
                "inputs": inputs,
            })
        })
        .collect();
    json!({"model": crate::models::version_json(&l.version), "runs": runs})
}
