//! libtorch's multi-tensor optimizer kernels, through the C++ shim (`csrc/optim.cpp`; tch does
//! not bind them): the fused AdamW update (`fused_adamw`, torch's `AdamW(fused=True)`: one
//! kernel over a list of parameters instead of about ten per parameter) and the L2 norms of a
//! list of tensors (`foreach_norm`, `clip_grad_norm_(foreach=True)`'s) and fp16's unscale with
//! its inf/NaN check (`unscale_and_flag`, `GradScaler.unscale_`'s: one kernel and one flag per
//! device, left on the device for the fused update to skip by).

use std::ffi::{c_char, c_int, c_void, CStr};

use tch::{Device, Kind, Tensor};

use crate::error::TrainError;

extern "C" {
    fn flotilla_fused_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        steps: *const *mut c_void,
        n: c_int,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        found_inf: *const c_void,
    ) -> c_int;
    fn flotilla_foreach_norm(
        tensors: *const *mut c_void,
        n: c_int,
        outputs: *mut *mut c_void,
    ) -> c_int;
    fn flotilla_unscale(
        grads: *const *mut c_void,
        n: c_int,
        found_inf: *mut c_void,
        inv_scale: *const c_void,
    ) -> c_int;
    fn flotilla_optim_error() -> *const c_char;
}

/// The shim's last error as a [`TrainError`].
fn shim_error(what: &str) -> TrainError {
    // SAFETY: the shim returns a NUL-terminated thread-local message.
    let msg = unsafe { CStr::from_ptr(flotilla_optim_error()) };
    TrainError::from(tch::TchError::Torch(format!(
        "{what}: {}",
        msg.to_string_lossy()
    )))
}

/// The indices of `tensors` grouped by `key` (device, dtype), groups in order of first
/// appearance: each multi-tensor kernel takes tensors of one device (and dtype).
fn grouped<K: PartialEq>(tensors: &[Tensor], key: impl Fn(&Tensor) -> K) -> Vec<(K, Vec<usize>)> {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let k = key(t);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
}

fn handles(tensors: &[Tensor]) -> Vec<*mut c_void> {
    tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect()
}

/// The hyper-parameters of one fused AdamW call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedAdamW {
    /// The step count after increment.
    pub step: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// One AdamW update of every `params[i]` (in place, with its moments `exp_avgs[i]`,
/// `exp_avg_sqs[i]`) from `grads[i]`, by libtorch's fused kernel. The tensors are grouped by
/// device and dtype as `torch.optim.AdamW(fused=True)` groups them; a gradient in another dtype
/// than its parameter is cast to it first. `found_inf` (fp16's flag from
/// [`unscale_and_flag`]): where it holds 1 the kernel changes nothing, decided on the device.
/// Call under `no_grad`.
pub(crate) fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    h: &FusedAdamW,
    found_inf: Option<&Tensor>,
) -> Result<(), TrainError> {
    let n = params.len();
    assert!(grads.len() == n && exp_avgs.len() == n && exp_avg_sqs.len() == n);
    for ((device, kind), members) in grouped(params, |p| (p.device(), p.kind())) {
        let pick = |ts: &[Tensor]| -> Vec<Tensor> {
            members.iter().map(|&i| ts[i].shallow_clone()).collect()
        };
        let grads: Vec<Tensor> = members
            .iter()
            .map(|&i| {
                let g = &grads[i];
                if g.kind() == kind && g.device() == device {
                    Ok(g.shallow_clone())
                } else {
                    g.f_to_device(device)?.f_to_kind(kind)
                }
            })
            .collect::<Result<_, tch::TchError>>()?;
        let (p, m, v) = (pick(params), pick(exp_avgs), pick(exp_avg_sqs));
        // torch keeps each parameter's step as a float32 scalar on its device; it is filled
        // there (no copy from the host, which would wait for the device's queue on a GPU).
        let step = Tensor::f_full([], h.step as f64, (Kind::Float, device))?;
        let steps: Vec<Tensor> = members.iter().map(|_| step.shallow_clone()).collect();
        let found = found_inf
            .map(|f| f.f_to_device(device)?.f_to_kind(Kind::Float))
            .transpose()?;
        let (hp, hg, hm, hv, hs) = (
            handles(&p),
            handles(&grads),
            handles(&m),
            handles(&v),
            handles(&steps),
        );
        // SAFETY: every pointer is a live tch tensor handle (an at::Tensor*) for the call.
        let code = unsafe {
            flotilla_fused_adamw(
                hp.as_ptr(),
                hg.as_ptr(),
                hm.as_ptr(),
                hv.as_ptr(),
                hs.as_ptr(),
                members.len() as c_int,
                h.lr,
                h.beta1,
                h.beta2,
                h.weight_decay,
                h.eps,
                found
                    .as_ref()
                    .map_or(std::ptr::null(), |f| f.as_ptr() as *const c_void),
            )
        };
        if code != 0 {
            return Err(shim_error("fused AdamW"));
        }
    }
    Ok(())
}

/// The L2 norm of each of `tensors` (fp32 scalars), by libtorch's multi-tensor kernel.
pub(crate) fn foreach_norm(tensors: &[Tensor]) -> Result<Vec<Tensor>, TrainError> {
    if tensors.is_empty() {
        return Ok(vec![]);
    }
    let h = handles(tensors);
    let mut outputs = vec![std::ptr::null_mut::<c_void>(); tensors.len()];
    // SAFETY: the handles are live for the call; the shim fills `outputs` with new
    // at::Tensor* that the returned tch tensors take ownership of.
    let code =
        unsafe { flotilla_foreach_norm(h.as_ptr(), tensors.len() as c_int, outputs.as_mut_ptr()) };
    if code != 0 {
        return Err(shim_error("foreach norm"));
    }
    Ok(outputs
        .into_iter()
        // SAFETY: each pointer is a fresh at::Tensor* owned by nobody else.
        .map(|p| unsafe { Tensor::from_ptr(p as *mut torch_sys::C_tensor) })
        .collect())
}

/// Multiplies every gradient by `inv_scale` in place (one multi-tensor kernel per device) and
/// returns whether any held an inf or a NaN as a flag on the device (a float tensor of one
/// element: 1 or 0; on the first gradient's device), not read.
pub(crate) fn unscale_and_flag(grads: &[Tensor], inv_scale: f64) -> Result<Tensor, TrainError> {
    let devices = grouped(grads, Tensor::device);
    let mut flags = Vec::with_capacity(devices.len());
    for (device, members) in devices {
        let list: Vec<Tensor> = members.iter().map(|&i| grads[i].shallow_clone()).collect();
        let found = Tensor::f_zeros([1], (Kind::Float, device))?;
        let inv = Tensor::f_full([1], inv_scale, (Kind::Float, device))?;
        let h = handles(&list);
        // SAFETY: the handles, `found` and `inv` are live tch tensors for the call.
        let code = unsafe {
            flotilla_unscale(
                h.as_ptr(),
                list.len() as c_int,
                found.as_ptr() as *mut c_void,
                inv.as_ptr() as *const c_void,
            )
        };
        if code != 0 {
            return Err(shim_error("unscaling the gradients"));
        }
        flags.push(found);
    }
    let Some(first) = flags.first() else {
        return Ok(Tensor::f_zeros([1], (Kind::Float, Device::Cpu))?);
    };
    let device = first.device();
    let on_one: Vec<Tensor> = flags
        .iter()
        .map(|f| f.f_to_device(device))
        .collect::<Result<_, _>>()?;
    Ok(Tensor::f_stack(&on_one, 0)?.f_amax([0], false)?)
}
