#include "actors/actor_config.hpp"

#include <caf/sec.hpp>

#include "actors/messages.hpp"

namespace crucible {

actor_config::actor_config() {
  add_message_types<caf::id_block::crucible>();
  // The templated add_error_category<T>() of CAF 0.17.6 does not compile (its lambda does not
  // match error_renderer), so the renderer is spelled out.
  add_error_category(error_category,
                     [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
                       std::string out = "crucible: ";
                       out += to_string(static_cast<errc>(code));
                       if (ctx.match_elements<std::string>()) {
                         out += ": ";
                         out += ctx.get_as<std::string>(0);
                       } else if (!ctx.empty()) {
                         out += ": ";
                         out += caf::to_string(ctx);
                       }
                       return out;
                     });
}

caf::error make_error(errc code, std::string msg) {
  if (msg.empty())
    return caf::error{static_cast<std::uint8_t>(code), error_category};
  return caf::error{static_cast<std::uint8_t>(code), error_category,
                    caf::make_message(std::move(msg))};
}

caf::error make_error(const crucible::error& err) {
  return make_error(err.code, err.message);
}

crucible::error to_error(const caf::error& err) {
  if (!err)
    return crucible::error{};
  if (err.category() == error_category) {
    std::string msg;
    if (err.context().match_elements<std::string>())
      msg = err.context().get_as<std::string>(0);
    return crucible::error{static_cast<errc>(err.code()), std::move(msg)};
  }
  if (err.category() == caf::atom("system")) {
    switch (static_cast<caf::sec>(err.code())) {
      case caf::sec::request_timeout:
        return crucible::error{errc::timeout, caf::to_string(err)};
      case caf::sec::request_receiver_down:
      case caf::sec::cannot_forward_to_invalid_actor:
        return crucible::error{errc::worker_lost, caf::to_string(err)};
      default:
        break;
    }
  }
  return crucible::error{errc::protocol, caf::to_string(err)};
}

} // namespace crucible
