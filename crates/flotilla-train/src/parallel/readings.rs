//! A step's figures read to the host together: the loss, the load-balancing loss, a preference
//! objective's sums and the gradient norm stay device tensors while the step is queued
//! (forward, backward, clipping, the optimizer update) and cross to the host in one copy after
//! it, so the host never waits on the device between them. [`add_into`] keeps such a running
//! total on the device.

use tch::{Device, Kind, Tensor};

use crate::error::TrainError;

/// `value` added to the running `total` on the device (the first value starts it).
pub fn add_into(total: &mut Option<Tensor>, value: Tensor) -> Result<(), tch::TchError> {
    *total = Some(match total.take() {
        Some(sum) => sum.f_add(&value)?,
        None => value,
    });
    Ok(())
}

/// The elements of `tensors` (any dtype and shape, on one device), flattened in order, read to
/// the host in one copy.
pub fn read_together(tensors: &[&Tensor]) -> Result<Vec<f64>, TrainError> {
    let Some(first) = tensors.first() else {
        return Ok(vec![]);
    };
    let device = first.device();
    let flat: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            t.f_reshape([-1])?
                .f_to_device(device)?
                .f_to_kind(Kind::Double)
        })
        .collect::<Result<_, _>>()?;
    Ok(Vec::<f64>::try_from(
        Tensor::f_cat(&flat, 0)?.f_to_device(Device::Cpu)?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_element_in_order() {
        let a = Tensor::from(1.5f32);
        let b = Tensor::from_slice(&[-2.25f64, 4.0]);
        let c = Tensor::from(3i64).to_kind(Kind::BFloat16);
        assert_eq!(
            read_together(&[&a, &b, &c]).unwrap(),
            vec![1.5, -2.25, 4.0, 3.0]
        );
        assert!(read_together(&[]).unwrap().is_empty());
    }

    #[test]
    fn adds_into_a_running_total() {
        let mut total = None;
        for x in [1.5, 2.25, -0.5] {
            add_into(&mut total, Tensor::from_slice(&[x, 2.0 * x])).unwrap();
        }
        assert_eq!(read_together(&[&total.unwrap()]).unwrap(), vec![3.25, 6.5]);
    }
}
