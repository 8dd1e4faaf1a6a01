// The `crucible replay` command in a real process, on a run directory whose replay store the test
// fills: hacking cases (table, JSON, filters, similarity), SFT export, JSONL export and import.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "core/json_parse.hpp"
#include "process.hpp"
#include "storage/replay_store.hpp"
#include "tests/test_util/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace crucible;
using crucible::testing::run_process;
using crucible::testing::temp_dir;

namespace {

auto cli(std::vector<std::string> args) {
  args.insert(args.begin(), CRUCIBLE_CLI);
  return run_process(args);
}

storage::variant_record row(int i, const std::string& status, const std::string& checks,
                            const std::string& code) {
  storage::variant_record v;
  v.task_id = i % 2 ? "level1/19_ReLU" : "level1/23_Softmax";
  v.task_name = i % 2 ? "ReLU" : "Softmax";
  v.hardware = i < 6 ? "h100" : "l40s";
  v.code = code;
  v.code_hash = "hash-" + std::to_string(i);
  v.status = status;
  v.correct = status == "ok";
  if (status == "ok") v.speedup = 1.0 + 0.5 * i;
  v.reward = status == "ok" ? 0.5 * i : -1.0;
  v.checks_failed = checks;
  v.prompt_id = "p-" + std::to_string(i % 3);
  v.completion = status == "ok" ? "analysis " + std::to_string(i) + "\n```python\n" + code + "\n```" : "";
  v.time_ms = 1795000000000 + i;
  return v;
}

std::vector<json_value> json_lines(const std::string& text) {
  std::vector<json_value> out;
  std::string_view rest = text;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    auto j = parse_json(rest.substr(0, nl));
    REQUIRE(j.ok());
    out.push_back(*j);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
  }
  return out;
}

const char* hack_code =
  "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
  "        s = torch.cuda.Stream()\n        with torch.cuda.stream(s):\n            return x.relu()\n";

} // namespace

