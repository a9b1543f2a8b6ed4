//! Collectives over tch tensors: the [`TensorCollectives`] front end every
//! [`Communicator`] gets (CPU tensors for the CPU backend, CUDA tensors on the communicator's
//! device for NCCL). Each checks that its tensors are defined, contiguous, of a supported dtype
//! and on the communicator's device (a tensor elsewhere is an error naming the call site), and
//! keeps a shallow clone of them in the returned [`Work`] so their storage outlives the
//! operation. Host values (a loss, a flag, a count) travel through
//! [`TensorCollectives::all_reduce_host`] alone, which puts them on the communicator's device
//! first: a tensor built on the host would be refused by NCCL.

use flotilla_comm::comm::{CommError, Communicator, DType, Device, OpKind, RawOp, ReduceOp, Work};

/// The collective dtype of a tch tensor kind, if collectives support it.
pub fn dtype_of(kind: tch::Kind) -> Option<DType> {
    match kind {
        tch::Kind::Float => Some(DType::F32),
        tch::Kind::BFloat16 => Some(DType::BF16),
        tch::Kind::Half => Some(DType::F16),
        tch::Kind::Int64 => Some(DType::I64),
        _ => None,
    }
}

struct TensorBuf {
    ptr: *mut u8,
    numel: usize,
    dtype: DType,
}

/// The tch device of a communicator's device.
pub fn torch_device_of(device: Device) -> tch::Device {
    match device {
        Device::Cpu => tch::Device::Cpu,
        Device::Cuda(i) => tch::Device::Cuda(i),
    }
}

fn tensor_buf(
    comm: &(impl Communicator + ?Sized),
    t: &tch::Tensor,
    op: &'static str,
    what: &str,
    caller: &std::panic::Location<'_>,
) -> Result<TensorBuf, CommError> {
    if !t.defined() {
        return Err(CommError::invalid(
            op,
            format!("{what} tensor is undefined"),
        ));
    }
    if !t.is_contiguous() {
        return Err(CommError::invalid(
            op,
            format!("{what} tensor is not contiguous"),
        ));
    }
    let kind = t.kind();
    let dtype = dtype_of(kind).ok_or_else(|| {
        CommError::invalid(
            op,
            format!("{what} tensor has unsupported dtype {kind:?} (f32, bf16, f16, i64)"),
        )
    })?;
    let want = comm.device();
    let ok = match (t.device(), want) {
        (tch::Device::Cpu, Device::Cpu) => true,
        (tch::Device::Cuda(a), Device::Cuda(b)) => a == b,
        _ => false,
    };
    if !ok {
        return Err(CommError::invalid(
            op,
            format!(
                "{what} tensor (at {}:{}) is on {:?} but the {} communicator works on {want:?}",
                caller.file(),
                caller.line(),
                t.device(),
                comm.backend()
            ),
        ));
    }
    Ok(TensorBuf {
        ptr: t.data_ptr() as *mut u8,
        numel: t.numel(),
        dtype,
    })
}

