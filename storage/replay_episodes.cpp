// storage/replay_episodes.cpp: what continues a multi-turn episode in a later process. Each
// turn's sample row keeps its context, tokens, log-probs, verdict and whether its episode went
// on; each group's first prompt is a row of episode_groups. A run resumed after a crash, or
// after a pause that dropped its groups, reopens the groups whose samples never reached a
// trainer and continues their episodes at the turn they reached (docs/training.md).
#include "storage/replay_store.hpp"
#include "storage/replay_store_detail.hpp"

#include <map>

namespace crucible::storage {

using detail::bind_array;
using detail::bind_text;
using detail::column_array;
using detail::column_text;
using detail::db_fail;
using detail::in_transaction;
using detail::statement;
using detail::where;

result<void> replay_store::record_episode_group(const episode_group_record& g) {
  if (g.group_id == 0) return fail(errc::invalid_arg, where(path_), ": an episode group needs a group id other than 0");
  if (g.task_id.empty()) return fail(errc::invalid_arg, where(path_), ": episode group ", std::to_string(g.group_id), " has no task");
  auto exemplars = detail::canonical_array_text(g.exemplar_ids, false);
  if (!exemplars)
    return fail(errc::invalid_arg, where(path_), ": episode group ", std::to_string(g.group_id),
                ": exemplar_ids is not a JSON array of integers: ", g.exemplar_ids);
  statement st;
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO episode_groups (group_id, task_id, turns, episodes, system, user,"
                         " prompt_id, exemplar_ids, prompt_tokens, time_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  sqlite3_bind_int64(st.s, 1, static_cast<std::int64_t>(g.group_id));
  bind_text(st.s, 2, g.task_id);
  sqlite3_bind_int64(st.s, 3, g.turns);
  sqlite3_bind_int64(st.s, 4, g.episodes);
  bind_text(st.s, 5, g.system);
  bind_text(st.s, 6, g.user);
  bind_text(st.s, 7, g.prompt_id);
  bind_text(st.s, 8, *exemplars);
  bind_array(st.s, 9, std::span<const std::int32_t>(g.prompt_tokens));
  sqlite3_bind_int64(st.s, 10, detail::now_ms());
  if (sqlite3_step(st.s) != SQLITE_DONE) return db_fail(db_, path_, "record an episode group");
  return {};
}

namespace {

// The groups every one of whose samples is unfinished, in the version window, with its episode
// data, and whose first prompt is stored.
constexpr const char* reopenable_sql =
  "SELECT g.group_id, g.task_id, g.turns, g.episodes, g.system, g.user, g.prompt_id, g.exemplar_ids,"
  " g.prompt_tokens, COALESCE(p.text, '') FROM episode_groups g LEFT JOIN prompts p ON p.prompt_id = g.prompt_id"
  " WHERE EXISTS (SELECT 1 FROM samples s WHERE s.group_id = g.group_id)"
  " AND NOT EXISTS (SELECT 1 FROM samples s WHERE s.group_id = g.group_id AND (s.fate IS NOT 'unfinished'"
  "   OR s.policy_version < ?1 OR s.policy_version > ?2 OR s.verdict IS NULL OR s.tokens IS NULL"
  "   OR s.logprobs IS NULL OR s.episode IS NULL OR s.turn IS NULL OR s.episode >= g.episodes OR s.turn >= g.turns))"
  " ORDER BY g.group_id";

constexpr const char* turns_sql =
  "SELECT id, episode, turn, policy_version, completion, context, tokens, logprobs, verdict, continues"
  " FROM samples WHERE group_id = ?1 ORDER BY episode, turn, id";

} // namespace

result<std::vector<reopened_episode_group>> replay_store::reopen_episode_groups(std::uint64_t min_version,
                                                                                std::uint64_t max_version,
                                                                                std::size_t limit) {
  return in_transaction(db_, path_, "reopen episode groups", [&]() -> result<std::vector<reopened_episode_group>> {
    std::vector<reopened_episode_group> out;
    {
      statement st;
      if (sqlite3_prepare_v2(db_, reopenable_sql, -1, &st.s, nullptr) != SQLITE_OK) return db_fail(db_, path_, "prepare");
      sqlite3_bind_int64(st.s, 1, static_cast<std::int64_t>(min_version));
      sqlite3_bind_int64(st.s, 2, static_cast<std::int64_t>(max_version));
      int rc;
      while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
        reopened_episode_group r;
        auto& g = r.group;
        g.group_id = static_cast<std::uint64_t>(sqlite3_column_int64(st.s, 0));
        g.task_id = column_text(st.s, 1);
        g.turns = static_cast<std::uint32_t>(sqlite3_column_int64(st.s, 2));
        g.episodes = static_cast<std::uint32_t>(sqlite3_column_int64(st.s, 3));
        g.system = column_text(st.s, 4);
        g.user = column_text(st.s, 5);
        g.prompt_id = column_text(st.s, 6);
        g.exemplar_ids = column_text(st.s, 7);
        auto tokens = column_array<std::int32_t>(st.s, 8);
        if (!tokens) continue; // a damaged row: the group is left as it is
        g.prompt_tokens = std::move(*tokens);
        r.prompt = column_text(st.s, 9);
        out.push_back(std::move(r));
      }
      if (rc != SQLITE_DONE) return db_fail(db_, path_, "find the episode groups to reopen");
    }
    statement turns;
    if (sqlite3_prepare_v2(db_, turns_sql, -1, &turns.s, nullptr) != SQLITE_OK) return db_fail(db_, path_, "prepare");
    statement undecide;
    if (sqlite3_prepare_v2(db_, "UPDATE samples SET fate = NULL, fate_step = 0, fate_seq = NULL WHERE group_id = ?1", -1,
                           &undecide.s, nullptr) != SQLITE_OK)
      return db_fail(db_, path_, "prepare");
    std::vector<reopened_episode_group> kept;
    for (auto& r : out) {
      if (kept.size() >= limit) break;
      sqlite3_reset(turns.s);
      sqlite3_bind_int64(turns.s, 1, static_cast<std::int64_t>(r.group.group_id));
      bool whole = true;
      std::map<std::pair<std::uint32_t, std::uint32_t>, bool> seen;
      int rc;
      while ((rc = sqlite3_step(turns.s)) == SQLITE_ROW) {
        stored_episode_turn t;
        t.sample_id = sqlite3_column_int64(turns.s, 0);
        t.episode = static_cast<std::uint32_t>(sqlite3_column_int64(turns.s, 1));
        t.turn = static_cast<std::uint32_t>(sqlite3_column_int64(turns.s, 2));
        t.policy_version = static_cast<std::uint64_t>(sqlite3_column_int64(turns.s, 3));
        t.completion = column_text(turns.s, 4);
        auto context = column_array<std::int32_t>(turns.s, 5);
        auto tokens = column_array<std::int32_t>(turns.s, 6);
        auto logprobs = column_array<float>(turns.s, 7);
        if (!context || !tokens || !logprobs || tokens->size() != logprobs->size()
            || !seen.emplace(std::pair{t.episode, t.turn}, true).second) {
          whole = false;
          continue;
        }
        t.data.context = std::move(*context);
        t.data.tokens = std::move(*tokens);
        t.data.logprobs = std::move(*logprobs);
        t.data.verdict = column_text(turns.s, 8);
        t.data.continues = sqlite3_column_int64(turns.s, 9) != 0;
        r.turns.push_back(std::move(t));
      }
      if (rc != SQLITE_DONE) return db_fail(db_, path_, "read an episode group's turns");
      // Each episode's turns from 0 without a gap, only the last of them going on.
      std::map<std::uint32_t, std::uint32_t> next_turn;
      for (std::size_t i = 0; whole && i < r.turns.size(); ++i) {
        const auto& t = r.turns[i];
        auto& want = next_turn[t.episode];
        const bool last = i + 1 == r.turns.size() || r.turns[i + 1].episode != t.episode;
        whole = t.turn == want && (last || t.data.continues);
        ++want;
      }
      if (!whole) continue;
      sqlite3_reset(undecide.s);
      sqlite3_bind_int64(undecide.s, 1, static_cast<std::int64_t>(r.group.group_id));
      if (sqlite3_step(undecide.s) != SQLITE_DONE) return db_fail(db_, path_, "reopen a group's samples");
      kept.push_back(std::move(r));
    }
    return kept;
  });
}

result<std::uint64_t> replay_store::max_group_id() const {
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT MAX(group_id) FROM samples WHERE group_id > 0", -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  if (sqlite3_step(st.s) != SQLITE_ROW) return db_fail(db_, path_, "find the largest group id");
  return sqlite3_column_type(st.s, 0) == SQLITE_NULL ? std::uint64_t{0}
                                                     : static_cast<std::uint64_t>(sqlite3_column_int64(st.s, 0));
}

} // namespace crucible::storage
