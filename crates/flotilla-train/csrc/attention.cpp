// Flash attention over packed rows by sequence bounds (variable lengths, `cu_seqlens`), for
// CUDA: at::_flash_attention_forward with cumulative sequence bounds, differentiable through
// libtorch's autograd (its derivative is _flash_attention_backward). tch binds only the
// fixed-length scaled_dot_product_attention, which needs an O(T^2) mask for packed rows.
#include <ATen/ATen.h>
#include <ATen/ops/_flash_attention_forward.h>

#include <c10/util/Exception.h>

#include <exception>
#include <optional>
#include <string>

namespace {
thread_local std::string last_error;
}

extern "C" {

// Causal attention of q [total, heads, head_dim] to k and v [total, kv_heads, head_dim], each
// sequence (rows cu_seqlens[i] .. cu_seqlens[i + 1], int32 [n + 1] on q's device) attending to
// itself alone; a query sees its sequence's keys up to itself and, with window_left >= 0, only
// the last window_left keys before it. `max_len`: the longest sequence (an upper bound will
// do). `*out` receives a new at::Tensor* [total, heads, head_dim]; the caller owns it.
// 0: done; 1: an exception (see flotilla_flash_varlen_error).
int flotilla_flash_varlen(const void* q, const void* k, const void* v, const void* cu_seqlens,
                          int64_t max_len, double scale, int64_t window_left, void** out) {
  try {
    const auto& query = *static_cast<const at::Tensor*>(q);
    const auto& key = *static_cast<const at::Tensor*>(k);
    const auto& value = *static_cast<const at::Tensor*>(v);
    const auto& bounds = *static_cast<const at::Tensor*>(cu_seqlens);
    std::optional<int64_t> left;
    std::optional<int64_t> right;
    if (window_left >= 0) {
      left = window_left;
      right = 0;
    }
    auto result = at::_flash_attention_forward(query, key, value, bounds, bounds, max_len,
                                               max_len, /*dropout_p=*/0.0, /*is_causal=*/true,
                                               /*return_debug_mask=*/false, scale, left, right);
    *out = new at::Tensor(std::get<0>(result));
    return 0;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return 1;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// The message of this thread's last failed flotilla_flash_varlen.
const char* flotilla_flash_varlen_error() { return last_error.c_str(); }
}
