use super::*;

#[test]
#[allow(clippy::print_stderr)] // a case skipped for want of mkfifo says so
fn devices_folders_and_pipes_are_refused_before_reading() {
    // /dev/zero was read until memory ran out; a FIFO waited for a writer for ever
    for path in ["/dev/zero", "/"] {
        let e = load(std::path::Path::new(path)).unwrap_err().to_string();
        assert!(e.contains(path) && e.contains("not a regular file"), "{e}");
    }
    let fifo = std::env::temp_dir().join(format!("weft-plan-fifo-{}", std::process::id()));
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let e = load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let _ = std::fs::remove_file(&fifo);
    } else {
        eprintln!("skipped the FIFO case: mkfifo is not available");
    }
    let long = std::env::temp_dir().join(format!("weft-plan-long-{}", std::process::id()));
    std::fs::write(&long, vec![b'#'; (MAX_CLUSTER_FILE + 1) as usize]).unwrap();
    let e = load(&long).unwrap_err().to_string();
    assert!(e.contains("longer than"), "{e}");
    let _ = std::fs::remove_file(&long);
}

const GOOD: &str = r#"
devices_per_node = 4
memory_bytes = 24e9
memory_bandwidth = 1e12
[flops]
bf16 = 200e12
f32 = 50e12
[intra_node]
bandwidth = 32e9
latency = 8e-6
[inter_node]
bandwidth = 12.5e9
latency = 0
[efficiency]
gemm = 0.5
"#;

#[test]
fn a_whole_file_reads() {
    let d = parse(GOOD, "c.toml").unwrap();
    assert_eq!(d.devices_per_node, 4);
    assert_eq!(d.memory_bytes, 24e9);
    assert_eq!(d.inter_latency, 0.0);
    assert_eq!(d.efficiency.gemm, 0.5);
    assert_eq!(d.efficiency.memory_bound, Efficiency::default().memory_bound);
    assert_eq!(d.name, "c.toml");
    // GPUs unless said otherwise
    assert!(d.gpu);
    // passes cost their compute alone unless said otherwise
    assert_eq!(d.pass_cost, PassCost::default());
    let costed = GOOD.replace(
        "[efficiency]",
        "[pass_cost]\ntime_scale = 1.25\nblock = 2e-4\n[efficiency]",
    );
    let c = parse(&costed, "c.toml").unwrap().pass_cost;
    assert_eq!((c.time_scale, c.block, c.ends), (1.25, 2e-4, 0.0));
    let e = parse(
        &GOOD.replace("[efficiency]", "[pass_cost]\nlaunch = 1\n[efficiency]"),
        "c.toml",
    )
    .unwrap_err();
    assert!(e.to_string().contains("`pass_cost.launch`"), "{e}");
    let cpu = format!("gpu = false\n{GOOD}");
    assert!(!parse(&cpu, "c.toml").unwrap().gpu);
    let e = parse(&format!("gpu = 1\n{GOOD}"), "c.toml").unwrap_err();
    assert!(
        e.to_string().contains("`gpu`") && e.to_string().contains("true or false"),
        "{e}"
    );
}

#[test]
fn missing_fields_are_named() {
    for (field, text) in [
        ("memory_bytes", GOOD.replace("memory_bytes = 24e9\n", "")),
        ("flops.f32", GOOD.replace("f32 = 50e12\n", "")),
        ("inter_node.bandwidth", GOOD.replace("bandwidth = 12.5e9\n", "")),
        ("devices_per_node", GOOD.replace("devices_per_node = 4\n", "")),
        ("intra_node.latency", GOOD.replace("latency = 8e-6\n", "")),
    ] {
        let e = parse(&text, "c.toml").unwrap_err();
        assert_eq!(
            e,
            Error::MissingField {
                source_name: "c.toml".into(),
                field: field.into()
            }
        );
        assert_eq!(e.to_string(), format!("c.toml: missing field `{field}`"));
    }
}

