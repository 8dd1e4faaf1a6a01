// The pace plan of a run's records (storage/pace.hpp), against figures worked by hand.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "storage/pace.hpp"

using namespace crucible::storage;

namespace {
std::string step(int n, const char* stage, double step_s, double wait_s, double update_s, int samples) {
  return "{\"event\":\"train_step\",\"stage\":\"" + std::string{stage} + "\",\"step\":" + std::to_string(n) +
         ",\"step_seconds\":" + std::to_string(step_s) + ",\"wait_seconds\":" + std::to_string(wait_s) +
         ",\"seconds\":" + std::to_string(update_s) + ",\"samples\":" + std::to_string(samples) + "}";
}
std::string verdict(const char* stage) { return "{\"event\":\"verdict\",\"stage\":\"" + std::string{stage} + "\"}"; }
// Two evaluator GPUs held by evaluations 60 s in all: in the cases below, 3 steps of 10 s, so every
// second of both (what 48 verdicts a minute on them cost where they never waited for samples).
const std::string devices = "\"devices\":[{\"device\":\"cuda:0\",\"seconds\":60,\"evaluation_s\":20,\"policy_s\":6,"
                            "\"evaluator\":true},{\"device\":\"cuda:1\",\"seconds\":60,\"evaluation_s\":40,"
                            "\"policy_s\":0,\"evaluator\":true}]";
} // namespace

TEST_CASE("pace: RL steps of a resumed process, with the policy's time on its GPU") {
  std::vector<std::string> lines{"{\"event\":\"run_started\"}", step(1, "sft", 0.1, 0, 0.1, 8),
                                 "{\"event\":\"run_paused\"," + devices + "}", "{\"event\":\"run_resumed\"}"};
  // Three RL steps of 16 samples: 30 s of steps, 27 s waiting, 1.5 s of updates; 48 verdicts.
  for (int i = 0; i < 3; ++i) {
    for (int v = 0; v < 16; ++v)
      lines.push_back(verdict("rl"));
    lines.push_back(step(2 + i, "rl", 10, 9, 0.5, 16));
  }
  lines.push_back("not a record"); // skipped: the report reads the records strictly elsewhere
  lines.push_back("{\"event\":\"run_finished\"," + devices + "}");
  const auto segs = pace_segments(lines);
  REQUIRE(segs.size() == 1); // the SFT process ran no RL step
  const auto& s = segs[0];
  CHECK(s.first_step == 2);
  CHECK(s.last_step == 4);
  CHECK(s.steps == 3);
  CHECK(s.samples == 48);
  CHECK(s.wait_share() == doctest::Approx(0.9));
  CHECK(s.verdicts == 48);
  CHECK(s.verdicts_per_min() == doctest::Approx(96)); // 48 in 30 s
  CHECK(s.evaluator_gpus == 2);
  REQUIRE(s.policy_s.has_value());
  CHECK(*s.policy_s == doctest::Approx(6));
  // The policy takes 2 s a step for 16 samples: 480 verdicts a minute; 48 a GPU-minute here.
  CHECK(s.policy_step_s() == doctest::Approx(2));
  CHECK(s.verdicts_needed_per_min() == doctest::Approx(480));
  CHECK(s.evaluation_s == doctest::Approx(60));
  CHECK(s.evaluation_gpu_s_per_step() == doctest::Approx(20));
  CHECK(s.evaluator_gpus_needed() == 10);
  CHECK(to_string(s) == "RL steps 2-4: 3 steps, 10.0 s a step, 90% waiting for evaluated groups, 5.0% in updates; "
                        "96.0 verdicts/min on 2 evaluator GPUs (48.0 each); the policy's generation and updates "
                        "(2.00 s a step) would take 480 verdicts/min: about 10 evaluator GPUs at this rate; plan: on "
                        "10 evaluator GPUs a step takes 2.00 s asynchronous, up to 4.00 s synchronous (2.00x), "
                        "max_staleness 2 keeps every group; on this run's 2: 10.00 s asynchronous, up to 12.00 s "
                        "synchronous, 10.00 s measured");
}

