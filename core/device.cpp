#include "core/device.hpp"

#include <cctype>

namespace crucible {

std::string device_id::to_string() const {
  return cuda() ? "cuda:" + std::to_string(index) : std::string{"cpu"};
}

result<device_id> parse_device(std::string_view text) {
  // Every error quotes the text as given, so the caller's message need only say where it came from.
  auto bad = [&](std::string_view why) {
    return fail(errc::invalid_arg, "\"", text, "\" is not a device", why, "; expected cpu, cuda or cuda:N");
  };
  if (text == "cpu")
    return device_id{};
  if (text == "cuda")
    return device_id{device_id::kind::cuda, 0};
  if (text.substr(0, 5) != "cuda:")
    return bad("");
  const auto digits = text.substr(5);
  if (digits.empty())
    return bad(": it has no device number after the colon");
  if (digits.find_first_not_of("0123456789") != std::string_view::npos)
    return bad(": its device number is not made of the digits 0-9");
  // Four digits are more devices than any machine has, and keep the index far from int's limit.
  if (digits.size() > 4)
    return bad(": its device number has more than 4 digits");
  int index = 0;
  for (char c : digits)
    index = index * 10 + (c - '0');
  return device_id{device_id::kind::cuda, index};
}

int cuda_index(std::string_view text) {
  const auto d = parse_device(text);
  return d && d->cuda() ? d->index : -1;
}

std::string child_visible_device(const char* visible, int index) {
  if (visible == nullptr || index < 0)
    return std::to_string(index);
  std::string_view list{visible};
  for (int i = 0;; ++i) {
    const auto comma = list.find(',');
    auto entry = list.substr(0, comma);
    while (!entry.empty() && entry.front() == ' ')
      entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ')
      entry.remove_suffix(1);
    if (i == index)
      return entry.empty() ? std::to_string(index) : std::string{entry};
    if (comma == std::string_view::npos)
      return std::to_string(index);
    list.remove_prefix(comma + 1);
  }
}

std::string hardware_kind_of(std::string_view device, std::string_view model) {
  if (device == "cpu")
    return "cpu";
  std::string lower;
  for (char c : model)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view vendor : {"nvidia ", "amd "})
    if (lower.rfind(vendor, 0) == 0)
      lower = lower.substr(vendor.size());
  auto kind = lower.substr(0, lower.find(' '));
  return kind.empty() ? "gpu" : kind;
}

} // namespace crucible
