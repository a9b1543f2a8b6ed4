// libtorch's TF32 switches for fp32 matrix products and convolutions on GPUs
// (torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32), which tch does
// not bind.
#include <ATen/Context.h>

extern "C" {

// Sets both switches to `allow`.
void flotilla_set_allow_tf32(bool allow) {
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

// Whether cuBLAS may use TF32 for fp32 matrix products.
bool flotilla_allow_tf32_cublas() { return at::globalContext().allowTF32CuBLAS(); }

}  // extern "C"
