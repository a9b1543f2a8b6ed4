//! Next-token cross-entropy fused with the model's head (the final norm and the LM head),
//! computed with its gradients a chunk of tokens at a time during the forward pass: each
//! chunk's logits, their fp32 log-probabilities and their gradients are freed before the next
//! chunk starts, so no `[tokens, vocab]` tensor of the whole micro-batch is ever alive (the
//! memory of Liger's fused linear cross-entropy and torchtune's chunked loss). The loss and the
//! gradients equal the whole logits' up to the order of the sums: the head's weight gradient
//! is accumulated over the chunks in fp32.

use tch::{Kind, Tensor};

use super::next_token::{chunk_ranges, rows_loss_sum};
use crate::model::{vjp, ForwardCtx, Unit};

/// The head's loss and gradients for one micro-batch.
#[derive(Debug)]
pub struct FusedHeadLoss {
    /// The summed loss over the labelled tokens (fp32 scalar on the device, unscaled).
    pub loss_sum: Tensor,
    /// The gradients of `scale × loss_sum`, in [`crate::model::vjp`]'s order: the head's input
    /// (when asked, in the input's dtype and shape), then each parameter that requires grad
    /// (fp32; `None` where no gradient reached it).
    pub grads: Vec<Option<Tensor>>,
}

/// Runs `head` (its `params` as the engine's leaves, those `trainable` marks requiring grad) over
/// `input` (`[M, T, H]`) in chunks of `rows` tokens, each chunk's cross-entropy against
/// `labels` (`[M, T]`, [`crate::data::IGNORE_INDEX`] where there is no loss) summed in fp32 and
/// differentiated at once, scaled by `scale` (the step's normaliser and the loss scale).
/// `input_grad`: whether the input's gradient is wanted (it is unless the head is the model's
/// first unit).
#[allow(clippy::too_many_arguments)]
pub fn fused_head_loss(
    head: &dyn Unit,
    params: &[Tensor],
    trainable: &[bool],
    input: &Tensor,
    input_grad: bool,
    labels: &Tensor,
    rows: usize,
    scale: f64,
    ctx: &ForwardCtx,
) -> Result<FusedHeadLoss, tch::TchError> {
    let hidden = *input.size().last().expect("the head's input is [M, T, H]");
    let flat = input.detach().f_reshape([-1, hidden])?;
    let labels = labels.f_reshape([-1])?;
    let trained: Vec<&Tensor> = params
        .iter()
        .zip(trainable)
        .filter(|(_, t)| **t)
        .map(|(p, _)| p)
        .collect();
    let mut input_grads = if input_grad {
        Some(flat.f_zeros_like()?)
    } else {
        None
    };
    let mut param_grads: Vec<Option<Tensor>> = trained.iter().map(|_| None).collect();
    let mut loss_sum = Tensor::f_zeros([], (Kind::Float, input.device()))?;
    for (start, len) in chunk_ranges(flat.size()[0], rows) {
        let chunk = flat.f_narrow(0, start, len)?;
        let chunk = if input_grad {
            chunk.detach().set_requires_grad(true)
        } else {
            chunk
        };
        let logits = head.forward(params, &chunk.f_unsqueeze(0)?, ctx);
        let vocab = *logits.size().last().expect("logits [1, rows, V]");
        let loss = rows_loss_sum(
            &logits.f_reshape([-1, vocab])?,
            &labels.f_narrow(0, start, len)?,
        )?;
        drop(logits);
        let mut wrt: Vec<&Tensor> = Vec::with_capacity(trained.len() + 1);
        if input_grad {
            wrt.push(&chunk);
        }
        wrt.extend(trained.iter().copied());
        if !wrt.is_empty() {
            let mut grads = vjp(&loss.f_mul_scalar(scale)?, None, &wrt)?.into_iter();
            if let Some(all) = &mut input_grads {
                if let Some(g) = grads.next().flatten() {
                    all.f_narrow(0, start, len)?.f_copy_(&g)?;
                }
            }
            for (acc, g) in param_grads.iter_mut().zip(grads) {
                let Some(g) = g else { continue };
                match acc {
                    Some(sum) => {
                        let _ = sum.f_add_(&g)?;
                    }
                    None => *acc = Some(g.f_to_kind(Kind::Float)?),
                }
            }
        }
        loss_sum = loss_sum.f_add(&loss.detach())?;
    }
    let mut grads = Vec::with_capacity(param_grads.len() + 1);
    if let Some(g) = input_grads {
        grads.push(Some(g.f_view_as(input)?));
    }
    grads.extend(param_grads);
    Ok(FusedHeadLoss { loss_sum, grads })
}