#[test]
fn negative_and_odd_fields_are_named() {
    for (field, text) in [
        (
            "memory_bytes",
            GOOD.replace("memory_bytes = 24e9", "memory_bytes = -24e9"),
        ),
        (
            "intra_node.bandwidth",
            GOOD.replace("bandwidth = 32e9", "bandwidth = 0"),
        ),
        ("inter_node.latency", GOOD.replace("latency = 0", "latency = -1e-6")),
        ("flops.bf16", GOOD.replace("bf16 = 200e12", "bf16 = \"fast\"")),
        (
            "devices_per_node",
            GOOD.replace("devices_per_node = 4", "devices_per_node = -2"),
        ),
        ("efficiency.gemm", GOOD.replace("gemm = 0.5", "gemm = 1.5")),
        (
            "pass_cost.block",
            GOOD.replace("[efficiency]", "[pass_cost]\nblock = -1e-4\n[efficiency]"),
        ),
        (
            "pass_cost.time_scale",
            GOOD.replace("[efficiency]", "[pass_cost]\ntime_scale = 0\n[efficiency]"),
        ),
    ] {
        match parse(&text, "c.toml") {
            Err(Error::BadField { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let e = parse(&format!("{GOOD}\nspeed = 3\n"), "c.toml").unwrap_err();
    assert!(e.to_string().contains("`efficiency.speed`"), "{e}");
    let e = parse("devices_per_node = [", "c.toml").unwrap_err();
    assert!(matches!(e, Error::ClusterFile { .. }), "{e}");
}

/// Values that are positive and finite but no device's: a subnormal rate or efficiency, or
/// a latency of 1e308, made every plan's step time infinite and its rate 0 tokens/s, and
/// `weft plan` printed the "best" of them.
#[test]
fn values_outside_what_any_device_has_are_named() {
    let with = |extra: &str| GOOD.replace("[efficiency]", &format!("[pass_cost]\n[efficiency]\n{extra}"));
    for (field, text, want) in [
        (
            "memory_bandwidth",
            GOOD.replace("memory_bandwidth = 1e12", "memory_bandwidth = 5e-324"),
            "must be from 1e6 to 1e15 bytes/s, got 5e-324",
        ),
        (
            "memory_bandwidth",
            GOOD.replace("memory_bandwidth = 1e12", "memory_bandwidth = 1e300"),
            "must be from 1e6 to 1e15 bytes/s, got 1e300",
        ),
        (
            "flops.f32",
            GOOD.replace("f32 = 50e12", "f32 = 1e-3"),
            "must be from 1e6 to 1e18 FLOP/s, got 0.001",
        ),
        (
            "intra_node.bandwidth",
            GOOD.replace("bandwidth = 32e9", "bandwidth = 5e-324"),
            "must be from 1e6 to 1e15 bytes/s",
        ),
        (
            "memory_bytes",
            GOOD.replace("memory_bytes = 24e9", "memory_bytes = 1"),
            "must be from 1e6 to 1e15 bytes, got 1",
        ),
        (
            "inter_node.latency",
            GOOD.replace("latency = 0", "latency = 1e308"),
            "must be from 0 to 1 seconds, got 1e308",
        ),
        (
            "efficiency.gemm",
            GOOD.replace("gemm = 0.5", "gemm = 5e-324"),
            "must be from 0.01 to 1, got 5e-324",
        ),
        (
            "efficiency.memory_bound",
            with("memory_bound = 5e-324"),
            "from 0.01 to 1",
        ),
        ("efficiency.collective", with("collective = 5e-324"), "from 0.01 to 1"),
        ("efficiency.attention", with("attention = 5e-324"), "from 0.001 to 16"),
        ("efficiency.memory_margin", with("memory_margin = 1"), "from 0 to 0.99"),
        (
            "pass_cost.time_scale",
            GOOD.replace("[efficiency]", "[pass_cost]\ntime_scale = 5e-324\n[efficiency]"),
            "from 0.001 to 16",
        ),
        (
            "pass_cost.block",
            GOOD.replace("[efficiency]", "[pass_cost]\nblock = 1e308\n[efficiency]"),
            "from 0 to 60 seconds",
        ),
    ] {
        let e = parse(&text, "c.toml").unwrap_err();
        assert!(
            matches!(&e, Error::BadField { field: f, .. } if f == field),
            "{field}: {e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("c.toml: `{field}` {}", e.to_string().split_once("` ").unwrap().1)
        );
        assert!(e.to_string().contains(want), "{field}: {e}");
    }
    // the ends of each range are taken
    let edges = GOOD
        .replace("memory_bandwidth = 1e12", "memory_bandwidth = 1e15")
        .replace("f32 = 50e12", "f32 = 1e6")
        .replace("latency = 0", "latency = 1")
        .replace("gemm = 0.5", "gemm = 0.01");
    let d = parse(&edges, "c.toml").unwrap();
    assert_eq!(
        (d.memory_bandwidth, d.flops_f32, d.inter_latency, d.efficiency.gemm),
        (1e15, 1e6, 1.0, 0.01)
    );
}

/// TOML's own errors name a line; the field is named too (an integer past 2^63 read
/// `number too large to fit in target type` and nothing else).
#[test]
fn a_value_toml_cannot_read_names_its_field() {
    let text = GOOD.replace("memory_bandwidth = 1e12", "memory_bandwidth = 18446744073709551615");
    let e = parse(&text, "c.toml").unwrap_err().to_string();
    assert!(e.starts_with("c.toml: `memory_bandwidth` (line 4): "), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let text = GOOD.replace("latency = 8e-6", "latency = 99999999999999999999");
    let e = parse(&text, "c.toml").unwrap_err().to_string();
    assert!(e.starts_with("c.toml: `intra_node.latency` (line 10): "), "{e}");
}

#[test]
fn more_bad_files_are_named() {
    let e = parse(&format!("{GOOD}\nspeed = 3\n"), "c.toml").unwrap_err();
    assert!(e.to_string().contains("`efficiency.speed`"), "{e}");
    let e = parse("devices_per_node = [", "c.toml").unwrap_err();
    assert!(matches!(e, Error::ClusterFile { .. }), "{e}");
}

/// A name printed in the table's header with control characters in it (a newline, an escape
/// sequence) wrote them to the terminal as they were.
#[test]
fn a_name_with_control_characters_is_refused() {
    for name in ["a\\nb", "red\\u001b[31m", "tab\\there"] {
        let text = format!("name = \"{name}\"\n{GOOD}");
        let e = parse(&text, "c.toml").unwrap_err().to_string();
        assert!(e.contains("name") && e.contains("control characters"), "{name}: {e}");
    }
    assert_eq!(
        parse(&format!("name = \"h100 · 8\"\n{GOOD}"), "c.toml").unwrap().name,
        "h100 · 8"
    );
}
