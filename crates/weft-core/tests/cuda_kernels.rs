//! Every GPU kernel module compiles with NVRTC for the H200's compute capability (9.0) and for
//! 8.0. NVRTC is a host library: this runs without a GPU wherever NVRTC can be loaded, from the
//! system or from `.cache/cuda/lib` (which `tools/cuda/fetch-nvrtc.sh` fills, as `.ci/run`
//! does); elsewhere it says it was skipped. Whether the kernels compute the right numbers is
//! the GPU op tests' question (`cuda_ops.rs`).
#![cfg(feature = "cuda")]

use weft_core::cuda::kernels;

/// Loads NVRTC from the repository's `.cache/cuda/lib` when the system has none: once a library
/// with its soname is loaded, cudarc's own lookup by name finds it.
fn load_nvrtc() -> bool {
    if kernels::nvrtc_present() {
        return true;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/cuda/lib");
    // The builtins first: NVRTC opens them by name when it compiles.
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let lib = dir.join(name);
        if lib.exists() {
            // SAFETY: NVRTC's initializers only set up its own state.
            if let Ok(l) = unsafe { libloading::Library::new(&lib) } {
                std::mem::forget(l);
            }
        }
    }
    kernels::nvrtc_present()
}

/// One line on the test run's stderr, written past the harness's capture so that it shows.
fn skipped() {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: NVRTC not found (tools/cuda/fetch-nvrtc.sh puts it where this test looks)"
    );
}

#[test]
fn every_kernel_module_compiles() {
    if !load_nvrtc() {
        skipped();
        return;
    }
    let mut failed = Vec::new();
    for arch in ["compute_90", "compute_80"] {
        for m in kernels::ALL {
            match kernels::compile(m, arch) {
                Ok(_) => {}
                Err(e) => failed.push(e.to_string()),
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn every_kernel_the_rust_side_launches_is_in_its_module() {
    if !load_nvrtc() {
        skipped();
        return;
    }
    let mut missing = Vec::new();
    for (module, names) in weft_core::cuda::kernel_names() {
        let ptx = kernels::compile(module, "compute_90").expect("compiles").to_src();
        for name in names {
            if !ptx.contains(&format!(".entry {name}(")) {
                missing.push(format!("{}: {name}", module.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "kernels not found in their module's PTX: {missing:?}"
    );
}

#[test]
fn a_broken_kernel_is_reported_with_the_compiler_log() {
    if !load_nvrtc() {
        skipped();
        return;
    }
    let broken = kernels::Module {
        name: "broken",
        source: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
    };
    let err = kernels::compile(&broken, "compute_90").unwrap_err().to_string();
    assert!(err.contains("broken") && err.contains("undefined_name"), "{err}");
}