TEST_CASE("pace: a process that also trained SFT counts the learner's updates alone, and a CPU run no GPUs") {
  std::vector<std::string> lines{"{\"event\":\"run_started\"}", step(1, "sft", 0.1, 0, 0.1, 8)};
  lines.push_back(verdict("rl"));
  lines.push_back(verdict("sft")); // not the RL stage's
  lines.push_back(step(2, "rl", 6, 5, 1, 4));
  lines.push_back("{\"event\":\"run_finished\"," + devices + "}");
  auto segs = pace_segments(lines);
  REQUIRE(segs.size() == 1);
  CHECK_FALSE(segs[0].policy_s.has_value());
  CHECK(segs[0].verdicts == 1);
  CHECK(segs[0].policy_step_s() == doctest::Approx(1));
  CHECK(segs[0].verdicts_needed_per_min() == doctest::Approx(240));
  CHECK(segs[0].evaluation_s == 0); // the SFT process's evaluations are in the record's too
  CHECK(segs[0].evaluator_gpus_needed() == 48); // 10 a minute on 2 GPUs: 5 each
  CHECK(to_string(segs[0]).find("the learner's updates alone (1.00 s a step) would take 240 verdicts/min") !=
        std::string::npos);
  // No devices record (a CPU run): no rate per GPU, so no count of GPUs.
  lines.pop_back();
  segs = pace_segments(lines);
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].evaluator_gpus == 0);
  CHECK_FALSE(segs[0].evaluator_gpus_needed().has_value());
  CHECK(to_string(segs[0]).find("evaluator GPU") == std::string::npos);
  CHECK(pace_segments({}).empty());
}

TEST_CASE("pace plan: the asynchronous and synchronous step on a split, and the staleness that keeps every group") {
  // Two evaluator GPUs giving 48 verdicts a minute each (0.8 a second), 16 samples a step, the
  // policy 2 s a step (the first case's run).
  std::vector<std::string> lines{"{\"event\":\"run_started\"}"};
  for (int i = 0; i < 3; ++i) {
    for (int v = 0; v < 16; ++v)
      lines.push_back(verdict("rl"));
    auto rec = step(2 + i, "rl", 10, 9, 0.5, 16);
    rec.pop_back();
    rec += ",\"staleness_max\":" + std::to_string(i + 1) + ",\"staleness_mean\":" + std::to_string(0.5 * i) + "}";
    lines.push_back(rec);
  }
  lines.push_back("{\"event\":\"run_finished\"," + devices + "}");
  const auto segs = pace_segments(lines);
  REQUIRE(segs.size() == 1);
  const auto& s = segs[0];
  CHECK(s.staleness_max == 3);
  CHECK(s.staleness_mean() == doctest::Approx(0.5)); // (0 + 0.5 + 1) / 3
  // On its own 2 GPUs: 16 samples take 10 s to judge; the evaluators set the pace.
  auto own = plan_for(s, 2);
  REQUIRE(own);
  CHECK(own->evaluation_s == doctest::Approx(10));
  CHECK(own->async_step_s == doctest::Approx(10));
  CHECK(own->sync_step_s == doctest::Approx(12));
  CHECK(own->staleness == 2); // (2 + 10) / 10, up
  // On 10 GPUs (evaluator_gpus_needed): 2 s of evaluation, balanced with the policy's 2 s.
  auto balanced = plan_for(s, 10);
  REQUIRE(balanced);
  CHECK(balanced->evaluation_s == doctest::Approx(2));
  CHECK(balanced->async_step_s == doctest::Approx(2));
  CHECK(balanced->sync_step_s == doctest::Approx(4));
  CHECK(balanced->staleness == 2);
  // On 40: the policy sets the pace, and a sample is judged within the step after its own.
  auto many = plan_for(s, 40);
  REQUIRE(many);
  CHECK(many->async_step_s == doctest::Approx(2));
  CHECK(many->sync_step_s == doctest::Approx(2.5));
  CHECK(many->staleness == 2); // (2 + 0.5) / 2, up
  CHECK_FALSE(plan_for(s, 0));
  CHECK(to_string(s).find("; plan: on 10 evaluator GPUs a step takes 2.00 s asynchronous, up to 4.00 s synchronous "
                          "(2.00x), max_staleness 2 keeps every group; on this run's 2: 10.00 s asynchronous, up to "
                          "12.00 s synchronous, 10.00 s measured; trained samples up to 3 versions old (mean 0.50)") !=
        std::string::npos);
  // No rate per GPU (a CPU run): no plan.
  lines.pop_back();
  CHECK_FALSE(plan_for(pace_segments(lines)[0], 2));
}

