// Backward through one unit with an explicit output gradient: the gradients of
// sum(output * grad_output) with respect to `inputs`, computed by the autograd engine with
// grad_output as the seed (torch.autograd.grad(output, inputs, grad_output)). tch's
// run_backward always seeds with ones, which would need an extra product and sum per unit.
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <c10/util/Exception.h>

#include <exception>
#include <vector>

namespace {
thread_local std::string last_error;
}

extern "C" {

// `outputs[i]` receives a new at::Tensor* (undefined when the output does not depend on
// inputs[i]); the caller owns them. 0: done; 1: an exception (see flotilla_vjp_error).
int flotilla_vjp(const void* output, const void* grad_output, const void* const* inputs, int n,
                 void** outputs) {
  try {
    const auto& out = *static_cast<const at::Tensor*>(output);
    const auto& grad = *static_cast<const at::Tensor*>(grad_output);
    std::vector<torch::autograd::Edge> roots{torch::autograd::impl::gradient_edge(out)};
    std::vector<at::Tensor> seeds{grad};
    std::vector<torch::autograd::Edge> edges;
    edges.reserve(n);
    for (int i = 0; i < n; ++i) {
      const auto& t = *static_cast<const at::Tensor*>(inputs[i]);
      if (!t.requires_grad()) {
        throw std::invalid_argument("vjp: an input does not require grad");
      }
      edges.push_back(torch::autograd::impl::gradient_edge(t));
    }
    auto grads = torch::autograd::Engine::get_default_engine().execute(
        roots, seeds, /*keep_graph=*/false, /*create_graph=*/false,
        /*accumulate_grad=*/false, edges);
    for (int i = 0; i < n; ++i) {
      outputs[i] = new at::Tensor(grads[i]);
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

// The message of this thread's last failed flotilla_vjp.
const char* flotilla_vjp_error() { return last_error.c_str(); }
}
