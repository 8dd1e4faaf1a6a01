// env/eval/device/device_agent_main.cpp: crucible-device, the evaluator's device agent (env/eval/device/device_agent.hpp).
// Started by the evaluator, never by hand: `crucible-device --device N --fd F`, F a Unix socket
// the evaluator holds the other end of.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "env/eval/device/device_agent.hpp"

int main(int argc, char** argv) {
  int device = -1, fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    char* end = nullptr;
    const long v = std::strtol(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0' || v < 0 || v > 1 << 20) {
      std::fprintf(stderr, "crucible-device: %s takes a non-negative number, got '%s'\n", key.c_str(), argv[i + 1]);
      return 2;
    }
    if (key == "--device")
      device = static_cast<int>(v);
    else if (key == "--fd")
      fd = static_cast<int>(v);
    else {
      std::fprintf(stderr, "crucible-device: unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (device < 0 || fd < 0) {
    std::fprintf(stderr, "usage: crucible-device --device N --fd F (started by crucible's evaluator, env/eval/device/device_agent.hpp)\n");
    return 2;
  }
  return crucible::env::serve_device_agent(fd, device);
}
