// TorchScript's types and node attributes in the IR's terms (see IRTypes.h).
#include "frontend/IRTypes.h"

#include "support/torch/Dtypes.h"

#include <map>

namespace ganc::frontend {

namespace jit = torch::jit;

ir::Type convert(const c10::TypePtr &type) {
  using c10::TypeKind;
  // Scalars and objects: a name each.
  static const std::map<TypeKind, const char *> kNames = {
      {TypeKind::IntType, "int"},       {TypeKind::FloatType, "float"},
      {TypeKind::BoolType, "bool"},     {TypeKind::NoneType, "none"},
      {TypeKind::StringType, "str"},    {TypeKind::DeviceObjType, "device"},
      {TypeKind::NumberType, "number"}, {TypeKind::ClassType, "object"},
  };
  switch (type->kind()) {
  case TypeKind::TensorType: {
    auto t = type->expect<c10::TensorType>();
    std::string dtype = t->scalarType() ? dtypeName(*t->scalarType()) : "";
    if (auto sizes = t->sizes().concrete_sizes())
      return ir::Type::tensor(dtype, *sizes);
    return ir::Type::unknownTensor(dtype);
  }
  case TypeKind::ListType:
    return ir::Type::other("list", {convert(type->containedTypes()[0])});
  case TypeKind::OptionalType:
    return ir::Type::other("optional", {convert(type->containedTypes()[0])});
  case TypeKind::TupleType: {
    std::vector<ir::Type> elements;
    for (const auto &t : type->containedTypes())
      elements.push_back(convert(t));
    return ir::Type::other("tuple", elements);
  }
  default: {
    auto name = kNames.find(type->kind());
    return ir::Type::other(name != kNames.end() ? name->second : "any");
  }
  }
}

std::vector<std::pair<std::string, ir::Attribute>> attributesOf(jit::Node *node) {
  std::vector<std::pair<std::string, ir::Attribute>> attrs;
  for (c10::Symbol name : node->attributeNames()) {
    std::string key = name.toUnqualString();
    switch (node->kindOf(name)) {
    case jit::AttributeKind::i:
      attrs.emplace_back(key, node->i(name));
      break;
    case jit::AttributeKind::f:
      attrs.emplace_back(key, node->f(name));
      break;
    case jit::AttributeKind::s:
      attrs.emplace_back(key, node->s(name));
      break;
    case jit::AttributeKind::is:
      attrs.emplace_back(key, node->is(name));
      break;
    case jit::AttributeKind::ival: {
      const c10::IValue &v = node->ival(name);
      if (v.isBool())
        attrs.emplace_back(key, v.toBool());
      else if (v.isInt())
        attrs.emplace_back(key, v.toInt());
      else if (v.isDouble())
        attrs.emplace_back(key, v.toDouble());
      else if (v.isString())
        attrs.emplace_back(key, v.toStringRef());
      else if (v.isDevice())
        attrs.emplace_back(key, v.toDevice().str());
      else if (v.isIntList())
        attrs.emplace_back(key, v.toIntVector());
      else
        attrs.emplace_back(key, std::string(v.tagKind()));
      break;
    }
    case jit::AttributeKind::t:
      attrs.emplace_back(key, std::string("tensor"));
      break;
    default:
      break;
    }
  }
  return attrs;
}

} // namespace ganc::frontend
