# Third-party dependencies. On Debian they come from tools/setup.sh; on a GPU machine, CAF and
# ZeroMQ come from a prefix in CMAKE_PREFIX_PATH and LibTorch from the installed PyTorch.
find_package(Threads REQUIRED)

# yaml-cpp 0.7 (Debian 12) exports `yaml-cpp`; 0.8 (Ubuntu 24.04) exports `yaml-cpp::yaml-cpp`.
find_package(yaml-cpp REQUIRED)
if(NOT TARGET yaml-cpp::yaml-cpp)
  if(TARGET yaml-cpp)
    add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
  else()
    message(FATAL_ERROR "yaml-cpp was found but exports neither yaml-cpp nor yaml-cpp::yaml-cpp")
  endif()
endif()

# nlohmann/json (Debian's nlohmann-json3-dev, header-only): the parser behind core/json_parse (JSON
# read into json_value), the escaping of every string core/json writes, the messages the workers
# are sent, crucible serve's and serve-policy's answers, and the build service's build keys.
find_package(nlohmann_json 3.11 REQUIRED)

# OpenSSL's libcrypto (Debian's libssl-dev): SHA-256 (core/sha256.hpp), at the processor's SHA
# extensions' speed (docs/building.md).
find_package(OpenSSL 3.0 REQUIRED COMPONENTS Crypto)

# cpp-httplib (Debian's libcpp-httplib-dev): `crucible serve`'s HTTP server. Optional: a build
# without it (a lent GPU machine) has every other command.
find_package(PkgConfig QUIET)
set(CRUCIBLE_HAVE_HTTPLIB OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib>=0.11)
  if(HTTPLIB_FOUND)
    set(CRUCIBLE_HAVE_HTTPLIB ON)
  endif()
endif()
message(STATUS "crucible serve (cpp-httplib): ${CRUCIBLE_HAVE_HTTPLIB}")

find_package(CAF 0.17 REQUIRED)
find_package(ZeroMQ REQUIRED)
find_package(SQLite3 REQUIRED)

# LibTorch: from CRUCIBLE_PYTHON's torch unless Torch_DIR is given.
if(NOT Torch_DIR)
  if(NOT CRUCIBLE_PYTHON)
    if(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
      set(CRUCIBLE_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python")
    else()
      find_program(CRUCIBLE_PYTHON NAMES python3 python REQUIRED)
    endif()
  endif()
  execute_process(
    COMMAND "${CRUCIBLE_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "crucible: cannot import torch with ${CRUCIBLE_PYTHON} (run tools/setup.sh, "
                        "or pass -DCRUCIBLE_PYTHON=... or -DTorch_DIR=...):\n${_torch_err}")
  endif()
  set(Torch_DIR "${_torch_prefix}/Torch")
endif()
set(CRUCIBLE_PYTHON "${CRUCIBLE_PYTHON}" CACHE FILEPATH "Python interpreter with torch (harness, tests)")

# CUDA: AUTO enables it when a toolkit is found.
set(CRUCIBLE_HAVE_CUDA OFF)
if(NOT CRUCIBLE_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(CRUCIBLE_HAVE_CUDA ON)
  elseif(CRUCIBLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "crucible: CRUCIBLE_CUDA=ON but no CUDA toolkit was found (set CUDAToolkit_ROOT)")
  endif()
endif()
# A CUDA-built LibTorch configures CUDA itself and, without an architecture list, compiles and
# runs a probe on the local GPU; name the architectures instead (Hopper by default) so the
# same configure works on machines with and without a GPU.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch's CUDA flags")
endif()
find_package(Torch REQUIRED)
if(CRUCIBLE_HAVE_CUDA)
  find_package(NCCL REQUIRED)
  # Our own kernels (env/eval/device/device_bytes.cu, device_clock.cu): Ampere and Hopper, plus PTX for later GPUs.
  set(CRUCIBLE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING "CUDA architectures of crucible's kernels")
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  # One CUDA runtime per process: the shared one, which LibTorch also loads.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  message(STATUS "crucible: CUDA ${CUDAToolkit_VERSION}, NCCL ${NCCL_VERSION}")
else()
  message(STATUS "crucible: CUDA code disabled")
endif()
