"""channel.py's _error_done: an out-of-memory error says what the device had free and what the
worker held (the worker sets _OOM_CENSUS where its device reports its memory), where torch's own
report of the device's processes fails in the sandbox (NVML) and left a message without either:
KernelBench's 45_Average_Pooling_2D on an H200, out of memory drawing a timing round's inputs."""

NVML = ('NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
        '"/pytorch/c10/cuda/CUDACachingAllocator.cpp":1135, please report a bug to PyTorch.')


def test_an_out_of_memory_message_carries_the_census_where_one_is_set(channel):
    saved = channel._OOM_CENSUS[0]
    try:
        channel._OOM_CENSUS[0] = None
        plain = channel._error_done(RuntimeError(NVML), "while drawing a timing round's inputs")
        assert plain.status == "runtime_error"
        assert plain.message.startswith("out of memory while drawing a timing round's inputs: ")
        assert "GiB" not in plain.message
        channel._OOM_CENSUS[0] = lambda: "the device has 0.4 GiB free of 139.8; this process holds 51.6 GiB"
        told = channel._error_done(RuntimeError(NVML), "while drawing a timing round's inputs")
        assert told.message.endswith("; the device has 0.4 GiB free of 139.8; this process holds 51.6 GiB")

        def broken():
            raise RuntimeError("no device")

        # A census that fails says nothing, and the verdict's message stays the out-of-memory one.
        channel._OOM_CENSUS[0] = broken
        assert channel._error_done(RuntimeError(NVML), "here").message == plain.message.replace(
            "while drawing a timing round's inputs", "here")
        # Not an out-of-memory error: no census.
        channel._OOM_CENSUS[0] = lambda: "census"
        assert "census" not in channel._error_done(ValueError("bad"), "here").message
    finally:
        channel._OOM_CENSUS[0] = saved
