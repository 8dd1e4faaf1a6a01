// The link graph core <- {jinja <- env, text <- policy, storage} <- actors <- tools, checked on
// the includes: a library may include only the folders below it (jinja, the chat-template engine,
// sits between core and env only; text, the tokenizer, between core and policy), CAF only in
// actors/ and tools/, torch only in policy/ (and tests and benchmarks of policy). Inside env the
// vocabulary (env/: tasks, verdicts, the reward) sits below the policy's side (env/prompt/) and the
// evaluator (env/eval/, its CUDA device work in env/eval/device/ below it), and neither of those
// two includes the other. Beside the layering, the house's shape: no friend classes, no hand-written source
// over 1,000 lines.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

struct rule {
  std::set<std::string> project; // project folders it may include
  bool caf = false;
  bool torch = false;
};

const std::map<std::string, rule>& rules() {
  static const std::set<std::string> env_all{"env", "env/prompt", "env/eval", "env/eval/device"};
  auto with_env = [&](std::set<std::string> s) {
    s.insert(env_all.begin(), env_all.end());
    return s;
  };
  static const std::map<std::string, rule> r = {
    {"core", {{"core"}, false, false}},
    {"jinja", {{"core", "jinja"}, false, false}},
    {"env", {{"core", "env"}, false, false}},
    {"env/prompt", {{"core", "jinja", "env", "env/prompt"}, false, false}},
    {"env/eval", {{"core", "env", "env/eval", "env/eval/device"}, false, false}},
    {"env/eval/device", {{"core", "env", "env/eval/device"}, false, false}},
    {"text", {{"core", "text"}, false, false}},
    {"policy", {{"core", "text", "policy"}, false, true}},
    {"storage", {{"core", "storage"}, false, false}},
    {"actors", {with_env({"core", "jinja", "text", "policy", "storage", "actors"}), true, false}},
    {"service", {with_env({"core", "policy", "service"}), false, false}},
    {"tools/crucible", {with_env({"core", "jinja", "text", "policy", "storage", "actors", "service", "tools"}), true, false}},
  };
  return r;
}

// The rule's folder a path belongs to: the longest folder of rules() it lies in ("env/eval" for
// env/eval/compare.hpp, "env" for env/task.hpp), or its first component where none holds it
// ("caf", "torch", "tools").
std::string unit_of(const std::string& path) {
  std::string best;
  for (const auto& [folder, r] : rules())
    if (path.size() > folder.size() && path.compare(0, folder.size(), folder) == 0 && path[folder.size()] == '/'
        && folder.size() > best.size())
      best = folder;
  return best.empty() ? path.substr(0, path.find('/')) : best;
}

std::vector<std::string> violations_in(const fs::path& root, const std::string& folder, const rule& r) {
  static const std::regex include_re{R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])"};
  std::vector<std::string> out;
  if (!fs::exists(root / folder))
    return out;
  for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
    auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".cpp" && ext != ".cu" && ext != ".cuh"))
      continue;
    if (unit_of(fs::relative(entry.path(), root).generic_string()) != folder)
      continue; // a folder inside with a rule of its own (env/eval in env)
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re))
        continue;
      auto inc = m[1].str();
      auto where = fs::relative(entry.path(), root).string() + ":" + std::to_string(n) + ": " + inc;
      const auto first = inc.substr(0, inc.find('/'));
      const auto top = rules().count(first) != 0 ? unit_of(inc) : first;
      if (top == "caf" && !r.caf)
        out.push_back(where + " (CAF outside actors/ and tools/)");
      else if ((top == "torch" || top == "ATen" || top == "c10") && !r.torch)
        out.push_back(where + " (torch outside policy/)");
      else if (rules().count(top) != 0 || top == "tools")
        if (r.project.count(top) == 0)
          out.push_back(where + " (" + folder + " may not depend on " + top + ")");
    }
  }
  return out;
}

} // namespace

TEST_CASE("includes follow the layering core <- {jinja <- env, text <- policy, storage} <- actors <- tools") {
  fs::path root{CRUCIBLE_SOURCE_DIR};
  std::vector<std::string> all;
  for (const auto& [folder, r] : rules()) {
    auto v = violations_in(root, folder, r);
    all.insert(all.end(), v.begin(), v.end());
  }
  for (const auto& v : all)
    FAIL_CHECK(v);
  CHECK(all.empty());
}

