# SPDX-License-Identifier: Apache-2.0
"""Engine(config_file=...): the C API's YAML config file, its precedence
under keyword arguments and the environment, the cache keys read from the
same file, and settings() saying where each value came from."""

import pytest

import kvferry as kvf


def _engine_or_skip(**kw):
    try:
        return kvf.Engine(**kw)
    except kvf.Unsupported as exc:  # a build without libyaml refuses a named file
        pytest.skip(f"libkvferry reads no config file: {exc}")


@pytest.fixture
def config(tmp_path, monkeypatch):
    for var in ("KVF_CONFIG", "KVF_BACKEND", "KVF_THREADS", "KVF_FILE_NAMESPACE", "KVF_CACHE_HOST_BLOCKS"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "kvferry.yaml"
    path.write_text("# for the tests\n"
                    "backend: host\n"
                    "threads: 3\n"
                    "file_namespace: fromfile\n"
                    f"file_dir: {tmp_path / 'kv'}\n"
                    "cache_host_blocks: 2\n")
    return path


def test_engine_and_cache_read_the_file(config, geometry):
    with _engine_or_skip(config_file=config, threads=2) as e:
        s = e.settings()
        assert e.backend is kvf.Backend.HOST
        assert s["backend"] == kvf.Setting("host", kvf.SettingSource.FILE, "KVF_BACKEND")
        assert s["file_namespace"].value == "fromfile" and s["file_namespace"].source is kvf.SettingSource.FILE
        assert s["threads"] == ("2", kvf.SettingSource.CALLER, "KVF_THREADS")  # the keyword wins
        assert s["config_file"] == (str(config), kvf.SettingSource.CALLER, "KVF_CONFIG")
        assert s["device"].source is kvf.SettingSource.DEFAULT
        e.add_pool(geometry, primary=4, secondary=4)
        with kvf.Cache(e) as cache:  # no config_file of its own: the engine's
            c = cache.settings()
            assert c["cache_host_blocks"] == ("2", kvf.SettingSource.FILE, "KVF_CACHE_HOST_BLOCKS")
            assert cache.stats().capacity["host"] == 2


def test_path_and_str_alike(config):
    with _engine_or_skip(config_file=str(config)) as e:
        assert e.settings()["threads"] == ("3", kvf.SettingSource.FILE, "KVF_THREADS")


def test_environment_over_file(config, monkeypatch):
    monkeypatch.setenv("KVF_THREADS", "5")
    with _engine_or_skip(config_file=config) as e:
        assert e.settings()["threads"] == ("5", kvf.SettingSource.ENV, "KVF_THREADS")


def test_kvf_config_is_the_default(config, monkeypatch):
    monkeypatch.setenv("KVF_CONFIG", str(config))
    with _engine_or_skip() as e:
        assert e.settings()["config_file"] == (str(config), kvf.SettingSource.ENV, "KVF_CONFIG")
        assert e.settings()["file_namespace"].value == "fromfile"


def test_bad_file(config, tmp_path):
    config.write_text("backend: host\ntreads: 3\n")
    with pytest.raises(kvf.InvalidArgument, match=r'line 2: unknown key "treads" \(did you mean "threads"\?\)'):
        _engine_or_skip(config_file=config)
    config.write_text("backend: gpu\n")
    with pytest.raises(kvf.InvalidArgument, match=r"line 1: backend: \"gpu\": expected auto, host or cuda"):
        _engine_or_skip(config_file=config)
    with pytest.raises(kvf.NotFound, match="nowhere.yaml"):
        _engine_or_skip(config_file=tmp_path / "nowhere.yaml")


def test_process_knobs_listed(monkeypatch):
    monkeypatch.setenv("KVF_FILE_DIRECT", "Off")
    with kvf.Engine(backend="host") as e:
        assert e.settings()["file_direct"] == ("0", kvf.SettingSource.ENV, "KVF_FILE_DIRECT")
    monkeypatch.setenv("KVF_FILE_DIRECT", "maybe")
    with pytest.raises(kvf.InvalidArgument, match="KVF_FILE_DIRECT=\"maybe\": expected 0, 1, off, on"):
        kvf.Engine(backend="host")


def test_keywords_are_the_librarys_settings():
    # the keywords and their defaults come from the library's settings
    # table: every field of kvf_engine_config but struct_size, each at its
    # KVF_ENGINE_CONFIG_INIT value (zero: AUTO, BATCH, 0, None)
    from kvferry import _config, _lib

    leaves = set(_config._leaf_fields(_lib.EngineConfig_t).values()) - {"struct_size"}
    assert set(_config._CONFIG_FIELDS.values()) == leaves
    assert _config._CONFIG_FIELDS["file_dir"] == "file.dir" and _config._CONFIG_FIELDS["backend"] == "backend"
    assert all(not v for v in _config._DEFAULT_CONFIG.values())
    assert _config._DEFAULT_CONFIG["fsync"] is kvf.Fsync.BATCH and _config._DEFAULT_CONFIG["file_dir"] is None
    with kvf.Engine(backend="host") as e:
        assert set(_config._CONFIG_FIELDS) <= set(e.settings())
        assert e.config == dict(_config._DEFAULT_CONFIG, backend="host")
    with pytest.raises(TypeError, match="unknown config field.*known: backend, device, threads, file_dir"):
        kvf.Engine(backnd="host")
