// Dtype names.
#include "frontend/Dtypes.h"

namespace ganc::frontend {

namespace {

struct DtypeName {
  c10::ScalarType type;
  const char *name;
};

constexpr DtypeName kDtypes[] = {
    {c10::ScalarType::Half, "f16"},         {c10::ScalarType::BFloat16, "bf16"},
    {c10::ScalarType::Float, "f32"},        {c10::ScalarType::Double, "f64"},
    {c10::ScalarType::Char, "i8"},          {c10::ScalarType::Short, "i16"},
    {c10::ScalarType::Int, "i32"},          {c10::ScalarType::Long, "i64"},
    {c10::ScalarType::Byte, "u8"},          {c10::ScalarType::Bool, "b8"},
    {c10::ScalarType::ComplexFloat, "c64"}, {c10::ScalarType::ComplexDouble, "c128"},
};

} // namespace

std::string dtypeName(c10::ScalarType type) {
  for (const DtypeName &d : kDtypes)
    if (d.type == type)
      return d.name;
  return "";
}

Expected<c10::ScalarType> scalarTypeOf(const std::string &name) {
  for (const DtypeName &d : kDtypes)
    if (name == d.name)
      return d.type;
  return Status::error("unknown dtype '" + name + "'");
}

c10::ScalarType inputScalarType(const Spec &spec) {
  switch (spec.inputDtype) {
  case InputDtype::Float64:
    return c10::kDouble;
  case InputDtype::BFloat16:
    return c10::kBFloat16;
  case InputDtype::Float16:
    return c10::kHalf;
  case InputDtype::Float32:
    break;
  }
  return c10::kFloat;
}

} // namespace ganc::frontend
