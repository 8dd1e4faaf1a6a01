#include <doctest/doctest.h>

#include <filesystem>

#include <unistd.h>

#include "env/reward.hpp"
#include "core/json_parse.hpp"
#include "env/verdict.hpp"
#include "env/eval/verdict_cache.hpp"

using namespace crucible;
using namespace crucible::env;

TEST_CASE("verdict JSON carries every DESIGN field, nulls where a number is absent, and parses back") {
  verdict v;
  v.status = verdict_status::rejected;
  v.checks_failed = {"static:threads", "runtime:patched"};
  v.message = "line 3: imports \"threading\"\n";
  v.hardware = "cpu: test";
  auto json = to_json(v);
  for (const char* key : {"\"status\":\"rejected\"", "\"correct\":false", "\"speedup\":null", "\"speedup_spread\":null",
                          "\"ref_ms\":null", "\"cand_ms\":null", "\"reward\":0", "\"checks_failed\":[\"static:threads\"",
                          "\"message\":", "\"hardware\":\"cpu: test\"", "\"cache_hit\":false"})
    CHECK_MESSAGE(json.find(key) != std::string::npos, key);
  auto back = verdict_from_json(json);
  REQUIRE(back.has_value());
  CHECK(back->status == verdict_status::rejected);
  CHECK(back->checks_failed == v.checks_failed);
  CHECK(back->message == v.message);
  CHECK_FALSE(back->has_speedup());
  v.status = verdict_status::ok;
  v.speedup = 1.37;
  v.speedup_spread = 0.012;
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->speedup == doctest::Approx(1.37));
  CHECK(back->profile.empty());
  CHECK(std::isnan(back->own_share));
  CHECK(to_json(v).find("profile") == std::string::npos); // absent, as in verdicts cached before it
  // The candidate's profile (for feedback) round-trips.
  v.profile = {{"fused_kernel", 0.75}, {"aten::add", 0.25}};
  v.own_share = 0.75;
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->profile == v.profile);
  CHECK(back->own_share == doctest::Approx(0.75));
  // Each side's numeric settings round-trip; what the candidate changed is listed against the reference's.
  CHECK(to_json(v).find("precision") == std::string::npos);
  v.precision_reference = {{"cuda.matmul.allow_tf32", "False"}, {"float32_matmul_precision", "highest"}};
  v.precision_candidate = {{"cuda.matmul.allow_tf32", "True"}, {"float32_matmul_precision", "highest"}};
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->precision_reference == v.precision_reference);
  CHECK(back->precision_candidate == v.precision_candidate);
  CHECK(*back == v);
  // How it was judged: absent where unknown (a task checked alone, a verdict cached before it).
  CHECK(to_json(v).find("judged") == std::string::npos);
  v.judged = "boundary";
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->judged == "boundary");
  CHECK(*back == v);
  // The reference's work: absent until counted, then its operations by dtype and its bytes.
  CHECK(to_json(v).find("work") == std::string::npos);
  v.work.flops = {{"float32", 268435456.0}, {"bfloat16", 960.0}};
  v.work.bytes_read = 1312768;
  v.work.bytes_written = 4194304;
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->work == v.work);
  CHECK(*back == v);
  // The bound on this hardware (env/eval/limits.hpp): absent until known, then with both fractions.
  CHECK(to_json(v).find("\"bound\"") == std::string::npos);
  v.cand_ms = 0.5;
  v.ref_ms = 2.0;
  v.bound = task_bound{0.25, 0.25, 0.125};
  CHECK(v.fraction() == 0.5);
  CHECK(v.ref_fraction() == 0.125);
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(back->bound == v.bound);
  CHECK(*back == v);
  CHECK(to_json(v).find("\"fraction\":0.5") != std::string::npos);
  CHECK(to_json(v).find("\"ref_fraction\":0.125") != std::string::npos);
  CHECK(to_json(v).find("\"fraction_of\":\"ms\"") != std::string::npos);
  // A candidate faster than the FLOP part (fewer operations than the reference's algorithm) is
  // measured against the bytes part alone: never above 1.0 for doing less work.
  v.bound = task_bound{0.3, 0.03, 0.3};
  v.cand_ms = 0.06;
  CHECK(v.beat_flops());
  CHECK(v.fraction() == doctest::Approx(0.5));
  CHECK(v.ref_fraction() == doctest::Approx(0.15));
  CHECK(to_json(v).find("\"fraction_of\":\"bytes_ms\"") != std::string::npos);
  back = verdict_from_json(to_json(v));
  REQUIRE(back.has_value());
  CHECK(*back == v);
  v.cand_ms = 0.3; // at the FLOP part: the whole bound
  CHECK_FALSE(v.beat_flops());
  CHECK(v.fraction() == doctest::Approx(1.0));
  v.bound = task_bound{0.25, 0.25, 0.125};
  v.cand_ms = 0.5;
  auto bound_of_text = [](const char* text) { return task_bound_from_json(*parse_json(text)); };
  CHECK(bound_of_text(R"({"ms": 2, "bytes_ms": 2, "flops_ms": 1})") == task_bound{2, 2, 1});
  CHECK_FALSE(bound_of_text(R"({"ms": 1, "bytes_ms": 2, "flops_ms": 1})").has_value()); // not the larger
  CHECK_FALSE(bound_of_text(R"({"ms": 2, "bytes_ms": 2, "flops_ms": -1})").has_value());
  CHECK_FALSE(bound_of_text(R"({"ms": 2, "bytes_ms": 2})").has_value());
  auto bad_bound = to_json(v);
  bad_bound.replace(bad_bound.find("\"flops_ms\":"), 11, "\"flops_ms\":\"x\",\"z\":");
  CHECK_FALSE(verdict_from_json(bad_bound).has_value());
  auto broken = to_json(v);
  broken.replace(broken.find("\"bytes_read\":"), 13, "\"bytes_read\":\"x\",\"y\":");
  CHECK_FALSE(verdict_from_json(broken).has_value());
  // One reader for a verdict's `work` and a reference worker's: counts finite and not negative,
  // dtype names short.
  auto work_of = [](const char* text) { return task_work_from_json(*parse_json(text)); };
  CHECK(work_of(R"({"flops": {"float32": 2}, "bytes_read": 4, "bytes_written": 8})") == task_work{{{"float32", 2}}, 4, 8});
  CHECK_FALSE(work_of(R"({"flops": {"float32": -2}, "bytes_read": 4, "bytes_written": 8})").has_value());
  CHECK_FALSE(work_of(R"({"flops": {}, "bytes_read": -1, "bytes_written": 8})").has_value());
  CHECK_FALSE(work_of(R"({"flops": {"": 1}, "bytes_read": 1, "bytes_written": 8})").has_value());
  CHECK_FALSE(work_of(R"({"flops": [], "bytes_read": 1, "bytes_written": 8})").has_value());
  CHECK_FALSE(work_of(R"({"flops": {}, "bytes_read": 1})").has_value());
  CHECK(v.precision_changes() == std::vector<std::string>{"cuda.matmul.allow_tf32: True (reference False)"});
  CHECK_FALSE(verdict_from_json("{\"status\": \"great\"}").has_value());
  CHECK_FALSE(verdict_from_json("not json").has_value());
}

