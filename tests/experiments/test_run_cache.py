"""The compile cache's folder: claimed with a manifest, refused when it belongs to another plan or version. Pure."""

import json

import pytest

from meshlab.core.errors import InputError
from meshlab.experiments.compile_cache import CACHE_MANIFEST, CacheManifest, claim_cache

WRITTEN = {"key": "abc", "strategy": "pairs", "checkpoint": "/ckpt", "torch_xla": "2.9.0"}
MANIFEST = CacheManifest(**WRITTEN)


def test_a_new_folder_is_claimed_and_reclaimed(tmp_path):
    folder = tmp_path / "pairs-abc"
    claim_cache(folder, MANIFEST)
    claim_cache(folder, MANIFEST)  # the same plan again: its own programs
    assert json.loads((folder / CACHE_MANIFEST).read_text()) == WRITTEN
    assert [p.name for p in folder.iterdir()] == [CACHE_MANIFEST]  # no temporary file left


def test_a_folder_of_another_plan_or_version_is_refused(tmp_path):
    folder = tmp_path / "pairs-abc"
    claim_cache(folder, MANIFEST)
    with pytest.raises(InputError, match="belongs to 'pairs' with torch_xla 2.9.0, not to this plan with torch_xla 2.10"):
        claim_cache(folder, MANIFEST.model_copy(update={"torch_xla": "2.10"}))


def test_a_folder_that_cannot_be_made_is_one_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot use the compile cache"):
        claim_cache(tmp_path / "file" / "pairs-abc", MANIFEST)


@pytest.mark.parametrize("written", ['{"key": "abc"}', '{"key": "abc", "strategy": "pairs", "checkpoint": "/c", '
                                     '"torch_xla": "2.9.0", "owner": "me"}', "not json", b"\xff\xfe"])
def test_a_manifest_that_is_not_meshlabs_is_one_error(tmp_path, written):
    folder = tmp_path / "pairs-abc"
    folder.mkdir()
    if isinstance(written, bytes):
        (folder / CACHE_MANIFEST).write_bytes(written)
    else:
        (folder / CACHE_MANIFEST).write_text(written)
    with pytest.raises(InputError, match="holds a meshlab-cache.json that is not meshlab's") as caught:
        claim_cache(folder, MANIFEST)
    assert "\n" not in caught.value.one_line()
    if isinstance(written, str) and written.startswith('{"key": "abc"}'):
        assert "not meshlab's: strategy: Field required" in caught.value.problem
    if isinstance(written, str) and "owner" in written:
        assert "not meshlab's: owner: Extra inputs are not permitted" in caught.value.problem


def test_a_plan_s_libtpu_flags_give_it_a_cache_of_its_own(tmp_path):
    """XLA:TPU flags change the programs: a plan with compile.libtpu_flags never reads the programs of the same
    plan without them. Without flags the key is made as before the field existed (no flags key in it)."""
    from meshlab.experiments.compile_cache import cache_for
    from meshlab.experiments.options import RunOptions
    from meshlab.plan.planned import plan_file

    from tests.conftest import REPO

    path, text = tmp_path / "2d.yaml", (REPO / "strategies" / "2d.yaml").read_text()
    options = RunOptions(checkpoint="random", cache_dir=tmp_path / "cache", layers=2)
    keys = []
    for flags in ("[]", "[--xla_tpu_enable_windowed_einsum_for_all_gather=false]"):  # one file, only the flags differ
        path.write_text(text + f"compile:\n  libtpu_flags: {flags}\n")
        keys.append(cache_for(plan_file(path), "random", options).name)
    path.write_text(text)
    assert cache_for(plan_file(path), "random", options).name == keys[0] != keys[1]


def test_placement_encoders_left_empty_keep_the_key_made_before_the_field(tmp_path):
    """`placement.encoders` at its default (none) is not in what the key hashes, so keys made before the field
    existed stay the same; an encoder placed otherwise gets a cache of its own."""
    import json

    from meshlab.experiments.compile_cache import cache_for, cache_identity
    from meshlab.experiments.options import RunOptions
    from meshlab.plan.planned import plan_file

    from tests.conftest import REPO

    path, text = tmp_path / "2d.yaml", (REPO / "strategies" / "2d.yaml").read_text()
    options = RunOptions(checkpoint="random", cache_dir=tmp_path / "cache", layers=2)
    placements, keys = [], []
    for encoders in ("", "  encoders: {}\n", "  encoders: {text_encoder: device}\n"):
        path.write_text(text.replace("placement:\n", "placement:\n" + encoders, 1))
        planned = plan_file(path)
        placements.append(json.loads(cache_identity(planned, "random", options)["plan"])["placement"])
        keys.append(cache_for(planned, "random", options).name)
    assert "encoders" not in placements[0] and placements[0] == placements[1]
    assert placements[2]["encoders"] == {"text_encoder": "device"} and keys[0] == keys[1] != keys[2]
