//! Loads libnccl at run time and checks that libcuda loads too, so a build with the `nccl`
//! feature runs (and fails with a clear message) on machines without CUDA.
//!
//! cudarc's own NCCL loader searches `libnccl.so` (the development symlink) but not
//! `libnccl.so.2`, the only name that Debian's `libnccl2` and the `nvidia-nccl-cu12` wheel
//! ship, and it panics when nothing is found. So the ~15 NCCL entry points drill uses are
//! resolved here with libloading; cudarc still drives CUDA (context, stream, memory).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

use crate::error::{CommError, Result};

/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t` (the same handle as the driver's `CUstream`).
pub type Stream = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclInProgress` (non-blocking communicators only).
pub const IN_PROGRESS: NcclResult = 7;

/// `ncclUniqueId`: 128 opaque bytes that rank 0 creates and the others receive (via the Store).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [c_char; 128],
}

/// `ncclDataType_t` values.
pub mod data_type {
    use std::ffi::c_int;
    /// ncclInt32
    pub const INT32: c_int = 2;
    /// ncclUint8
    pub const UINT8: c_int = 1;
    /// ncclInt64
    pub const INT64: c_int = 4;
    /// ncclFloat16
    pub const FLOAT16: c_int = 6;
    /// ncclFloat32
    pub const FLOAT32: c_int = 7;
    /// ncclFloat64
    pub const FLOAT64: c_int = 8;
    /// ncclBfloat16
    pub const BFLOAT16: c_int = 9;
}

/// `ncclRedOp_t` values.
pub mod red_op {
    use std::ffi::c_int;
    /// ncclSum
    pub const SUM: c_int = 0;
    /// ncclProd
    pub const PROD: c_int = 1;
    /// ncclMax
    pub const MAX: c_int = 2;
    /// ncclMin
    pub const MIN: c_int = 3;
}

type Buf = *const c_void;
type BufMut = *mut c_void;

/// `ncclAllReduce` and `ncclReduceScatter` (the same signature: send, recv, recv count,
/// type, op, comm, stream).
pub type ReduceCall =
    unsafe extern "C" fn(Buf, BufMut, usize, c_int, c_int, Comm, Stream) -> NcclResult;

/// The NCCL entry points drill calls.
#[allow(missing_docs)]
pub struct Api {
    _lib: Library,
    /// Where the library came from.
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub all_reduce: ReduceCall,
    pub broadcast:
        unsafe extern "C" fn(Buf, BufMut, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub reduce:
        unsafe extern "C" fn(Buf, BufMut, usize, c_int, c_int, c_int, Comm, Stream) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(Buf, BufMut, usize, c_int, Comm, Stream) -> NcclResult,
    pub reduce_scatter: ReduceCall,
    pub send: unsafe extern "C" fn(Buf, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub recv: unsafe extern "C" fn(BufMut, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
}

impl Api {
    /// NCCL's message for a result code.
    pub fn error_string(&self, code: NcclResult) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("NCCL error {code}");
        }
        // SAFETY: non-null, static, NUL-terminated (above).
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{s} (NCCL error {code})")
    }

    /// The library's version as `major.minor.patch`.
    pub fn version(&self) -> String {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        if unsafe { (self.get_version)(&mut v) } != SUCCESS {
            return "unknown".into();
        }
        // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    }
}

/// Library names tried in order (after `DRILL_NCCL_LIB`).
const NCCL_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

fn load_nccl() -> std::result::Result<Api, String> {
    let mut names: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var("DRILL_NCCL_LIB") {
        names.push(p);
    }
    names.extend(NCCL_NAMES.iter().map(|s| s.to_string()));
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading NCCL runs its (trusted) initialisers only.
        match unsafe { Library::new(name) } {
            Ok(lib) => return resolve(lib, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "libnccl could not be loaded (tried {}). Install NCCL (Debian/Ubuntu: libnccl2; pip: nvidia-nccl-cu12), add its lib directory to LD_LIBRARY_PATH, or set DRILL_NCCL_LIB to the file",
        tried.join("; ")
    ))
}

fn resolve(lib: Library, path: &str) -> std::result::Result<Api, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the type is NCCL's documented signature for this symbol.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path} has no {}: {e} (NCCL >= 2.12 needed)", $name))?
        };
    }
    Ok(Api {
        path: path.to_string(),
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_abort: sym!("ncclCommAbort"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        get_error_string: sym!("ncclGetErrorString"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        reduce: sym!("ncclReduce"),
        all_gather: sym!("ncclAllGather"),
        reduce_scatter: sym!("ncclReduceScatter"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        _lib: lib,
    })
}

/// NCCL's entry points, loaded once per process; a clear error when libcuda or libnccl is
/// missing (checked before cudarc is touched, because cudarc panics instead).
pub fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    let loaded = API.get_or_init(|| {
        // SAFETY: only probes whether the driver library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("the CUDA driver (libcuda.so / libcuda.so.1) could not be loaded: this machine has no NVIDIA driver, or its directory is not on LD_LIBRARY_PATH. Use the embedded backend (DRILL_BACKEND=tcp) on CPU".into());
        }
        load_nccl()
    });
    loaded.as_ref().map_err(|detail| CommError::Backend {
        backend: "nccl",
        detail: detail.clone(),
    })
}
