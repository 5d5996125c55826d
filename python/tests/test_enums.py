# SPDX-License-Identifier: Apache-2.0
"""Every argument of an enum type takes the enum, its value, or its name as
a string in any case; a wrong name raises InvalidArgument listing the valid
ones."""

import numpy as np
import pytest

import kvferry as kvf
from conftest import random_bytes

ENUMS = [kvf.Backend, kvf.CacheRemote, kvf.CudaCopy, kvf.Dtype, kvf.EventKind, kvf.FileIO,
         kvf.FileRunner, kvf.Fsync, kvf.GdsCompat, kvf.GdsState, kvf.Level, kvf.Memory, kvf.Order, kvf.Tier]


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_names_any_case(enum):
    for member in enum:
        for spelling in (member.name, member.name.lower(), member.name.title(), member.name.replace("_", "-")):
            assert enum(spelling) is member
        assert enum(member) is member and enum(int(member)) is member


def test_wrong_name_lists_the_valid_ones():
    with pytest.raises(kvf.InvalidArgument) as err:
        kvf.Engine(backend="hots")
    assert "'hots' is not a Backend" in str(err.value) and "'host'" in str(err.value)
    assert isinstance(err.value, ValueError)
    with pytest.raises(kvf.InvalidArgument, match="'fp12' is not a Dtype.*'bf16'"):
        kvf.Geometry(1, 2, 1, 16, 64, dtype="fp12")


def test_engine_config_strings(tmp_path):
    with kvf.Engine(backend="host", file_dir=str(tmp_path), file_io="posix", fsync="Batch",
                    cuda_copy="auto", file_runner="threads", gds_compat="off") as e:
        assert e.backend is kvf.Backend.HOST


def test_strings_through_a_round_trip(tmp_path, rng):
    g = kvf.Geometry(layers=2, kv_factor=2, kv_heads=2, tokens_per_block=16, head_size=32, dtype="BF16",
                     order="token_major")
    assert (g.dtype, g.order) == (kvf.Dtype.BF16, kvf.Order.TOKEN_MAJOR)
    assert kvf.dtype_bits("fp8-e4m3") == 8
    with kvf.Engine(backend="HOST", file_dir=str(tmp_path), file_namespace="enums") as e:
        e.add_pool(g, primary=kvf.PoolDesc(slots=4, memory="host"), secondary=4)
        data = random_bytes(rng, g.block_bytes)
        e.slot_view(0, 0, level="primary")[:] = data
        e.offload("host", [(0, 2)]).wait(check=True)
        e.offload("disk", [(0, 0x42)]).wait(check=True)
        np.testing.assert_array_equal(e.slot_view(0, 2, "SECONDARY"), data)
        e.slot_view(0, 1)[:] = 0xA5  # poisoned
        e.onboard("Disk", [(0x42, 1)]).wait(check=True)
        np.testing.assert_array_equal(e.slot_view(0, 1), data)
        with kvf.Cache(e, host_blocks=2, remote="off") as cache:
            assert cache is not None


def test_tier_name_takes_names():
    assert kvf.tier_name("disk") == kvf.tier_name(kvf.Tier.DISK)
