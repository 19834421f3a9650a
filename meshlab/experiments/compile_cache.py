"""A run's persistent XLA compile cache: one folder per plan, checkpoint and torch_xla version, with a manifest that
says whose it is (`meshlab run --cache-dir`). No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from meshlab.core.closed import problem_line
from meshlab.core.errors import InputError
from meshlab.core.files import file_stem
from meshlab.experiments.options import RunOptions

if TYPE_CHECKING:
    from meshlab.plan.planned import PlannedStrategy

CACHE_MANIFEST = "meshlab-cache.json"


class CacheManifest(BaseModel):
    """``meshlab-cache.json`` in a compile-cache folder: whose programs the folder holds."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    key: str  # the hash of the plan, strategy file, checkpoint and torch_xla version
    strategy: str
    checkpoint: str
    torch_xla: Optional[str]


def cache_for(planned: PlannedStrategy, checkpoint: Path, options: RunOptions) -> Path | None:
    """One compile-cache folder per plan, checkpoint and torch_xla version, with a manifest that says whose it is:
    a folder that holds another plan's or another version's programs is refused, never silently recompiled."""
    if options.cache_dir is None:
        return None
    identity = cache_identity(planned, checkpoint, options)
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    folder = options.cache_dir / f"{file_stem(planned.strategy.name)}-{key}"
    manifest = CacheManifest(key=key, strategy=planned.strategy.name, checkpoint=identity["checkpoint"],
                             torch_xla=identity["torch_xla"])
    claim_cache(folder, manifest)
    return folder


def cache_identity(planned: PlannedStrategy, checkpoint: Path | str, options: RunOptions) -> dict:
    """What a compile-cache key is the hash of: the plan (without what changes no program, and without fields at
    their defaults that keys made before them did not have), the file, the checkpoint and torch_xla's version."""
    built = f"random, {options.layers} blocks per list" if isinstance(checkpoint, str) else str(checkpoint.resolve())
    plan = {**planned.strategy.model_dump(), "activations": planned.strategy.activations.identity()}
    if not planned.strategy.compile.libtpu_flags:  # keys made before the field existed stay the same
        plan["compile"] = {k: v for k, v in plan["compile"].items() if k != "libtpu_flags"}
    # memory-only dtypes: the program is the same (and keys made before they existed stay the same)
    plan["workload"] = {k: v for k, v in plan["workload"].items() if k != "weights_dtype"}
    plan["placement"] = {k: v for k, v in plan["placement"].items() if k != "vae_dtype"
                         and not (k == "encoders" and not v)}  # keys made before `encoders` existed stay the same
    return {"plan": json.dumps(plan, sort_keys=True), "file": planned.loaded.document.file,
            "checkpoint": built, "torch_xla": package_version("torch_xla")}


def claim_cache(folder: Path, manifest: CacheManifest) -> None:
    path = folder / CACHE_MANIFEST
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if path.exists():
            found = CacheManifest.model_validate(json.loads(path.read_text()))
            if found != manifest:
                raise InputError(f"the compile cache {folder} belongs to {found.strategy!r} with torch_xla "
                                 f"{found.torch_xla}, not to this plan with torch_xla {manifest.torch_xla}",
                                 "give --cache-dir a folder of its own, or delete that one")
        else:
            tmp = folder / f".{CACHE_MANIFEST}.{os.getpid()}.tmp"
            tmp.write_text(manifest.model_dump_json())
            os.replace(tmp, path)
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"{folder} is not writable")
    except ValidationError as exc:
        raise InputError(f"the compile cache {folder} holds a {CACHE_MANIFEST} that is not meshlab's: "
                         f"{problem_line(exc, json.loads(path.read_text()), 'the manifest')}",
                         "give --cache-dir a folder of its own, or delete that one") from None
    except ValueError as exc:  # not JSON, or not text
        raise InputError(f"the compile cache {folder} holds a {CACHE_MANIFEST} that is not meshlab's: {exc}",
                         "give --cache-dir a folder of its own, or delete that one") from None
    except OSError as exc:
        raise InputError(f"cannot use the compile cache {folder}: {exc}",
                         "give --cache-dir a writable folder of meshlab's") from None


def package_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
