// The C++ spec validator (frontend::parseSpec) rejects every spec of tests/specs/invalid.json,
// the list the Python validator (tests/python/test_spec.py) is checked against too, with a
// message that names what is wrong.
#include "frontend/Spec.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace {

using nlohmann::json;

json invalidList() {
  std::ifstream in(GANC_INVALID_SPECS);
  return json::parse(in);
}

json patched(const json &list, const json &c) {
  json spec = list["base"];
  auto apply = [&](const char *field, auto target) {
    if (!c.contains(field))
      return;
    for (const auto &[key, value] : c[field].items())
      target()[key] = value;
  };
  apply("set", [&]() -> json & { return spec; });
  apply("phase", [&]() -> json & { return spec["phases"][0]; });
  apply("input", [&]() -> json & { return spec["phases"][0]["inputs"][0]; });
  return spec;
}

TEST(SharedInvalidSpecs, BaseSpecIsValid) {
  auto spec = ganc::frontend::parseSpec(invalidList()["base"].dump());
  EXPECT_TRUE(spec.isOk()) << spec.status().message();
}

TEST(SharedInvalidSpecs, EveryDocumentedZeroStageIsAccepted) {
  // "zero" is 0, 1 or 2 in docs/spec.md and spec.py; the C++ reader once wanted a string.
  for (int stage : {0, 1, 2}) {
    json spec = invalidList()["base"];
    spec["ganc_spec"] = 2;
    spec["zero"] = stage;
    auto parsed = ganc::frontend::parseSpec(spec.dump());
    ASSERT_TRUE(parsed.isOk()) << stage << ": " << parsed.status().message();
    EXPECT_EQ((*parsed).zero, stage);
  }
}

TEST(SharedInvalidSpecs, CxxValidatorRejectsEveryOne) {
  json list = invalidList();
  ASSERT_FALSE(list["cases"].empty());
  for (const json &c : list["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto spec = ganc::frontend::parseSpec(patched(list, c).dump());
    ASSERT_FALSE(spec.isOk()) << "accepted";
    EXPECT_NE(spec.status().message().find(c["mentions"].get<std::string>()), std::string::npos)
        << spec.status().message();
  }
}

} // namespace
