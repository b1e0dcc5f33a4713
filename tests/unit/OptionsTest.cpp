// The option tables every command parses with: both value spellings, one-line errors, and the
// help and docs/cli.md text made from the same table.
#include "support/Options.h"

#include <gtest/gtest.h>

using namespace ganc;

namespace {

struct Target {
  int64_t steps = 0;
  bool force = false;
  std::string out;
  std::vector<std::string> libraries, positional;
  enum class Mode { Auto, Side } mode = Mode::Auto;
};

const Command<Target> &table() {
  static const Command<Target> command = {
      {"tool", {"FILE [options]"}, "Does a thing.", {}, "notes after"},
      {{"--steps", "N", "how many steps", storeInteger(&Target::steps, 1, 100)},
       {"--force", "", "start over", storeTrue(&Target::force)},
       {"--out", "DIR", "where | it goes", storeText(&Target::out), {"-o"}},
       {"--lib", "LIB.so", "a library; repeatable", appendList(&Target::libraries)},
       {"--mode", "auto|side", "the mode",
        storeChoice(&Target::mode, {{"auto", Target::Mode::Auto}, {"side", Target::Mode::Side}})},
       {"--twice", "N", "twice N steps, recorded as set",
        recorded<Target>([](const std::string &, const std::string &v,
                            Target &t) { t.steps = 2 * std::stoll(v); },
                         [](const Target &t) { return nlohmann::json(t.steps / 2); })},
       {"--quiet", "", "not recorded", [](const std::string &, const std::string &, Target &) {}}},
      [](const std::string &a, Target &t) { t.positional.push_back(a); }};
  return command;
}

Status parse(std::vector<std::string> args, Target &t) {
  bool help = false;
  return table().parse(args, t, help);
}

} // namespace

TEST(OptionsTest, ValuesReadSpacedOrInline) {
  Target t;
  ASSERT_TRUE(parse({"in.pt", "--steps", "7", "--out=runs/a", "--force", "--lib", "a.so,b.so",
                     "--lib=c.so", "--mode", "side"},
                    t)
                  .isOk());
  EXPECT_EQ(t.steps, 7);
  EXPECT_EQ(t.out, "runs/a");
  EXPECT_TRUE(t.force);
  EXPECT_EQ(t.libraries, (std::vector<std::string>{"a.so", "b.so", "c.so"}));
  EXPECT_EQ(t.mode, Target::Mode::Side);
  EXPECT_EQ(t.positional, std::vector<std::string>{"in.pt"});
  Target alias;
  ASSERT_TRUE(parse({"-o", "x"}, alias).isOk());
  EXPECT_EQ(alias.out, "x");
}

TEST(OptionsTest, BadInputIsOneLineNamingTheOption) {
  auto error = [](std::vector<std::string> args) {
    Target t;
    Status s = parse(std::move(args), t);
    EXPECT_FALSE(s.isOk());
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    return s.message();
  };
  EXPECT_EQ(error({"--stpes", "3"}), "unknown option '--stpes' (see tool --help)");
  EXPECT_EQ(error({"--steps"}), "--steps needs a value (N)");
  EXPECT_EQ(error({"--steps", "0"}), "--steps takes an integer from 1 to 100, not '0'");
  EXPECT_EQ(error({"--steps=x"}), "--steps takes an integer from 1 to 100, not 'x'");
  EXPECT_EQ(error({"--force=yes"}), "--force takes no value");
  EXPECT_EQ(error({"--mode", "tree"}), "--mode takes auto or side, not 'tree'");
}

TEST(OptionsTest, HelpAndMarkdownComeFromTheTable) {
  const CommandDoc doc = table().documented();
  const std::string usage = doc.usage();
  EXPECT_EQ(usage.rfind("usage: tool FILE [options]\n", 0), 0u) << usage;
  for (const char *line : {"  --steps N               how many steps\n",
                           "  -o, --out DIR           where | it goes\n", "notes after\n"})
    EXPECT_NE(usage.find(line), std::string::npos) << line << "\nin:\n" << usage;
  const std::string markdown = doc.markdown();
  EXPECT_NE(markdown.find("## tool\n"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| `--mode auto\\|side` | the mode |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| `-o, --out DIR` | where \\| it goes |"), std::string::npos)
      << markdown;
}

TEST(OptionsTest, TheRecordColumnShowsEachRecordedValueByItsName) {
  Target t;
  ASSERT_TRUE(
      parse({"--out", "runs/a", "--lib", "a.so,b.so", "--mode", "side", "--twice", "3"}, t).isOk());
  const nlohmann::json record = recordOf(table().options, t);
  EXPECT_EQ(record, nlohmann::json::parse(R"({"steps": 6, "force": false, "out": "runs/a",
      "lib": ["a.so", "b.so"], "mode": "side", "twice": 3})"));
  EXPECT_FALSE(record.contains("quiet")); // a setter written by hand records nothing unless told
}
