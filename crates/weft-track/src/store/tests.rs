use super::schema::schema_objects;

#[test]
fn the_schema_names_its_tables_and_indexes() {
    let names: Vec<&str> = schema_objects().collect();
    for want in [
        "meta",
        "runs",
        "metrics",
        "metrics_run_key_step",
        "run_inputs",
        "run_inputs_run",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
}