TEST_CASE("crucible replay lists hacking cases, exports SFT pairs and moves a store as JSONL") {
  temp_dir tmp;
  const auto run = tmp.path() / "runs" / "r1";
  fs::create_directories(run);
  {
    auto store = storage::replay_store::open(run / "replay.db");
    REQUIRE(store.ok());
    REQUIRE(store->record_prompt("p-0", "prompt zero").ok());
    REQUIRE(store->record_prompt("p-1", "prompt one").ok());  // p-2 has no stored text
    std::vector<storage::variant_record> rows{
      row(0, "ok", "[]", "def a(): return 0"),                              // p-0, 1.0x
      row(1, "rejected", R"(["static:threads"])", hack_code),               // hack, ReLU
      row(2, "ok", "[]", "def b(): return 2"),                              // p-2: skipped
      row(3, "ok", "[]", "def c(): return 3"),                              // p-0, 2.5x
      row(4, "incorrect", R"(["runtime:input_mutation"])", "x = [1, 2, 3]"), // hack, Softmax
      row(5, "incorrect", "[]", "y = 1"),                                   // not a hack
      row(7, "ok", "[]", "def d(): return 7"),                              // p-1, l40s, 4.5x
    };
    REQUIRE(store->record_batch(rows).ok());
  }

  SUBCASE("hacks: a table, JSON, filters and similarity") {
    auto r = cli({"replay", "hacks", run.string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("static:threads") != std::string::npos);
    CHECK(r.out.find("runtime:input_mutation") != std::string::npos);
    CHECK(r.out.find("2 hacking cases in " + run.string()) != std::string::npos);

    r = cli({"replay", "hacks", run.string(), "--json", "--check", "static:threads"});
    REQUIRE(r.exit_code == 0);
    auto j = parse_json(r.out);
    REQUIRE(j.ok());
    REQUIRE(j->as_array().size() == 1);
    CHECK(j->as_array()[0].find("id")->as_int() == 2);
    CHECK(j->as_array()[0].find("code")->as_string() == hack_code);
    CHECK(j->as_array()[0].find("checks")->as_array()[0].as_string() == "static:threads");

    r = cli({"replay", "hacks", run.string(), "--json", "--task", "level1/23_Softmax"});
    REQUIRE(r.exit_code == 0);
    j = parse_json(r.out);
    REQUIRE(j.ok());
    REQUIRE(j->as_array().size() == 1);
    CHECK(j->as_array()[0].find("status")->as_string() == "incorrect");

    const auto cand = tmp.path() / "cand.py";
    REQUIRE(write_file_atomic(cand, std::string(hack_code) + "# tweaked\n").ok());
    r = cli({"replay", "hacks", run.string(), "--similar-to", cand.string(), "--top", "1", "--json"});
    REQUIRE(r.exit_code == 0);
    j = parse_json(r.out);
    REQUIRE(j.ok());
    REQUIRE(j->as_array().size() == 1);
    CHECK(j->as_array()[0].find("id")->as_int() == 2);
    CHECK(j->as_array()[0].find("similarity")->as_double() == 1.0);
    r = cli({"replay", "hacks", run.string(), "--similar-to", cand.string()});
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("similarity") != std::string::npos);
    CHECK(r.out.find("1.000") != std::string::npos);
  }

  SUBCASE("export-sft: verified variants with their prompt, the skipped ones counted on stderr") {
    const auto out = tmp.path() / "sft.jsonl";
    auto r = cli({"replay", "export-sft", run.string(), "--min-speedup", "1.0", "--out", out.string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.find("skipped 1 verified variant ") != std::string::npos);
    auto text = read_file(out);
    REQUIRE(text.ok());
    auto lines = json_lines(*text);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0].find("prompt")->as_string() == "prompt zero");
    CHECK(lines[0].find("completion")->as_string() == row(0, "ok", "[]", "def a(): return 0").completion);
    CHECK(lines[0].find("task")->as_string() == "level1/23_Softmax");
    CHECK(lines[0].find("speedup")->as_double() == 1.0);
    CHECK(lines[0].find("hardware")->as_string() == "h100");
    CHECK(lines[0].find("variant_id")->as_int() == 1);
    CHECK(lines[2].find("prompt")->as_string() == "prompt one");

    r = cli({"replay", "export-sft", run.string(), "--min-speedup", "2", "--hardware", "h100",
             "--out", out.string()});
    REQUIRE(r.exit_code == 0);
    lines = json_lines(*read_file(out));
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("speedup")->as_double() == 2.5);
  }

  SUBCASE("export then import into another run gives the same store") {
    const auto dump = tmp.path() / "dump.jsonl";
    auto r = cli({"replay", "export", run.string(), "--out", dump.string()});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto other = tmp.path() / "runs" / "r2";
    fs::create_directories(other);
    r = cli({"replay", "import", other.string(), dump.string()});
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("imported 9 lines") != std::string::npos);  // 2 prompts + 7 variants
    const auto again = tmp.path() / "again.jsonl";
    REQUIRE(cli({"replay", "export", other.string(), "--out", again.string()}).exit_code == 0);
    CHECK(*read_file(again) == *read_file(dump));
  }

  SUBCASE("errors name the missing run, store, flag or file") {
    auto r = cli({"replay", "hacks", (tmp.path() / "nope").string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find((tmp.path() / "nope").string() + " does not exist") != std::string::npos);
    const auto empty = tmp.path() / "runs" / "empty";
    fs::create_directories(empty);
    r = cli({"replay", "export-sft", empty.string(), "--min-speedup", "1", "--out", "x.jsonl"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find((empty / "replay.db").string() + " not found") != std::string::npos);
    CHECK_FALSE(fs::exists(empty / "replay.db"));
    r = cli({"replay", "export-sft", run.string(), "--out", "x.jsonl"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--min-speedup") != std::string::npos);
    r = cli({"replay", "hacks", run.string(), "--min-speedup", "1"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--min-speedup does not apply") != std::string::npos);
    r = cli({"replay", "import", run.string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("missing FILE") != std::string::npos);
    r = cli({"replay", "import", run.string(), (tmp.path() / "absent.jsonl").string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("absent.jsonl") != std::string::npos);
    r = cli({"replay", "vacuum", run.string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("unknown action 'vacuum'") != std::string::npos);
    r = cli({"replay", "--help"});
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("export-sft RUN --min-speedup X") != std::string::npos);
  }
}

TEST_CASE("crucible replay samples writes each policy sample with its fate and completion, all or of one fate") {
  temp_dir tmp;
  const auto run = tmp.path() / "runs" / "r2";
  fs::create_directories(run);
  {
    auto store = storage::replay_store::open(run / "replay.db");
    REQUIRE(store.ok());
    auto a = row(1, "ok", "[]", "def a(): return 1");
    a.group_id = 7;
    auto b = row(3, "ok", "[]", "def b(): return 3");
    b.group_id = 7;
    auto c = row(5, "incorrect", "[]", "def c(): return 5");
    c.group_id = 8;
    auto seed = row(2, "ok", "[]", "def s(): return 2"); // group 0: no sample row
    for (const auto& v : {a, b, c, seed})
      REQUIRE(store->record(v).ok());
    REQUIRE(*store->set_group_fate(7, storage::sample_fate::trained, 3, 1) == 2);
  }
  const auto out = tmp.path() / "samples.jsonl";
  auto r = cli({"replay", "samples", run.string(), "--out", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("3 samples: 2 trained, 1 undecided") != std::string::npos);
  auto lines = json_lines(*read_file(out));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].find("fate")->as_string() == "trained");
  CHECK(lines[0].find("fate_step")->as_int() == 3);
  CHECK(lines[0].find("task")->as_string() == "level1/19_ReLU");
  CHECK(lines[0].find("completion")->as_string() == "analysis 1\n```python\ndef a(): return 1\n```");
  CHECK(lines[2].find("fate")->as_string() == "undecided");
  CHECK(lines[2].find("status")->as_string() == "incorrect");
  CHECK(lines[2].find("speedup")->is_null());
  auto trained = cli({"replay", "samples", run.string(), "--out", out.string(), "--fate", "trained"});
  REQUIRE(trained.exit_code == 0);
  CHECK(json_lines(*read_file(out)).size() == 2);
  auto bad = cli({"replay", "samples", run.string(), "--out", out.string(), "--fate", "eaten"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--fate eaten is not a fate") != std::string::npos);
}
