"""kvbridge.paths: the home folder and the small JSON caches kept in it."""

from kvbridge import paths


def test_cache_file_is_off_with_no_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBRIDGE_HOME", str(tmp_path))
    monkeypatch.delenv("KVBRIDGE_NO_CACHE", raising=False)
    assert paths.cache_file("x.json") == tmp_path / "x.json"
    monkeypatch.setenv("KVBRIDGE_NO_CACHE", "1")
    assert paths.cache_file("x.json") is None


def test_cache_write_keeps_the_newest_entries_and_reads_back(tmp_path):
    f = tmp_path / "sub" / "c.json"
    assert paths.cache_read(f) == {}
    for i in range(5):
        paths.cache_write(f, f"k{i}", i, limit=3)
    paths.cache_write(f, "k2", "again", limit=3)  # a rewritten key becomes the newest
    assert list(paths.cache_read(f).items()) == [("k3", 3), ("k4", 4), ("k2", "again")]
    assert not [p for p in f.parent.iterdir() if p.name.endswith(".tmp")]
    f.write_text("[not a dict]")
    assert paths.cache_read(f) == {}
    f.write_text("{broken")
    assert paths.cache_read(f) == {}
    paths.cache_write(None, "k", 1, limit=3)  # no cache: nothing happens