/// all_reduce, reduce_scatter, all_gather and broadcast of tch tensors, on any [`Communicator`].
pub trait TensorCollectives: Communicator {
    /// all_reduce of a contiguous tensor (CPU tensor for the CPU backend, CUDA tensor on the
    /// communicator's device for NCCL), in place.
    #[track_caller]
    fn all_reduce_tensor(&self, t: &tch::Tensor, op: ReduceOp) -> Result<Work<'static>, CommError> {
        let b = tensor_buf(self, t, "all_reduce", "the", std::panic::Location::caller())?;
        let raw = RawOp {
            kind: OpKind::AllReduce(op),
            dtype: b.dtype,
            send: b.ptr,
            recv: b.ptr,
            count: b.numel,
        };
        // SAFETY: the Work keeps a shallow clone of the tensor, so the storage outlives it.
        Ok(unsafe { self.submit(raw) }?.keep_alive(Box::new(t.shallow_clone())))
    }

    /// reduce_scatter of tensors: `input` has `n * k` elements, `output` `k` (same dtype).
    /// `output` may be the view of `input` at offset `rank * k` (in place).
    #[track_caller]
    fn reduce_scatter_tensor(
        &self,
        input: &tch::Tensor,
        output: &tch::Tensor,
        op: ReduceOp,
    ) -> Result<Work<'static>, CommError> {
        let at = std::panic::Location::caller();
        let i = tensor_buf(self, input, "reduce_scatter", "input", at)?;
        let o = tensor_buf(self, output, "reduce_scatter", "output", at)?;
        check_pair(
            "reduce_scatter",
            &i,
            &o,
            o.numel * self.world_size() == i.numel,
            "input must have world_size x output elements",
        )?;
        let raw = RawOp {
            kind: OpKind::ReduceScatter(op),
            dtype: i.dtype,
            send: i.ptr,
            recv: o.ptr,
            count: o.numel,
        };
        // SAFETY: the Work keeps shallow clones of both tensors.
        Ok(unsafe { self.submit(raw) }?
            .keep_alive(Box::new((input.shallow_clone(), output.shallow_clone()))))
    }

    /// all_gather of tensors: `input` has `k` elements, `output` `n * k` (same dtype).
    /// `input` may be the view of `output` at offset `rank * k` (in place).
    #[track_caller]
    fn all_gather_tensor(
        &self,
        input: &tch::Tensor,
        output: &tch::Tensor,
    ) -> Result<Work<'static>, CommError> {
        let at = std::panic::Location::caller();
        let i = tensor_buf(self, input, "all_gather", "input", at)?;
        let o = tensor_buf(self, output, "all_gather", "output", at)?;
        check_pair(
            "all_gather",
            &i,
            &o,
            i.numel * self.world_size() == o.numel,
            "output must have world_size x input elements",
        )?;
        let raw = RawOp {
            kind: OpKind::AllGather,
            dtype: i.dtype,
            send: i.ptr,
            recv: o.ptr,
            count: i.numel,
        };
        // SAFETY: the Work keeps shallow clones of both tensors.
        Ok(unsafe { self.submit(raw) }?
            .keep_alive(Box::new((input.shallow_clone(), output.shallow_clone()))))
    }

    /// broadcast of a tensor from `root`, in place.
    #[track_caller]
    fn broadcast_tensor(&self, t: &tch::Tensor, root: usize) -> Result<Work<'static>, CommError> {
        let b = tensor_buf(self, t, "broadcast", "the", std::panic::Location::caller())?;
        let raw = RawOp {
            kind: OpKind::Broadcast { root },
            dtype: b.dtype,
            send: b.ptr,
            recv: b.ptr,
            count: b.numel,
        };
        // SAFETY: the Work keeps a shallow clone of the tensor.
        Ok(unsafe { self.submit(raw) }?.keep_alive(Box::new(t.shallow_clone())))
    }

    /// Reduces host values over the group (`op` elementwise) and returns the result on the
    /// host: the values are put on the communicator's device, reduced, and read back after the
    /// wait. The one way a host scalar (a loss, a flag, a count) enters a collective.
    #[track_caller]
    fn all_reduce_host<T: tch::kind::Element + Copy>(
        &self,
        values: &[T],
        op: ReduceOp,
    ) -> Result<Vec<T>, CommError> {
        let at = std::panic::Location::caller();
        let on_device = tch::Tensor::f_from_slice(values)
            .and_then(|t| t.f_to_device(torch_device_of(self.device())))
            .map_err(|e| {
                CommError::invalid(
                    "all_reduce",
                    format!("host values (at {}:{}): {e}", at.file(), at.line()),
                )
            })?;
        self.all_reduce_tensor(&on_device, op)?.wait()?;
        Vec::<T>::try_from(&on_device).map_err(|e| {
            CommError::invalid(
                "all_reduce",
                format!("reading back (at {}:{}): {e}", at.file(), at.line()),
            )
        })
    }
}

impl<C: Communicator + ?Sized> TensorCollectives for C {}

/// One small collective of each kind on the communicator's device, right after it is made:
/// NCCL connects its peers and allocates its buffers at the first collective of each kind, and
/// that should happen at start-up, not inside step 0's backward at peak memory. Collective.
pub fn warm_up(comm: &(impl Communicator + ?Sized)) -> Result<(), CommError> {
    let n = comm.world_size() as i64;
    let on = (tch::Kind::Float, torch_device_of(comm.device()));
    let made = |r: Result<tch::Tensor, tch::TchError>| {
        r.map_err(|e| CommError::invalid("warm-up", e.to_string()))
    };
    let one = made(tch::Tensor::f_ones([1], on))?;
    let many = made(tch::Tensor::f_ones([n], on))?;
    comm.all_reduce_tensor(&one, ReduceOp::Sum)?.wait()?;
    comm.all_gather_tensor(&one, &many)?.wait()?;
    comm.reduce_scatter_tensor(&many, &one, ReduceOp::Sum)?
        .wait()?;
    comm.broadcast_tensor(&one, 0)?.wait()?;
    Ok(())
}

fn check_pair(
    op: &'static str,
    a: &TensorBuf,
    b: &TensorBuf,
    sizes_ok: bool,
    msg: &str,
) -> Result<(), CommError> {
    if a.dtype != b.dtype {
        return Err(CommError::invalid(
            op,
            format!("input is {} but output is {}", a.dtype, b.dtype),
        ));
    }
    if !sizes_ok {
        return Err(CommError::invalid(
            op,
            format!("{msg} (input {}, output {})", a.numel, b.numel),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_kinds_map_to_collective_dtypes() {
        assert_eq!(dtype_of(tch::Kind::BFloat16), Some(DType::BF16));
        assert_eq!(dtype_of(tch::Kind::Float), Some(DType::F32));
        assert_eq!(dtype_of(tch::Kind::Double), None);
    }
}
