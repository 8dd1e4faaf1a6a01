"""reference.py's inputs (make_inputs): get_inputs() under the trial's seed, and
what each of the five input distributions does to floating inputs (docs/evaluator.md,
Correctness): 0 as given; 1 times U(0.5, 2) elementwise; 2 as 1 with a random sign; 3 as 2,
times 32; 4 as 1 with one run of a quarter to a 64th of each input scaled by 16 more."""
import types

import pytest
import torch

N = 4096


def task(*make):
    """A task module whose get_inputs() returns make[i]() for each i, drawn in order."""
    return types.SimpleNamespace(get_inputs=lambda: [m() for m in make])


def draw(reference, tsk, seed, dist):
    """make_inputs as the reference phase calls it, on a CPU worker."""
    return reference.make_inputs(tsk, "cpu", seed, dist)


def factors(seed, *sizes, signed=False):
    """The factors distributions 1-3 multiply by, drawn as make_inputs draws them: one generator
    for the call, seeded (seed * 7919 + 17) mod 2^63, a U(0.5, 2) tensor per floating input and,
    for signed ones, a U(0, 1) tensor whose values below 0.5 make the factor negative."""
    gen = torch.Generator().manual_seed((seed * 7919 + 17) % (1 << 63))
    out = []
    for n in sizes:
        f = torch.empty(n).uniform_(0.5, 2.0, generator=gen)
        if signed:
            s = torch.empty(n).uniform_(0.0, 1.0, generator=gen)
            f = f * torch.where(s < 0.5, -1.0, 1.0)
        out.append(f)
    return out


ONES = task(lambda: torch.ones(N), lambda: torch.ones(N))
RANDN = task(lambda: torch.randn(64, 32), lambda: torch.arange(10), lambda: 7, lambda: torch.randn(N))


def test_distribution_0_is_get_inputs_under_the_seed(reference):
    x, i, k, y = draw(reference, RANDN, 1234, 0)
    torch.manual_seed(1234)
    want = RANDN.get_inputs()
    assert torch.equal(x, want[0]) and torch.equal(i, want[1]) and k == 7 and torch.equal(y, want[3])


@pytest.mark.parametrize("dist", range(5))
def test_every_distribution_is_reproducible_from_its_seed(reference, dist):
    a = draw(reference, RANDN, 99, dist)
    b = draw(reference, RANDN, 99, dist)
    c = draw(reference, RANDN, 100, dist)
    assert all(torch.equal(p, q) for p, q in zip(a[:2] + a[3:], b[:2] + b[3:]))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[3], c[3])


@pytest.mark.parametrize("dist", range(5))
def test_integer_tensors_and_plain_values_are_kept(reference, dist):
    _, i, k, _ = draw(reference, RANDN, 5, dist)
    assert torch.equal(i, torch.arange(10)) and i.dtype == torch.int64 and k == 7


def test_distribution_1_scales_by_u_half_to_two(reference):
    a, b = draw(reference, ONES, 7, 1)
    fa, fb = factors(7, N, N)
    assert torch.equal(a, fa) and torch.equal(b, fb)
    assert a.min() >= 0.5 and a.max() <= 2.0 and a.min() < 0.6 and a.max() > 1.9
    assert not torch.equal(a, b)  # each input its own factors


def test_distribution_1_keeps_signs(reference):
    x0, *_ = draw(reference, RANDN, 3, 0)
    x1, *_ = draw(reference, RANDN, 3, 1)
    assert torch.equal(torch.sign(x1), torch.sign(x0))
    r = (x1 / x0)[x0 != 0]
    assert r.min() >= 0.5 and r.max() <= 2.0


def test_distribution_2_gives_random_signs(reference):
    a, b = draw(reference, ONES, 7, 2)
    fa, fb = factors(7, N, N, signed=True)
    assert torch.equal(a, fa) and torch.equal(b, fb)
    assert torch.all((a.abs() >= 0.5) & (a.abs() <= 2.0))
    assert 0.45 < (a < 0).double().mean().item() < 0.55
    # The first input's magnitudes are distribution 1's: its factors are drawn first.
    assert torch.equal(a.abs(), draw(reference, ONES, 7, 1)[0])


def test_distribution_3_is_2_times_32(reference):
    two = draw(reference, RANDN, 11, 2)
    three = draw(reference, RANDN, 11, 3)
    assert reference._DIST3_FACTOR == 32.0
    assert torch.equal(three[0], two[0] * 32) and torch.equal(three[3], two[3] * 32)
    assert torch.equal(three[1], two[1])  # integers: no factor


