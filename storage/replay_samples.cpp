// storage/replay_samples.cpp: the replay store's samples, one row per policy sample with its fate
// (trained at step N, dropped as stale, discarded, unfinished, ...): set per group, settled at a
// pause or resume, counted (docs/replay.md, "Samples and their fates").
#include "storage/replay_store.hpp"
#include "storage/replay_store_detail.hpp"

namespace crucible::storage {

using detail::bind_text;
using detail::column_text;
using detail::db_fail;
using detail::statement;
using detail::where;

namespace {

// The field of `c` that counts `fate`; nullptr for a string that is not a fate.
template <class Counts>
auto field_of(Counts& c, std::string_view fate) noexcept -> decltype(&c.trained) {
  if (fate == sample_fate::trained) return &c.trained;
  if (fate == sample_fate::paused) return &c.paused;
  if (fate == sample_fate::stale) return &c.stale;
  if (fate == sample_fate::discarded) return &c.discarded;
  if (fate == sample_fate::unfinished) return &c.unfinished;
  if (fate == sample_fate::orphan) return &c.orphan;
  if (fate == sample_fate::straggler) return &c.straggler;
  if (fate == sample_fate::searched) return &c.searched;
  return nullptr;
}

} // namespace

std::int64_t sample_counts::of(std::string_view fate) const noexcept {
  const auto* n = field_of(*this, fate);
  return n ? *n : 0;
}

std::string sample_counts::text() const {
  std::string out = std::to_string(total) + (total == 1 ? " sample" : " samples");
  std::string parts;
  for (auto fate : sample_fate::all)
    if (const auto n = of(fate); n > 0)
      parts += (parts.empty() ? "" : ", ") + std::to_string(n) + " " + std::string(fate);
  if (pending > 0) parts += (parts.empty() ? "" : ", ") + std::to_string(pending) + " undecided";
  return parts.empty() ? out : out + ": " + parts;
}

result<std::int64_t> replay_store::set_group_fate(std::uint64_t group_id, std::string_view fate, std::int64_t step,
                                                  std::optional<std::int64_t> seq) {
  if (group_id == 0) return fail(errc::invalid_arg, where(path_), ": group 0 holds no samples");
  if (!sample_fate::known(fate)) return fail(errc::invalid_arg, where(path_), ": '", std::string(fate), "' is not a sample fate");
  statement st;
  if (sqlite3_prepare_v2(db_, "UPDATE samples SET fate = ?1, fate_step = ?2, fate_seq = ?3"
                              " WHERE group_id = ?4 AND fate IS NULL",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  bind_text(st.s, 1, fate);
  sqlite3_bind_int64(st.s, 2, step);
  if (seq) sqlite3_bind_int64(st.s, 3, *seq); else sqlite3_bind_null(st.s, 3);
  sqlite3_bind_int64(st.s, 4, static_cast<std::int64_t>(group_id));
  if (sqlite3_step(st.s) != SQLITE_DONE) return db_fail(db_, path_, "set a group's fate");
  return static_cast<std::int64_t>(sqlite3_changes(db_));
}

result<std::int64_t> replay_store::settle_samples(std::optional<std::int64_t> kept_seq) {
  statement st;
  if (sqlite3_prepare_v2(db_, "UPDATE samples SET fate = ?1, fate_step = 0, fate_seq = NULL"
                              " WHERE fate IS NULL OR (?2 IS NOT NULL AND fate_seq IS NOT NULL AND fate_seq > ?2)",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  bind_text(st.s, 1, sample_fate::unfinished);
  if (kept_seq) sqlite3_bind_int64(st.s, 2, *kept_seq); else sqlite3_bind_null(st.s, 2);
  if (sqlite3_step(st.s) != SQLITE_DONE) return db_fail(db_, path_, "settle the samples");
  return static_cast<std::int64_t>(sqlite3_changes(db_));
}

result<sample_counts> replay_store::count_samples() const {
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT fate, COUNT(*) FROM samples GROUP BY fate", -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  sample_counts c;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    const auto n = sqlite3_column_int64(st.s, 1);
    c.total += n;
    if (sqlite3_column_type(st.s, 0) == SQLITE_NULL) {
      c.pending += n;
      continue;
    }
    const auto fate = column_text(st.s, 0);
    std::int64_t* slot = field_of(c, fate);
    if (slot == nullptr)  // only set_group_fate and record write fates, and they check them
      return fail(errc::corrupt, where(path_), ": a sample has the unknown fate '", fate, "'");
    *slot += n;
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "count the samples");
  return c;
}

result<std::vector<sample_record>> replay_store::samples(std::uint64_t group_id) const {
  statement st;
  if (sqlite3_prepare_v2(db_, "SELECT id, variant_id, group_id, policy_version, prompt_id, completion, time_ms, fate,"
                              " fate_step, fate_seq, episode, turn FROM samples WHERE ?1 = 0 OR group_id = ?1 ORDER BY id",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return db_fail(db_, path_, "prepare");
  sqlite3_bind_int64(st.s, 1, static_cast<std::int64_t>(group_id));
  std::vector<sample_record> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    sample_record r;
    r.id = sqlite3_column_int64(st.s, 0);
    r.variant_id = sqlite3_column_int64(st.s, 1);
    r.group_id = static_cast<std::uint64_t>(sqlite3_column_int64(st.s, 2));
    r.policy_version = static_cast<std::uint64_t>(sqlite3_column_int64(st.s, 3));
    r.prompt_id = column_text(st.s, 4);
    r.completion = column_text(st.s, 5);
    r.time_ms = sqlite3_column_int64(st.s, 6);
    r.fate = column_text(st.s, 7);
    r.fate_step = sqlite3_column_int64(st.s, 8);
    if (sqlite3_column_type(st.s, 9) != SQLITE_NULL) r.fate_seq = sqlite3_column_int64(st.s, 9);
    if (sqlite3_column_type(st.s, 10) != SQLITE_NULL) r.episode = static_cast<std::uint32_t>(sqlite3_column_int64(st.s, 10));
    if (sqlite3_column_type(st.s, 11) != SQLITE_NULL) r.turn = static_cast<std::uint32_t>(sqlite3_column_int64(st.s, 11));
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return db_fail(db_, path_, "list the samples");
  return out;
}

} // namespace crucible::storage