TEST_CASE("pace plan: evaluators that wait for samples are planned by their evaluations' time, not by the verdicts a minute seen") {
  // A synchronous run on two H200s (docs/PERFORMANCE.md, issue 88's first measurement): 6 RL steps
  // of 16 samples, 16.15 s a step, the policy's GPU held 82.09 s (13.68 s a step), the one
  // evaluator GPU held by evaluations 13.54 s of its 129 s (most samples were format errors, which
  // no evaluator judges). 105 verdicts in 96.9 s: 65 a minute, which says how fast samples came.
  std::vector<std::string> lines{"{\"event\":\"run_resumed\"}"};
  for (int i = 0; i < 6; ++i) {
    for (int v = 0; v < (i < 3 ? 17 : 18); ++v)
      lines.push_back(verdict("rl"));
    lines.push_back(step(161 + i, "rl", 16.15, 13.8, 1.3, 16));
  }
  lines.push_back("{\"event\":\"run_finished\",\"devices\":[{\"device\":\"cuda:0\",\"seconds\":92.4,"
                  "\"evaluation_s\":0,\"policy_s\":82.09,\"evaluator\":false},{\"device\":\"cuda:1\","
                  "\"seconds\":129.2,\"evaluation_s\":13.54,\"policy_s\":0,\"evaluator\":true}]}");
  const auto segs = pace_segments(lines);
  REQUIRE(segs.size() == 1);
  const auto& s = segs[0];
  CHECK(s.evaluator_gpus == 1);
  CHECK(s.evaluation_gpu_s_per_step() == doctest::Approx(13.54 / 6));
  CHECK(s.evaluator_gpus_needed() == 1); // 2.26 s of evaluation a step against the policy's 13.68 s
  const auto one = plan_for(s, 1);
  REQUIRE(one);
  CHECK(one->evaluation_s == doctest::Approx(2.2567).epsilon(0.001));
  CHECK(one->async_step_s == doctest::Approx(82.09 / 6));
  CHECK(one->sync_step_s == doctest::Approx(15.94).epsilon(0.001)); // 16.15 s measured: within 1.3%
  // By the verdicts a minute alone (the plan before the evaluations' time was read), a step's 16
  // samples would have taken 14.8 s to judge, and the synchronous step 28.5 s.
  auto unread = s;
  unread.evaluation_s = 0;
  const auto by_rate = plan_for(unread, 1);
  REQUIRE(by_rate);
  CHECK(by_rate->evaluation_s == doctest::Approx(16.0 / (105.0 / (6 * 16.15))).epsilon(0.001));
  CHECK(unread.evaluator_gpus_needed() == 2);
}

