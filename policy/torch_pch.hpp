// policy/torch_pch.hpp: the precompiled header for every target that uses LibTorch.
// Only policy/ and the tests and benchmarks of policy/ include torch; nothing else may.
#pragma once
#include <torch/torch.h>
