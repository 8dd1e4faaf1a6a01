"""trusted.py: the references captured at import, and the seeding every candidate call gets
(_fresh_seed, _reseed_visible: torch's, Python's and numpy's generators from the OS)."""
import random

import numpy as np
import torch


def draws():
    return torch.rand(4).tolist(), random.random(), np.random.random()


def test_fresh_seed_is_63_bits_from_the_os(trusted):
    seeds = {trusted._fresh_seed() for _ in range(64)}
    assert len(seeds) == 64
    assert all(type(s) is int and 0 <= s < (1 << 63) for s in seeds)
    assert max(seeds) >= 1 << 60   # the high bits are used (a chance of 2^-192 that this fails)


def test_fresh_seed_ignores_every_visible_generator(trusted):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    a = trusted._fresh_seed()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert trusted._fresh_seed() != a


def test_reseed_visible_replaces_every_generators_state(trusted):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    seeded = draws()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    trusted._reseed_visible()
    first = draws()
    trusted._reseed_visible()
    second = draws()
    for a, b, c in zip(seeded, first, second):
        assert a != b and b != c and a != c


def test_reseed_visible_leaves_the_harness_generators_alone(trusted):
    # The inputs are drawn from explicit generators (make_inputs): a candidate's reseeding of the
    # global ones cannot predict them, and the harness's reseeding does not disturb them.
    g = torch.Generator().manual_seed(5)
    r = random.Random(5)
    torch.rand(3, generator=g)
    r.random()
    trusted._reseed_visible()
    want_g = torch.Generator().manual_seed(5)
    want_r = random.Random(5)
    torch.rand(3, generator=want_g)
    want_r.random()
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=want_g))
    assert r.random() == want_r.random()


def test_captured_references_are_the_originals(trusted):
    # Captured at import, before any candidate: the C-level functions where torch has them.
    assert trusted._len is len and trusted._isinstance is isinstance and trusted._getattr is getattr
    assert trusted._T_clone is torch.Tensor.clone and trusted._T_copy_ is torch.Tensor.copy_
    assert trusted._cuda_synchronize is torch._C._cuda_synchronize
    assert trusted._Generator is torch.Generator and trusted._Random is random.Random
    assert trusted._torch_manual_seed is torch.manual_seed
