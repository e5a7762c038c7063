import io
import json
import shutil

import pytest
from PIL import Image

from pool_queue.frames import FrameEncoder, FrameError, list_frames, natural_key, prepare_jpeg, video_dir
from pool_queue.shards import ShardError, extract, verify


def save(path, size, fmt="JPEG", mode="RGB"):
    Image.new(mode, size, 128).save(path, format=fmt)
    return path


def test_natural_order_and_filtering(tmp_path):
    d = tmp_path / "v"
    d.mkdir()
    for name in ["frame_10.jpg", "frame_2.jpg", "frame_1.PNG", "notes.txt", "frame_3.webp"]:
        (d / name).write_bytes(b"x")
    (d / "sub.jpg").mkdir()
    assert [p.name for p in list_frames(d)] == ["frame_1.PNG", "frame_2.jpg", "frame_3.webp", "frame_10.jpg"]
    assert natural_key("a2") < natural_key("a10")


def test_video_dir_never_escapes(tmp_path):
    (tmp_path / "v1").mkdir()
    assert video_dir(tmp_path, "v1") == tmp_path / "v1"
    assert video_dir(tmp_path, "k:yt1") is None and video_dir(tmp_path, "missing") is None
    for bad in ["..", "../x", "/etc", "a/b", "a\\b", "a\x00", "x..y", ""]:
        with pytest.raises(FrameError):
            video_dir(tmp_path, bad)
    (tmp_path / "link").symlink_to("/tmp")
    with pytest.raises(FrameError, match="outside"):
        video_dir(tmp_path, "link")


@pytest.mark.parametrize(
    ("size", "fmt", "mode", "want"),
    [
        ((854, 480), "JPEG", "RGB", (448, 252)),
        ((480, 854), "PNG", "RGB", (252, 448)),
        ((640, 480), "PNG", "RGBA", (448, 336)),
        ((300, 200), "JPEG", "L", (448, 299)),
        ((448, 252), "PNG", "RGB", (448, 252)),
        ((1000, 1000), "WEBP", "RGB", (448, 448)),
    ],
)
def test_resize_to_448_long_side_rgb_jpeg(tmp_path, size, fmt, mode, want):
    src = save(tmp_path / f"f.{fmt.lower()}", size, fmt, mode)
    out = prepare_jpeg(src)
    with Image.open(io.BytesIO(out)) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == want


def test_conforming_jpeg_passes_byte_identical(tmp_path):
    src = save(tmp_path / "f.jpg", (448, 252))
    assert prepare_jpeg(src) == src.read_bytes()
    gray = save(tmp_path / "g.jpg", (448, 252), mode="L")
    assert prepare_jpeg(gray) != gray.read_bytes()  # grey JPEG is re-encoded as RGB


def test_corrupt_frames_are_clear_errors(tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(FrameError, match=r"bad\.jpg"):
        prepare_jpeg(tmp_path / "bad.jpg")
    good = save(tmp_path / "t.jpg", (448, 252)).read_bytes()
    (tmp_path / "trunc.jpg").write_bytes(good[: len(good) // 2])
    with pytest.raises(FrameError, match=r"trunc\.jpg"):
        prepare_jpeg(tmp_path / "trunc.jpg")
    big = save(tmp_path / "big.jpg", (900, 500)).read_bytes()
    (tmp_path / "tbig.jpg").write_bytes(big[:300])
    with pytest.raises(FrameError, match=r"tbig\.jpg"):
        prepare_jpeg(tmp_path / "tbig.jpg")


def test_encoder_caches_data_urls(tmp_path):
    src = save(tmp_path / "f.jpg", (448, 252))
    enc = FrameEncoder(cache_size=1)
    url = enc.data_url(src)
    assert url.startswith("data:image/jpeg;base64,") and enc.data_url(src) is url


def test_manifest_verify_and_extract(small_root, tmp_path):
    tar_dir = tmp_path / "tars"
    shutil.copytree(small_root / "frames_tar", tar_dir)
    m = verify(tar_dir, show=False)
    n = extract(tar_dir, tmp_path / "cache", show=False)
    assert n == m.n_videos == sum(1 for p in (small_root / "frames" / "pool_frames").iterdir())
    first = sorted((tmp_path / "cache").iterdir())[0]
    assert [p.name for p in list_frames(first)] == [
        p.name for p in list_frames(small_root / "frames" / "pool_frames" / first.name)
    ]
    stamp = list_frames(first)[0].stat().st_ctime_ns  # (mtime comes from the archive: ctime shows a rewrite)
    assert extract(tar_dir, tmp_path / "cache", show=False) == n  # again: every shard is recorded as done
    assert list_frames(first)[0].stat().st_ctime_ns == stamp
    shutil.rmtree(first)  # a folder lost since: the count is wrong, so everything is unpacked again
    assert extract(tar_dir, tmp_path / "cache", show=False) == n and list_frames(first)


def test_manifest_catches_one_changed_byte(small_root, tmp_path):
    tar_dir = tmp_path / "tars"
    shutil.copytree(small_root / "frames_tar", tar_dir)
    shard = tar_dir / json.loads((tar_dir / "frames_manifest.json").read_text())["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="SHA256 MISMATCH: " + shard.name):
        extract(tar_dir, tmp_path / "cache", show=False)
    assert not (tmp_path / "cache").exists()
    shard.unlink()
    with pytest.raises(ShardError, match="missing shard"):
        verify(tar_dir, show=False)