def test_block_of_by_hand(reference):
    # h = (seed * 1_000_003 + 7_919 * i + 12_345) mod 2^61; length n // (4 << h % 5);
    # start (h // 5) mod (n - length + 1).
    assert reference._block_of(0, 0, 1024) == (162, 256)     # h = 12345: 1/4, 2469 mod 769
    assert reference._block_of(1, 2, 1000) == (653, 125)     # h = 1028186: 1/8, 205637 mod 876
    assert reference._block_of(5, 0, 1) == (0, 1)


def test_block_lengths_are_a_quarter_to_a_64th(reference):
    lengths = {reference._block_of(seed, i, 1 << 12)[1] for seed in range(50) for i in range(3)}
    assert lengths == {1024, 512, 256, 128, 64}
    for seed in range(50):
        start, length = reference._block_of(seed, 1, 1000)
        assert 0 <= start and start + length <= 1000


def run_of(x, base):
    """(start, length) of the elements where x is 16 times base, checking it is one run and that
    every other element equals base."""
    ratio = (x / base).reshape(-1)
    hit = torch.nonzero(ratio == 16.0).reshape(-1)
    assert hit.numel() > 0
    start, length = hit[0].item(), hit.numel()
    assert torch.equal(hit, torch.arange(start, start + length))
    rest = torch.ones_like(ratio, dtype=torch.bool)
    rest[start:start + length] = False
    assert torch.all(ratio[rest] == 1.0)
    return start, length


@pytest.mark.parametrize("seed", [0, 1, 1234, 2 ** 40 + 3])
def test_distribution_4_is_1_with_one_run_scaled_by_16(reference, seed):
    one = draw(reference, ONES, seed, 1)
    four = draw(reference, ONES, seed, 4)
    assert reference._DIST4_FACTOR == 16.0
    for i, (x, base) in enumerate(zip(four, one)):
        assert run_of(x, base) == reference._block_of(seed, i, N)


def test_distribution_4_runs_in_row_major_order_on_non_contiguous_inputs(reference):
    tsk = task(lambda: torch.ones(48, 40).t(), lambda: torch.ones(40, 48))
    one = draw(reference, tsk, 21, 1)
    four = draw(reference, tsk, 21, 4)
    assert not tsk.get_inputs()[0].is_contiguous()
    for i, (x, base) in enumerate(zip(four, one)):
        assert x.shape == (40, 48)
        assert run_of(x.contiguous(), base.contiguous()) == reference._block_of(21, i, 40 * 48)


def test_distribution_4_leaves_single_elements_and_integers_alone(reference):
    tsk = task(lambda: torch.ones(1), lambda: torch.ones(256, dtype=torch.int32), lambda: torch.ones(256))
    one = draw(reference, tsk, 8, 1)
    four = draw(reference, tsk, 8, 4)
    assert torch.equal(four[0], one[0]) and torch.equal(four[1], one[1])
    # The third input is the third, not the first, floating input: its block uses i = 2.
    assert run_of(four[2], one[2]) == reference._block_of(8, 2, 256)


# Distributions 2 and 3 on the torch path (CPU, or a non-contiguous CUDA input) multiply by a
# sign factor, which must be in the input's dtype: a float32 factor (torch.where's default) once
# turned float16 and bfloat16 inputs into float32.
@pytest.mark.parametrize("dtype, dist", [
    pytest.param(dt, d, id=f"{str(dt).removeprefix('torch.')}-dist{d}")
    for dt in (torch.float16, torch.bfloat16, torch.float64) for d in (1, 2, 3, 4)])
def test_other_floating_dtypes_are_scaled_in_their_dtype(reference, dtype, dist):
    tsk = task(lambda: torch.ones(512, dtype=dtype))
    (x,) = draw(reference, tsk, 4, dist)
    m = x.abs().double()
    lo, hi = 0.5 * (32 if dist == 3 else 1), 2.0 * (32 if dist == 3 else 16 if dist == 4 else 1)
    assert m.min() >= lo and m.max() <= hi
    assert x.dtype == dtype


def test_get_inputs_runs_under_the_workers_device(reference):
    seen = []

    def make():
        t = torch.empty(3)
        seen.append(t.device.type)
        return t

    draw(reference, task(make), 0, 0)
    assert seen == ["cpu"]