TEST_CASE("pace: the engine on a GPU of its own: its GPU and the learner's at once, one after the other synchronous") {
  // engine.devices [cuda:0] generates 12 s a step; the learner (model.device cuda:1, which an
  // evaluator shares) updates 3 s a step; 2 s of evaluation a step on cuda:1.
  const std::string split =
    "\"devices\":[{\"device\":\"cuda:0\",\"seconds\":40,\"evaluation_s\":0,\"policy_s\":36,\"evaluator\":false,"
    "\"engine\":true,\"learner\":false},{\"device\":\"cuda:1\",\"seconds\":40,\"evaluation_s\":6,\"policy_s\":9,"
    "\"evaluator\":true,\"engine\":false,\"learner\":true}]";
  std::vector<std::string> lines{"{\"event\":\"run_resumed\"}"};
  for (int i = 0; i < 3; ++i) {
    for (int v = 0; v < 16; ++v)
      lines.push_back(verdict("rl"));
    lines.push_back(step(2 + i, "rl", 12.5, 0, 3, 16));
  }
  lines.push_back("{\"event\":\"run_finished\"," + split + "}");
  auto segs = pace_segments(lines);
  REQUIRE(segs.size() == 1);
  const auto& s = segs[0];
  REQUIRE(s.policy_s.has_value());
  CHECK(*s.policy_s == doctest::Approx(36)); // the busiest GPU: the engine's
  REQUIRE(s.policy_serial_s.has_value());
  CHECK(*s.policy_serial_s == doctest::Approx(45)); // 36 + 9
  CHECK(s.policy_step_s() == doctest::Approx(12));
  CHECK(s.policy_serial_step_s() == doctest::Approx(15));
  CHECK(s.evaluator_gpus_needed() == 1);
  auto p = plan_for(s, 1);
  REQUIRE(p.has_value());
  CHECK(p->async_step_s == doctest::Approx(12)); // generation, with updates and evaluation beside it
  CHECK(p->sync_step_s == doctest::Approx(17));  // 12 + 3 + 2
  CHECK(to_string(s).find("the policy's generation and updates (12.00 s a step on its busiest GPU) would take 80 "
                          "verdicts/min (generation and updates one after the other: 15.00 s): about 1 "
                          "evaluator GPU at this rate; plan: on 1 evaluator GPU a step takes 12.00 s asynchronous, up "
                          "to 17.00 s synchronous (1.42x)") != std::string::npos);

  // The same steps closed by a record of other devices: its one segment.
  auto gpu = [](int index, double policy_s, bool engine, bool learner) {
    return "{\"device\":\"cuda:" + std::to_string(index) + "\",\"seconds\":40,\"evaluation_s\":0,\"policy_s\":" +
           std::to_string(policy_s) + ",\"evaluator\":false,\"engine\":" + (engine ? "true" : "false") +
           ",\"learner\":" + (learner ? "true" : "false") + "}";
  };
  auto closed_by = [&](const std::vector<std::string>& devices) {
    std::string list;
    for (const auto& d : devices)
      list += (list.empty() ? "" : ",") + d;
    lines.back() = "{\"event\":\"run_finished\",\"devices\":[" + list + "]}";
    auto got = pace_segments(lines);
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].policy_serial_s.has_value());
    return got[0];
  };

  // Data-parallel ranks, the engine beside rank 0: the ranks update at once, so the busiest GPU is
  // the policy's time both ways (records before the flags read the same).
  auto ranks = closed_by({gpu(0, 36, true, true), gpu(1, 9, false, true)});
  CHECK(*ranks.policy_s == doctest::Approx(36));
  CHECK(*ranks.policy_serial_s == doctest::Approx(36));
  CHECK(ranks.policy_serial_step_s() == doctest::Approx(12));

  // Two engines apart (cuda:0, cuda:2) generate at once: the busier one's time, then the
  // learner's (cuda:1), not the two engines' summed.
  auto two_apart = closed_by({gpu(0, 36, true, false), gpu(1, 9, false, true), gpu(2, 33, true, false)});
  CHECK(*two_apart.policy_s == doctest::Approx(36));
  CHECK(*two_apart.policy_serial_s == doctest::Approx(45)); // 36 + 9

  // One engine beside the learner (cuda:0: 27 s of generation and 9 of updates), one apart
  // (cuda:1, 30 s): the record does not split cuda:0's time into its parts, so the synchronous
  // time is the busiest GPU's, a lower bound (the apart engine's 30 s and the updates' 9 would be
  // 39).
  auto beside_and_apart = closed_by({gpu(0, 36, true, true), gpu(1, 30, true, false)});
  CHECK(*beside_and_apart.policy_s == doctest::Approx(36));
  CHECK(*beside_and_apart.policy_serial_s == doctest::Approx(36));
}
