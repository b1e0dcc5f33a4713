#pragma once
// The Python ganc starts for its Python parts (the TensorBoard writer, `ganc plot`).

namespace ganc::support {

/// $GANC_PYTHON when set and not empty, else the Python ganc was configured with.
const char *python();

} // namespace ganc::support
