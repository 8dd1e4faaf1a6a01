// The evaluator's messages to a worker (env/eval/worker_messages.hpp): each parses as JSON with the
// values given, the candidate's side of the trust boundary gets no task source or tolerances,
// and every field the worker requires (`_need` in env/eval/harness/*.py) is in what the C++ side sends.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/json_parse.hpp"
#include "env/eval/worker_messages.hpp"

using namespace crucible;
using namespace crucible::env;

namespace {

json_value parsed(const std::string& text) {
  auto v = parse_json(text, "message");
  REQUIRE_MESSAGE(v.ok(), text);
  REQUIRE(v->is_object());
  return *v;
}

worker_msg::job_fields reference_job() {
  worker_msg::job_fields f;
  f.task_name = "01_relu \"scale\"";
  f.task_source = "import torch\nclass Model: ...\n";
  f.candidate_source = "class ModelNew:\n\tpass  # \u00e9\n";
  f.seed = 1234567890123ull;
  f.trials = 5;
  f.baseline = "eager";
  f.placement_jitter_bytes = 4096;
  f.quiet_gc = true;
  f.static_checks = true;
  tolerances t;
  t.f32 = {1e-4, 2.5e-5};
  t.bf16 = {0.0078125, 0.01};
  f.tol = t;
  f.rounding_factor = 2;
  f.role = "reference";
  return f;
}

// The names `_need(job, "X")` and `_need(msg, "X")` ask for in one harness module.
std::set<std::string> needed(const char* module, const char* object) {
  std::ifstream in{std::string{CRUCIBLE_SOURCE_DIR} + "/env/eval/harness/" + module};
  REQUIRE_MESSAGE(in.good(), module);
  std::stringstream text;
  text << in.rdbuf();
  const std::string src = text.str();
  std::set<std::string> out;
  const std::regex re{std::string{"_need\\("} + object + ", \"([a-z_]+)\"\\)"};
  for (auto it = std::sregex_iterator(src.begin(), src.end(), re); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1].str());
  return out;
}

} // namespace

TEST_CASE("a job parses back with every value it was given, strings escaped and numbers exact") {
  const auto j = parsed(worker_msg::job(reference_job()));
  CHECK(j.find("type")->as_string() == "job");
  CHECK(j.find("task_name")->as_string() == "01_relu \"scale\"");
  CHECK(j.find("task_source")->as_string() == "import torch\nclass Model: ...\n");
  CHECK(j.find("candidate_source")->as_string() == "class ModelNew:\n\tpass  # \u00e9\n");
  CHECK(j.find("trials")->as_int() == 5);
  CHECK(j.find("reference_only")->as_bool() == false);
  CHECK(j.find("placement_jitter_bytes")->as_int() == 4096);
  CHECK(j.find("seed")->as_double() == 1234567890123.0); // below 2^53: exact
  CHECK(j.find("quiet_gc")->as_bool());
  CHECK(j.find("outputs")->as_string() == "host");
  CHECK(j.find("role")->as_string() == "reference");
  const auto* tol = j.find("tolerances");
  REQUIRE(tol != nullptr);
  const auto& f32 = tol->find("float32")->as_array();
  REQUIRE(f32.size() == 2);
  CHECK(f32[0].as_double() == 1e-4);
  CHECK(f32[1].as_double() == 2.5e-5);
  CHECK(tol->find("bfloat16")->as_array()[0].as_double() == 0.0078125);
  CHECK(j.find("rounding_factor")->as_double() == 2.0);
}

TEST_CASE("the candidate's side of the trust boundary gets no task source, tolerances or rounding factor") {
  auto f = reference_job();
  f.task_source.reset();
  f.tol.reset();
  f.role = "candidate";
  const auto j = parsed(worker_msg::job(f));
  CHECK(j.find("task_source") == nullptr);
  CHECK(j.find("tolerances") == nullptr);
  CHECK(j.find("rounding_factor") == nullptr);
  CHECK(j.find("role")->as_string() == "candidate");
}

TEST_CASE("every field a worker requires is one the evaluator sends") {
  // A field added on one side only would end every job with "the evaluator's message lacks".
  const auto j = parsed(worker_msg::job(reference_job()));
  const auto job_needs = needed("job.py", "msg"); // parse_job reads the job message
  CHECK(job_needs.size() >= 10);
  for (const auto& k : job_needs)
    CHECK_MESSAGE(j.find(k) != nullptr, "job.py needs '" << k << "' in the job");
  CHECK(needed("worker.py", "msg").empty()); // the worker reads no field of a message but the job's (job.py)
  const auto b = parsed(worker_msg::buffers(4));
  const auto d = parsed(worker_msg::draw(4, 2));
  const auto l = parsed(worker_msg::launch(7, false));
  for (const auto& k : needed("executor.py", "msg")) {
    const bool somewhere = b.find(k) != nullptr || d.find(k) != nullptr || l.find(k) != nullptr;
    CHECK_MESSAGE(somewhere, "executor.py needs '" << k << "'");
  }
  CHECK(d.find("dist")->as_int() == 2);
  CHECK(d.find("seed") == nullptr); // a fresh seed the worker's own
  const auto again = parsed(worker_msg::draw(1, 3, true, (1ull << 52) - 5)); // a trial's inputs again
  CHECK(again.find("seed")->as_int() == static_cast<std::int64_t>((1ull << 52) - 5));
  CHECK(again.find("on_device")->as_bool());
  CHECK(l.find("seq")->as_int() == 7);
  CHECK(l.find("null") == nullptr);
  CHECK(parsed(worker_msg::launch(7, true)).find("null")->as_bool());
}

TEST_CASE("commands, build replies and zygote requests are single JSON objects") {
  CHECK(worker_msg::command("finish") == "{\"type\":\"finish\"}");
  const auto f = parsed(worker_msg::fork("ipc:///tmp/a b", "/tmp/s", {"A=1", "B=\"2\""}));
  CHECK(f.find("env")->as_array().size() == 2);
  CHECK(f.find("env")->as_array()[1].as_string() == "B=\"2\"");
  CHECK(parsed(worker_msg::reap(123)).find("pid")->as_int() == 123);
  CHECK(parsed(worker_msg::build_failed("line 1\nerror: \"x\"")).find("log")->as_string() == "line 1\nerror: \"x\"");
  CHECK(parsed(worker_msg::built("/c/ab")).find("dir")->as_string() == "/c/ab");
}