TEST_CASE("a cached verdict that is not what to_json wrote reads as none") {
  verdict v;
  v.status = verdict_status::ok;
  v.speedup = 1.5;
  v.rounds = 3;
  v.checks_failed = {"a"};
  v.profile = {{"k", 1.0}};
  v.precision_reference = {{"tf32", "False"}};
  const auto good = to_json(v);
  REQUIRE(verdict_from_json(good).has_value());
  CHECK(verdict_from_json(good)->rounds == 3);
  // `from` replaced by `to` in the good verdict's text.
  auto edit = [&](const std::string& from, const std::string& to) {
    auto out = good;
    const auto at = out.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from);
    return out.replace(at, from.size(), to);
  };
  CHECK_FALSE(verdict_from_json(edit("\"status\":\"ok\",", "")).has_value());         // missing
  CHECK_FALSE(verdict_from_json(edit("\"correct\":false", "\"correct\":0")).has_value()); // of another type
  CHECK_FALSE(verdict_from_json(edit("\"speedup\":1.5", "\"speedup\":\"1.5\"")).has_value());
  CHECK_FALSE(verdict_from_json(edit("\"rounds\":3", "\"rounds\":-3")).has_value());
  CHECK_FALSE(verdict_from_json(edit("\"rounds\":3", "\"rounds\":4294967296")).has_value());
  CHECK_FALSE(verdict_from_json(edit("[\"a\"]", "[1]")).has_value());
  CHECK_FALSE(verdict_from_json(edit("\"share\":1", "\"share\":\"all\"")).has_value());
  CHECK_FALSE(verdict_from_json(edit("\"tf32\":\"False\"", "\"tf32\":false")).has_value());
  CHECK_FALSE(verdict_from_json(good.substr(0, good.size() - 1)).has_value()); // cut short
  CHECK_FALSE(verdict_from_json("[]").has_value());
  CHECK_FALSE(verdict_from_json("status: ok").has_value()); // YAML, not JSON
  // A missing number is no value; a missing list is empty.
  auto bare = verdict_from_json(edit("\"speedup\":1.5,", ""));
  REQUIRE(bare.has_value());
  CHECK_FALSE(bare->has_speedup());
  auto no_checks = verdict_from_json(edit("\"checks_failed\":[\"a\"],", ""));
  REQUIRE(no_checks.has_value());
  CHECK(no_checks->checks_failed.empty());
}

