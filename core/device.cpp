#include "core/device.hpp"

#include <cctype>

namespace crucible {

std::string device_id::name() const {
  return cuda() ? "cuda:" + std::to_string(index) : std::string{"cpu"};
}

std::optional<device_id> parse_device(std::string_view text) {
  if (text == "cpu")
    return device_id{};
  if (text == "cuda")
    return device_id{device_id::kind::cuda, 0};
  if (text.substr(0, 5) != "cuda:")
    return std::nullopt;
  const auto digits = text.substr(5);
  if (digits.empty() || digits.size() > 4)
    return std::nullopt;
  int index = 0;
  for (char c : digits) {
    if (c < '0' || c > '9')
      return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return device_id{device_id::kind::cuda, index};
}

int cuda_index(std::string_view text) {
  const auto d = parse_device(text);
  return d && d->cuda() ? d->index : -1;
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
