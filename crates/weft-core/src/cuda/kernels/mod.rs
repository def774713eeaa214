//! The CUDA C kernel sources, one module per op family, compiled at run time by NVRTC for the
//! device's compute capability (once per process and module: `runtime::Gpu::function` caches
//! the loaded module). Every module is [`PRELUDE`] followed by its own source.
//!
//! Kernels are `extern "C"` so their names are plain; a kernel of several dtypes is one template
//! instantiated under a name per dtype (`gather_f32`, ...).

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use crate::error::{Error, Result};

/// One compilation unit.
#[derive(Debug)]
pub struct Module {
    pub name: &'static str,
    pub source: &'static str,
}

/// Types, conversions, strided indexing, block reductions and Philox, shared by every module.
pub const PRELUDE: &str = include_str!("prelude.cuh");

macro_rules! modules {
    ($($konst:ident => $name:literal),* $(,)?) => {
        $(pub const $konst: Module = Module { name: $name, source: include_str!(concat!($name, ".cu")) };)*
        /// Every module, for the compile check.
        pub const ALL: &[&Module] = &[$(&$konst),*];
    };
}

modules! {
    COPY => "copy",
    ELEMENTWISE => "elementwise",
    REDUCE => "reduce",
    NN => "nn",
    INDEX => "index",
    ATTENTION => "attention",
    CONV => "conv",
    LINEAR => "linear",
    OPTIM => "optim",
}

/// Whether NVRTC can be loaded (without it no kernel can be compiled).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library (dlopen) and closes it again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `module` to PTX for `arch` (`compute_90`); the error carries NVRTC's log.
pub fn compile(module: &Module, arch: &'static str) -> Result<Ptx> {
    if !nvrtc_present() {
        return Err(Error::Device(
            "cuda: NVRTC (libnvrtc.so) could not be loaded; the GPU kernels are compiled at run time and need it"
                .to_string(),
        ));
    }
    let source = format!("{PRELUDE}\n// ---- {}.cu ----\n{}", module.name, module.source);
    let opts = CompileOptions {
        arch: Some(arch),
        name: Some(format!("{}.cu", module.name)),
        options: vec!["--std=c++17".to_string()],
        ..Default::default()
    };
    compile_ptx_with_opts(source, opts).map_err(|e| {
        let detail = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        Error::Device(format!(
            "cuda: kernel module {} did not compile for {arch}:\n{detail}",
            module.name
        ))
    })
}
