// actors/group_book.hpp: the one record of a GRPO group between its announce and its last
// verdict: its members (a turn of an episode each, with the context it was sampled after), their
// verdicts, the places held open for episodes that go on, and where each episode of a group that
// an earlier process left in flight stands. The exemplar actor keeps the book (it hears every
// announce, turn and verdict) and sends the groups it completes on; the rollout actor reads a
// reopened group's episodes from the same function (episode_points).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include <caf/error.hpp>

#include "actors/messages.hpp"
#include "storage/replay_store.hpp"

namespace crucible {

/// Where one episode of a reopened group stands (episode_resume::stored, by episode).
struct episode_point {
  bool seen = false;         ///< a turn of it is stored
  bool goes_on = false;      ///< its last stored turn `continues`
  std::uint32_t turn = 0;    ///< that last stored turn
  /// It takes another turn: its last stored turn went on, or it has none yet (its first).
  bool open() const noexcept { return goes_on || !seen; }
};

/// One point per episode of `r` (r.episodes); stored turns of an episode beyond that are ignored.
/// The turns come by episode and turn, so an episode's last stored turn decides.
std::vector<episode_point> episode_points(const episode_resume& r);

/// The open groups, by group id. A group of multi-turn episodes (announce.turns > 1) grows as its
/// episodes go on: a scored variant that `continues` holds one more place open, and the
/// group_extend of the next turn fills it with a member. Not thread-safe; owned by one actor.
class group_book {
public:
  /// Where a scored variant goes: a member of an open group (its slot), a second verdict for
  /// one (ignored), or no open group (late, refused, never announced).
  enum class placing { member, duplicate, none };
  struct place {
    placing what = placing::none;
    std::size_t slot = 0;
  };

  /// What a group_extend did: the next turn added as a member, its episode's place released
  /// (variant 0), a variant the group holds already, or nothing (no place held open for it).
  enum class extension { added, released, duplicate, unknown };

  std::size_t size() const noexcept { return groups_.size(); }
  bool is_open(group_id id) const { return groups_.count(id.value) != 0; }

  /// errc::invalid_arg naming what is wrong with `a` (id 0, no completions, ids that do not match
  /// them or repeat, a group open already, no turns); none when it can be opened.
  caf::error check(const group_announce& a) const;
  /// Opens the group `a` announces (check() first); its prompt texts are not kept. Returns the
  /// group's sequence number (a timeout armed for an earlier opening of the id does not apply).
  std::uint64_t open(group_announce a);
  /// Opens again a group an earlier process left in flight: its stored turns as members with
  /// their verdicts (ids[i] the id of r.stored[i]), a place held for each episode that is open().
  /// The group when it has nothing to wait for (closed at once), else its sequence number in
  /// `seq`.
  std::optional<rollout_group> reopen(const episode_resume& r, const std::vector<variant_id>& ids, std::uint64_t& seq);

  /// Where `x` goes (its group and variant).
  place find(const scored_variant& x) const;
  /// Whether the open group `id` is one of multi-turn episodes.
  bool multi_turn(group_id id) const;
  /// What a later process needs to continue the episode of member `slot` of open group `id`
  /// after the verdict in `x`: its context (none for turn 0), tokens, log-probs and the verdict.
  storage::episode_turn_data turn_data(group_id id, std::size_t slot, const scored_variant& x) const;
  /// Member `slot` of open group `x.group` scored (find() said member): an episode that
  /// `continues` holds a place open. The group when that was its last place, closed.
  std::optional<rollout_group> score(std::size_t slot, const scored_variant& x);
  /// The next turn of an episode (or its place released). With `complete`: the group when the
  /// release was its last place, closed.
  extension extend(group_extend x, std::optional<rollout_group>& complete);

  /// Whether `id` is open under sequence number `seq`.
  bool is_open(group_id id, std::uint64_t seq) const;
  /// Closes `id` without sending it.
  void drop(group_id id) { groups_.erase(id.value); }
  /// Closes `id`, each member still without a verdict given `filler`.
  rollout_group fill(group_id id, const verdict& filler);
  /// Closes every group (their members still to come find none).
  void clear() { groups_.clear(); }

private:
  struct open_group {
    group_announce announce;
    std::vector<verdict> verdicts; // verdicts[i] for announce.completions[i] once done[i]
    std::vector<bool> done;
    std::size_t missing = 0;
    std::uint64_t seq = 0;
    // Multi-turn only, one per member: its episode, its turn, the context it was sampled after.
    std::vector<std::uint32_t> episodes, turns;
    std::vector<std::vector<std::int32_t>> contexts;
    std::size_t reserved = 0; // places held open for turns not extended yet

    bool multi_turn() const noexcept { return announce.turns > 1; }
  };
  using iterator = std::unordered_map<std::uint64_t, open_group>::iterator;

  rollout_group close(iterator it);
  std::optional<rollout_group> one_fewer(iterator it);

  std::unordered_map<std::uint64_t, open_group> groups_;
  std::uint64_t next_seq_ = 0;
};

} // namespace crucible
