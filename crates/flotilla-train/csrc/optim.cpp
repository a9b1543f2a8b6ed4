// libtorch's multi-tensor optimizer kernels, which tch does not bind: the fused AdamW update
// (torch.optim.AdamW(fused=True)), the per-tensor norms of a tensor list (torch's
// clip_grad_norm_ with foreach) and fp16's unscale with its inf/NaN check (GradScaler's). One kernel launch per list instead of ~10 per parameter.
#include <ATen/ATen.h>

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

std::vector<at::Tensor> list(void* const* tensors, int n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    out.push_back(*static_cast<const at::Tensor*>(tensors[i]));
  }
  return out;
}
}  // namespace

extern "C" {

// at::_fused_adamw_ over n parameters, updated in place with their moments; `steps` are the
// step counts after increment (float scalars on the parameters' device). `found_inf` (null,
// or a float tensor of one element on their device): when it holds 1 the kernel changes
// nothing (a skipped fp16 step, decided on the device). 0: done; 1: an exception (see
// flotilla_optim_error).
int flotilla_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                         void* const* exp_avg_sqs, void* const* steps, int n, double lr,
                         double beta1, double beta2, double weight_decay, double eps,
                         const void* found_inf) {
  try {
    auto p = list(params, n);
    auto g = list(grads, n);
    auto m = list(exp_avgs, n);
    auto v = list(exp_avg_sqs, n);
    auto s = list(steps, n);
    std::optional<at::Tensor> found;
    if (found_inf != nullptr) {
      found = *static_cast<const at::Tensor*>(found_inf);
    }
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, beta1, beta2, weight_decay,
                      eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      found);
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return 1;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// at::_foreach_norm (L2) of n tensors: outputs[i] receives a new at::Tensor* (a scalar) the
// caller owns. 0: done; 1: an exception.
int flotilla_foreach_norm(void* const* tensors, int n, void** outputs) {
  try {
    auto norms = at::_foreach_norm(list(tensors, n), 2);
    for (int i = 0; i < n; ++i) {
      outputs[i] = new at::Tensor(norms[i]);
    }
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return 1;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// at::_amp_foreach_non_finite_check_and_unscale_: n gradients multiplied by `inv_scale` in
// place, `found_inf` (a float tensor of one element on their device) set to 1 when any holds
// an inf or a NaN (torch.amp.GradScaler's unscale_). 0: done; 1: an exception.
int flotilla_unscale(void* const* grads, int n, void* found_inf, const void* inv_scale) {
  try {
    auto g = list(grads, n);
    auto& found = *static_cast<at::Tensor*>(found_inf);
    const auto& inv = *static_cast<const at::Tensor*>(inv_scale);
    at::_amp_foreach_non_finite_check_and_unscale_(g, found, inv);
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return 1;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// The message of this thread's last failed call above.
const char* flotilla_optim_error() { return last_error.c_str(); }
}