TEST_CASE("the layering check sees a violation") {
  // Guard against a checker that passes vacuously: a temporary tree with a bad include.
  auto tmp = fs::temp_directory_path() / ("crucible-layering-" + std::to_string(::getpid()));
  fs::create_directories(tmp / "storage");
  std::ofstream(tmp / "storage" / "bad.cpp") << "#include <caf/all.hpp>\n#include \"actors/x.hpp\"\n";
  auto v = violations_in(tmp, "storage", rules().at("storage"));
  fs::remove_all(tmp);
  REQUIRE(v.size() == 2);
  CHECK(v[0].find("CAF outside") != std::string::npos);
  CHECK(v[1].find("may not depend on actors") != std::string::npos);
}

TEST_CASE("the layering check keeps jinja between core and env") {
  auto tmp = fs::temp_directory_path() / ("crucible-layering-jinja-" + std::to_string(::getpid()));
  fs::create_directories(tmp / "jinja");
  fs::create_directories(tmp / "policy");
  std::ofstream(tmp / "jinja" / "bad.cpp") << "#include \"env/prompt/prompt.hpp\"\n#include \"core/error.hpp\"\n";
  std::ofstream(tmp / "policy" / "bad.cpp") << "#include \"jinja/jinja.hpp\"\n";
  auto in_jinja = violations_in(tmp, "jinja", rules().at("jinja"));
  auto in_policy = violations_in(tmp, "policy", rules().at("policy"));
  fs::remove_all(tmp);
  REQUIRE(in_jinja.size() == 1);
  CHECK(in_jinja[0].find("jinja may not depend on env") != std::string::npos);
  REQUIRE(in_policy.size() == 1);
  CHECK(in_policy[0].find("policy may not depend on jinja") != std::string::npos);
}

TEST_CASE("the layering check keeps text between core and policy, without torch") {
  auto tmp = fs::temp_directory_path() / ("crucible-layering-text-" + std::to_string(::getpid()));
  fs::create_directories(tmp / "text");
  fs::create_directories(tmp / "env");
  std::ofstream(tmp / "text" / "bad.cpp") << "#include \"policy/runtime.hpp\"\n#include <torch/torch.h>\n"
                                          << "#include \"jinja/jinja.hpp\"\n#include \"core/error.hpp\"\n";
  std::ofstream(tmp / "env" / "bad.cpp") << "#include \"text/tokenizer.hpp\"\n";
  auto in_text = violations_in(tmp, "text", rules().at("text"));
  auto in_env = violations_in(tmp, "env", rules().at("env"));
  fs::remove_all(tmp);
  REQUIRE(in_text.size() == 3);
  CHECK(in_text[0].find("text may not depend on policy") != std::string::npos);
  CHECK(in_text[1].find("torch outside policy/") != std::string::npos);
  CHECK(in_text[2].find("text may not depend on jinja") != std::string::npos);
  REQUIRE(in_env.size() == 1);
  CHECK(in_env[0].find("env may not depend on text") != std::string::npos);
}

