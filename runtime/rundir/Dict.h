// String-keyed dictionaries of IValues: the shape of everything ganc saves for torch.load.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/jit_type.h>

namespace ganc::runtime {

/// An empty {str: Any} dictionary.
inline c10::impl::GenericDict makeDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

} // namespace ganc::runtime