TEST_CASE("reward shaping") {
  verdict ok;
  ok.status = verdict_status::ok;
  ok.speedup = 2.0;
  reward_options r;
  CHECK(compute_reward(ok, r) == doctest::Approx(2.0));
  r.shape = reward_shape::log_speedup;
  CHECK(compute_reward(ok, r) == doctest::Approx(0.693147));
  r.shape = reward_shape::clipped;
  r.clip_max = 1.5;
  CHECK(compute_reward(ok, r) == doctest::Approx(1.5));
  verdict bad;
  bad.status = verdict_status::incorrect;
  r.failed = -1;
  CHECK(compute_reward(bad, r) == -1);
  bad.status = verdict_status::format_error;
  r.format_error = -0.5;
  CHECK(compute_reward(bad, r) == -0.5);
  // reward.limit_weight: the fraction of the hardware's limit added, at most 1, where known.
  r.shape = reward_shape::speedup;
  r.limit_weight = 0.5;
  CHECK(compute_reward(ok, r) == doctest::Approx(2.0)); // no bound: the speedup's alone
  ok.cand_ms = 0.4;
  ok.bound = task_bound{0.1, 0.1, 0.0};
  CHECK(compute_reward(ok, r) == doctest::Approx(2.0 + 0.5 * 0.25));
  ok.bound = task_bound{0.8, 0.1, 0.8}; // a FLOP part past the candidate's time: the bytes part alone
  CHECK(compute_reward(ok, r) == doctest::Approx(2.0 + 0.5 * 0.25));
  ok.bound = task_bound{0.8, 0.8, 0.0}; // past even the bytes part: capped at 1
  CHECK(compute_reward(ok, r) == doctest::Approx(2.5));
  r.limit_weight = 0;
  CHECK(compute_reward(ok, r) == doctest::Approx(2.0));
  CHECK(compute_reward(bad, r) == -0.5);
}

TEST_CASE("the verdict cache stores by key and survives reopening") {
  auto file = std::filesystem::temp_directory_path() / ("crucible-cache-" + std::to_string(::getpid())) / "v.db";
  {
    auto cache = verdict_cache::open(file);
    REQUIRE(cache.ok());
    verdict v;
    v.status = verdict_status::ok;
    v.speedup = 1.5;
    verdict_key k{"t", "c", "cpu: x", "p1"};
    CHECK_FALSE((*cache)->find(k).has_value());
    REQUIRE((*cache)->store(k, v).ok());
    auto hit = (*cache)->find(k);
    REQUIRE(hit.has_value());
    CHECK(hit->speedup == doctest::Approx(1.5));
    CHECK_FALSE((*cache)->find({"t", "c", "cpu: y", "p1"}).has_value()); // other hardware
    CHECK_FALSE((*cache)->find({"t", "c", "cpu: x", "p2"}).has_value()); // other protocol
  }
  auto again = verdict_cache::open(file);
  REQUIRE(again.ok());
  CHECK((*again)->size() == 1);
  std::filesystem::remove_all(file.parent_path());
}
