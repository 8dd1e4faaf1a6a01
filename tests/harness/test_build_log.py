"""channel.py's _build_log: a failed build's log keeps the compiler's error lines, even where a
build of several files prints thousands of characters of command lines after them (what torch's
load_inline raised for a C++ and a CUDA file on an H200: 45 lines, 5,545 characters, the error
on the fifth line, after which the CUDA file's nvcc command and its include trail)."""

FAILED = "\n".join([
    "Error building extension 'reverse_cumsum_cuda': [1/3] c++ -MMD -MF main.o.d -O3 -c main.cpp -o main.o",
    "FAILED: main.o",
    "c++ -MMD -MF main.o.d " + "-I/opt/torch/include/x " * 120 + "-c main.cpp -o main.o",
    "main.cpp: In function 'void pybind11_init_reverse_cumsum_cuda(pybind11::module_&)':",
    "main.cpp:4:50: error: 'forward' was not declared in this scope",
    "[2/3] /usr/local/cuda/bin/nvcc " + "-I/opt/torch/include/y " * 150 + "-c cuda.cu -o cuda.cuda.o",
] + ["                 from /opt/torch/include/c10/core/Device.h:%d," % i for i in range(30)] + [
    "ninja: build stopped: subcommand failed.",
])


def test_the_error_line_is_kept_ahead_of_a_long_tail(channel):
    assert len(FAILED) > 4000
    # The tail alone loses it: that is what the builder sent before.
    assert "'forward' was not declared" not in channel._tail(FAILED, 60)
    log = channel._build_log(FAILED)
    assert log.startswith("Error building extension 'reverse_cumsum_cuda'")
    assert "main.cpp:4:50: error: 'forward' was not declared in this scope" in log.splitlines()[:3]
    assert log.rstrip().endswith("ninja: build stopped: subcommand failed.")
    assert len(log) <= 8000
    # Command lines are no error lines, however they are spelled.
    assert not any(line.startswith(("c++ ", "[2/3]", "FAILED:")) for line in log.split("\n...\n")[0].splitlines())


def test_a_short_log_is_its_tail(channel):
    short = "main.cpp:1:1: error: x\nninja: build stopped: subcommand failed."
    assert channel._build_log(short) == channel._tail(short, 60)
    assert channel._build_log("TypeError: no") == "TypeError: no"
