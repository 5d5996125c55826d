# SPDX-License-Identifier: Apache-2.0
"""Values the C side cannot hold: an integer too large for its field
raised ValueError naming the argument, where ctypes kept its low bits
(threads=2**40 was 0 threads); a string with a NUL raises, where C read
it cut at the NUL ('a\\x00/../../x' was 'a')."""

import os

import pytest

import kvferry as kvf


@pytest.mark.parametrize("name, value", [
    ("threads", 2**40),
    ("threads", 2**32),
    ("remote_timeout_ms", 2**32),
    ("remote_ttl_s", -1),
    ("file_queue_depth", 2**32 + 8),
    ("cuda_copy_sms", 2**32 + 32),
    ("device", 2**31),
    ("remote_mem_bytes", 2**64),
    ("threads", "4"),
])
def test_engine_integer_out_of_its_field(name, value):
    with pytest.raises(ValueError, match=f"{name} = "):
        kvf.Engine(backend="host", **{name: value})


@pytest.mark.parametrize("name", ["file_dir", "file_namespace", "remote_url", "config_file"])
def test_engine_string_with_nul(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"{name} = .*NUL"):
        kvf.Engine(backend="host", **{name: "a\x00/../../x"})
    assert os.listdir(tmp_path) == []  # nothing made under the name cut at the NUL


def test_size_parse_and_salt_with_nul():
    with pytest.raises(ValueError, match="size_parse: text = .*NUL"):
        kvf.size_parse("4\x00K")
    assert kvf.size_parse("4K") == 4000
    with pytest.raises(ValueError, match="key_salt: name = .*NUL"):
        kvf.key_salt("lora\x00other")


def test_dir_calls_with_nul(tmp_path):
    with pytest.raises(ValueError, match="dir_check: dir = .*NUL"):
        kvf.dir_check(str(tmp_path) + "\x00/etc")
    with pytest.raises(ValueError, match="namespace = .*NUL"):
        kvf.dir_list(tmp_path, "ns\x00x")
    with pytest.raises(ValueError, match="remote_probe: url = .*NUL"):
        kvf.remote_probe("mem://a\x00b")
    with pytest.raises(ValueError, match="remote_probe: timeout_ms = "):
        kvf.remote_probe("mem://a", timeout_ms=2**32)


def test_cache_and_pool_integers(engine, geometry):
    with pytest.raises(ValueError, match="slots = "):
        engine.add_pool(geometry, primary=2**32 + 4)
    with pytest.raises(ValueError, match="geometry: layers = "):
        kvf.Geometry(2**32 + 2, 2, 4, 16, 32).block_bytes
    engine.add_pool(geometry, primary=4, secondary=4)
    with pytest.raises(ValueError, match="slot_ptr: slot = "):
        engine.slot_ptr(0, 2**32)
    for name, value in (("host_blocks", 2**64), ("event_queue", 2**32), ("disk_admit_uses", -1),
                        ("offload_min_priority", 2**32 + 1)):
        with pytest.raises(ValueError, match=f"{name} = "):
            kvf.Cache(engine, **{name: value})