def test_count_work_gives_the_matrix_products_flops_by_dtype_and_the_tensors_bytes(reference):
    # x @ w.t() + b in float32 and a bfloat16 batched product: 2*M*N*K operations each; the GELU,
    # the add and the plain value have no FLOP formula and count nothing; bytes are every input
    # tensor's and every output tensor's.
    def ref(x, w, b, k, p, q):
        y = torch.nn.functional.gelu(x @ w.t() + b) * k
        return y, torch.bmm(p, q)

    x, w, b = torch.randn(64, 32), torch.randn(16, 32), torch.randn(16)
    p, q = torch.randn(4, 8, 5, dtype=torch.bfloat16), torch.randn(4, 5, 3, dtype=torch.bfloat16)
    work = reference.count_work(ref, [x, w, b, 2.0, p, q], set())
    assert work["flops"] == {"float32": 2.0 * 64 * 16 * 32, "bfloat16": 2.0 * 4 * 8 * 3 * 5}
    assert work["bytes_read"] == (64 * 32 + 16 * 32 + 16) * 4 + (4 * 8 * 5 + 4 * 5 * 3) * 2
    assert work["bytes_written"] == 64 * 16 * 4 + 4 * 8 * 3 * 2


@pytest.mark.parametrize("dist", [0, 1, 2, 3, 4, 5])
def test_inputs_drawn_into_given_room_are_those_drawn_without_it(reference, dist):
    # executor.py's draw writes each input straight into a slot of its arena (`into`): the same
    # values as make_inputs gives without it, bit for bit (the candidate's trial inputs drawn so
    # are checked by digest against the reference's), in the room given, and plain values as
    # they were.
    tsk = task(lambda: torch.randn(64, 32), lambda: torch.arange(10), lambda: 7, lambda: torch.randn(48, 64).t())
    plain = reference.make_inputs(tsk, "cpu", 99, dist)
    room = []

    def into(i, x):
        room.append((i, x.dtype, tuple(x.shape)))
        t = torch.full(tuple(x.shape), -1, dtype=x.dtype)
        room[-1] += (t,)
        return t

    got = reference.make_inputs(tsk, "cpu", 99, dist, into)
    assert [r[:3] for r in room] == [(0, torch.float32, (64, 32)), (1, torch.int64, (10,)), (3, torch.float32, (64, 48))]
    assert got[2] == 7
    for i, t in ((0, room[0][3]), (1, room[1][3]), (3, room[2][3])):
        assert got[i].data_ptr() == t.data_ptr()
        assert torch.equal(got[i], plain[i])


def test_inputs_drawn_into_given_room_let_get_inputs_own_tensors_go(reference):
    import weakref
    made = []

    def make():
        t = torch.randn(N)
        made.append(weakref.ref(t))
        return t

    tsk = task(make, make)
    seen = []

    def into(i, x):
        # By the second input, the first one get_inputs() made is gone: only its slot holds it.
        seen.append([r() is None for r in made])
        return torch.empty(tuple(x.shape), dtype=x.dtype)

    out = reference.make_inputs(tsk, "cpu", 5, 2, into)
    assert seen == [[False, False], [True, False]]
    assert all(r() is None for r in made)
    assert len(out) == 2


def test_count_work_of_elementwise_work_counts_bytes_only_and_a_failing_call_counts_nothing(reference):
    x = torch.randn(1000)
    assert reference.count_work(lambda t: torch.relu(t) * 2, [x], set()) == {
        "flops": {}, "bytes_read": 4000.0, "bytes_written": 4000.0}

    def broken(t):
        raise RuntimeError("no")

    assert reference.count_work(broken, [x], set()) is None


def test_measure_peaks_gives_every_rate_above_0_on_the_cpu(reference, harness):
    cpu = harness["device"].CPU
    peaks = reference.measure_peaks(cpu, "cpu", reps=1)
    assert peaks is not None
    assert peaks["write_bytes_per_ms"] > 0 and peaks["copy_bytes_per_ms"] > 0
    assert peaks["copy_bytes"] == 64 << 20  # the size the copy rate was measured at (bound_floor_ms)
    # float64, float32 and bfloat16 on the CPU (TF32 and float16 only where the kind has a device).
    assert sorted(peaks["matmul_flops_per_ms"]) == ["bfloat16", "float32", "float64"]
    assert all(r > 0 for r in peaks["matmul_flops_per_ms"].values())
    # A 512 x 512 float32 product is 268 MFLOP: a rate above 1e13 per ms (1e16 FLOP/s) is no CPU's.
    assert peaks["matmul_flops_per_ms"]["float32"] < 1e13


def test_measure_peaks_that_cannot_run_says_none(reference, harness):
    assert reference.measure_peaks(harness["device"].CPU, "no-such-device", reps=1) is None
