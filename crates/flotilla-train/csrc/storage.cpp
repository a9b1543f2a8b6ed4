// Frees and re-allocates, in place, the storage behind a tensor: FSDP's FULL_SHARD drops a
// gathered parameter group after use while the autograd graph still refers to its storage,
// and gathers into the same storage again before the backward that reads it. tch has no
// binding for this; a tch tensor handle is a pointer to an at::Tensor, whose only member is
// its TensorBase.
#include <ATen/core/TensorBase.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>

namespace {
c10::StorageImpl* storage_of(const void* tensor) {
  const auto* t = static_cast<const at::TensorBase*>(tensor);
  if (!t->defined() || !t->has_storage()) {
    return nullptr;
  }
  return t->storage().unsafeGetStorageImpl();
}
}  // namespace

extern "C" {

// 0: freed; 1: the tensor has no storage; 2: an exception.
int flotilla_storage_free(const void* tensor) {
  try {
    c10::StorageImpl* s = storage_of(tensor);
    if (s == nullptr) {
      return 1;
    }
    s->reset();
    return 0;
  } catch (...) {
    return 2;
  }
}

// Gives a freed storage `nbytes` of fresh memory from its own allocator (a no-op when it
// already holds memory). 0: done; 1: no storage or no allocator; 2: an exception.
int flotilla_storage_alloc(const void* tensor, size_t nbytes) {
  try {
    c10::StorageImpl* s = storage_of(tensor);
    if (s == nullptr || s->allocator() == nullptr) {
      return 1;
    }
    if (s->data() != nullptr) {
      return 0;
    }
    s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
    s->set_nbytes(nbytes);
    return 0;
  } catch (...) {
    return 2;
  }
}

// The address of the storage's memory (its start, whatever the tensor's offset into it); null
// without storage or once freed. Tells tensors that share a storage apart from those that do not.
const void* flotilla_storage_data(const void* tensor) {
  try {
    c10::StorageImpl* s = storage_of(tensor);
    return s == nullptr ? nullptr : s->data();
  } catch (...) {
    return nullptr;
  }
}

// Bytes the storage holds now (0 once freed); SIZE_MAX without storage.
size_t flotilla_storage_nbytes(const void* tensor) {
  try {
    c10::StorageImpl* s = storage_of(tensor);
    return s == nullptr ? static_cast<size_t>(-1) : s->nbytes();
  } catch (...) {
    return static_cast<size_t>(-1);
  }
}
}
