// Dtype names.
#include "support/torch/Dtypes.h"

namespace ganc {

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

} // namespace ganc
