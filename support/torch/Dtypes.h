// The one mapping between LibTorch dtypes, IR dtype names and spec dtype names.
#pragma once

#include "support/Status.h"

#include <c10/core/ScalarType.h>

#include <string>

namespace ganc {

/// "f32", "bf16", ... for a torch dtype; "" for one the IR has no name for.
std::string dtypeName(c10::ScalarType type);

/// The torch dtype of an IR dtype name ("f32", ...); an unknown name is an error, never a
/// silent float32.
Expected<c10::ScalarType> scalarTypeOf(const std::string &name);

} // namespace ganc
