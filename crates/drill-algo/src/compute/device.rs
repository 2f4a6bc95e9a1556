//! [`select_device`]: where a run's tensors live, from DI-engine's `policy.cuda`, and in what
//! precision its large products run (`policy.precision`).

use crate::error::TrainError;
use burn::tensor::Device;

/// The device for `policy.cuda`: the CPU (burn's flex backend, with [`super::conv2d`] and
/// [`super::linear`]'s own kernels) when false, else [`gpu`]. A binary without a GPU backend,
/// or a machine without an adapter, is refused here, before anything trains, naming
/// `policy.cuda`. Sets this process's product precision from `policy.precision` (a CPU
/// path: drill-config refuses it with `policy.cuda`).
pub fn select_device(config: &drill_config::Config) -> Result<Device, TrainError> {
    let bf16 = config.policy.precision() == drill_config::Precision::Bf16;
    drill_kernels::precision::set_enabled(bf16);
    if !config.policy.cuda() {
        return Ok(Device::flex());
    }
    gpu().map_err(|why| {
        config
            .error(
                "policy.cuda",
                format!("is true, but {why}, or set policy.cuda = false"),
            )
            .into()
    })
}

/// The GPU this process computes on: CUDA (`--features cuda`, whose build downloads LLVM) if
/// the binary has it, else burn's wgpu backend (`--features gpu`: WGSL kernels, run through
/// Vulkan on Linux), the adapter of this rank's local rank (`LOCAL_RANK`, Slurm's
/// `SLURM_LOCALID`, Open MPI's local rank) modulo the adapters found. The error says why
/// there is none and what to install or rebuild.
///
/// Why WGSL and not burn's `vulkan` feature (SPIR-V kernels): Mesa 22.3's lavapipe, the
/// software Vulkan device CI tests on, crashes compiling those (any kernel, even an add);
/// the WGSL route (translated to SPIR-V by wgpu's naga) runs there. Not yet run on a real GPU.
pub fn gpu() -> Result<Device, String> {
    #[cfg(feature = "cuda")]
    return Ok(Device::cuda(0));
    #[cfg(all(feature = "gpu", not(feature = "cuda")))]
    return vulkan();
    #[cfg(not(any(feature = "cuda", feature = "gpu")))]
    Err("this drill binary has no GPU backend: rebuild with `cargo build --release --features gpu` (Vulkan; at run time it needs the GPU's Vulkan driver)".into())
}

/// This rank's wgpu adapter, or why there is none.
#[cfg(feature = "gpu")]
fn vulkan() -> Result<Device, String> {
    let devices = Device::enumerate(burn::tensor::DeviceType::Wgpu);
    if devices.is_empty() {
        return Err("no GPU adapter was found (wgpu, through Vulkan): install the GPU's Vulkan driver and loader (NVIDIA: the driver's libnvidia-gl and libvulkan1; no GPU: Mesa's software device, `apt install mesa-vulkan-drivers libvulkan1`)".into());
    }
    let local_rank = drill_comm::InitInfo::from_env()
        .map(|i| i.local_rank)
        .map_err(|e| e.to_string())?;
    let device = devices[local_rank % devices.len()].clone();
    let name = device
        .identity()
        .map(|id| id.name)
        .unwrap_or_else(|| "unnamed adapter".into());
    tracing::info!(
        "GPU: {name} (wgpu/Vulkan, adapter {} of {})",
        local_rank % devices.len(),
        devices.len()
    );
    Ok(device)
}
