// A host tensor copied into page-locked (pinned) memory, from which a copy to a GPU runs
// asynchronously. tch binds Tensor::pin_memory only with its device argument, which libtorch
// deprecates with a warning on every call.
#include <ATen/ATen.h>

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace {
thread_local std::string last_error;
}  // namespace

extern "C" {

// A new at::Tensor* (owned by the caller) holding `tensor`'s values in pinned memory; null on
// an exception (see flotilla_pinned_error).
void* flotilla_pin_memory(const void* tensor) {
  try {
    const auto& t = *static_cast<const at::Tensor*>(tensor);
    return new at::Tensor(t.pin_memory());
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

// The message of this thread's last failed flotilla_pin_memory.
const char* flotilla_pinned_error() { return last_error.c_str(); }

}  // extern "C"