TEST_CASE("the layering check keeps the evaluator and the prompt side apart inside env") {
  auto tmp = fs::temp_directory_path() / ("crucible-layering-env-" + std::to_string(::getpid()));
  fs::create_directories(tmp / "env" / "eval" / "device");
  fs::create_directories(tmp / "env" / "prompt");
  std::ofstream(tmp / "env" / "eval" / "bad.cpp") << "#include \"env/prompt/prompt.hpp\"\n#include \"env/task.hpp\"\n"
                                                  << "#include \"env/eval/device/device_bytes.hpp\"\n";
  std::ofstream(tmp / "env" / "prompt" / "bad.cpp") << "#include \"env/eval/evaluator.hpp\"\n#include \"jinja/jinja.hpp\"\n";
  std::ofstream(tmp / "env" / "eval" / "device" / "bad.cpp") << "#include \"env/eval/evaluation.hpp\"\n";
  std::ofstream(tmp / "env" / "bad.cpp") << "#include \"env/eval/compare.hpp\"\n#include \"env/verdict.hpp\"\n";
  auto in_eval = violations_in(tmp, "env/eval", rules().at("env/eval"));
  auto in_prompt = violations_in(tmp, "env/prompt", rules().at("env/prompt"));
  auto in_device = violations_in(tmp, "env/eval/device", rules().at("env/eval/device"));
  auto in_env = violations_in(tmp, "env", rules().at("env"));
  fs::remove_all(tmp);
  REQUIRE(in_eval.size() == 1); // not the device file, which is env/eval/device's own
  CHECK(in_eval[0].find("env/eval may not depend on env/prompt") != std::string::npos);
  REQUIRE(in_prompt.size() == 1);
  CHECK(in_prompt[0].find("env/prompt may not depend on env/eval") != std::string::npos);
  REQUIRE(in_device.size() == 1);
  CHECK(in_device[0].find("env/eval/device may not depend on env/eval") != std::string::npos);
  REQUIRE(in_env.size() == 1); // env's own files only: its sub-folders have rules of their own
  CHECK(in_env[0].find("env may not depend on env/eval") != std::string::npos);
}

// ctest registers each doctest case by its name (doctest_discover_tests), and CMake splits a name
// at ';' into a list: the entry then filters for a case that does not exist, runs nothing and
// passes. Twelve cases never ran under ctest so before their names were changed.
TEST_CASE("no test case name holds a semicolon, so ctest runs every case it lists") {
  static const std::regex case_re{R"(TEST_CASE\s*\(\s*"([^"]*)\")"};
  const fs::path root = fs::path{CRUCIBLE_SOURCE_DIR} / "tests";
  std::vector<std::string> bad;
  std::size_t cases = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".cpp")
      continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      for (std::sregex_iterator it(line.begin(), line.end(), case_re), end; it != end; ++it) {
        ++cases;
        if ((*it)[1].str().find(';') != std::string::npos)
          bad.push_back(fs::relative(entry.path(), root).string() + ":" + std::to_string(n));
      }
  }
  CHECK(cases > 400); // the scan saw the suite (463 literal names on 2026-11-26)
  std::string where;
  for (const auto& b : bad)
    where += " tests/" + b;
  INFO("test case names with a semicolon at" << where);
  CHECK(bad.empty());
}

TEST_CASE("the house's shape: no friend classes, and no hand-written source over 1,000 lines") {
  // Where a class needs another's insides, the two are one part or the interface is missing; a file
  // past 1,000 lines holds more than one part (docs/architecture.md). Generated files say so in their
  // first line ("GENERATED by"); the hidden-friend comparison operators are not friend classes.
  static const std::regex friend_class{R"(\bfriend\s+(class|struct)\b)"};
  const fs::path root{CRUCIBLE_SOURCE_DIR};
  std::vector<std::string> friends, long_files;
  std::size_t files = 0;
  for (const char* folder : {"core", "jinja", "env", "text", "policy", "storage", "actors", "service", "tools", "clients", "tests"}) {
    if (!fs::exists(root / folder))
      continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      const auto ext = entry.path().extension();
      if (!entry.is_regular_file()
          || (ext != ".hpp" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".py" && ext != ".sh"))
        continue;
      ++files;
      const auto rel = fs::relative(entry.path(), root).generic_string();
      std::ifstream in(entry.path());
      std::string line, first;
      int n = 0;
      while (std::getline(in, line)) {
        if (++n == 1)
          first = line;
        if (ext != ".py" && ext != ".sh" && std::regex_search(line, friend_class))
          friends.push_back(rel + ":" + std::to_string(n));
      }
      if (n > 1000 && first.find("generated by") == std::string::npos && first.find("GENERATED by") == std::string::npos)
        long_files.push_back(rel + " (" + std::to_string(n) + " lines)");
    }
  }
  CHECK(files > 500); // the scan saw the tree
  std::string f, l;
  for (const auto& x : friends)
    f += " " + x;
  for (const auto& x : long_files)
    l += " " + x;
  INFO("friend classes at" << f);
  CHECK(friends.empty());
  INFO("hand-written files over 1,000 lines:" << l);
  CHECK(long_files.empty());
}
