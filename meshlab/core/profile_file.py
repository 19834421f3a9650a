"""The profile file (format 1, as `meshlab profile` writes it): pydantic models of what it holds, the document
written (checked against the same models before it is written) and the loader (anything wrong is one InputError
naming the file and the fix). Pure.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshlab.core.errors import BackendError, InputError
from meshlab.core.files import is_device
from meshlab.core.profile_points import OPS, Point, Profile, fit_all
from meshlab.core.closed import problem_line

FORMAT = 1
FIX = "measure it again with `meshlab profile STRATEGY -o FILE.json`"


def profile_document(device: dict, versions: dict, plan: dict, points: tuple[Point, ...], duration_s: float) -> dict:
    """The JSON a profile file holds (curves fitted here, so the file says what the cost model will use), checked
    against the model the loader reads (ProfileFile) before anything is written."""
    document = {"meshlab_profile": FORMAT, "device": device, "versions": versions, "plan": plan,
                "duration_s": duration_s, "points": [p.to_json() for p in points],
                "curves": {op: c.to_json() for op, c in fit_all(points).items()}}
    try:
        ProfileFile.model_validate(document)  # the writer and the reader agree, or this is meshlab's bug
    except ValidationError as exc:
        problem = problem_line(exc, document, "the profile")
        raise BackendError(f"the profile just measured would not load back ({problem})",
                           "a bug in meshlab, not in the strategy: report it with the strategy and the device") \
            from None
    return document


def load_profile(path: str | Path) -> Profile:
    """A profile file, checked; anything wrong is an InputError naming the file and the fix."""
    path = Path(path)
    if path.is_dir() or is_device(path):  # a folder fails, a device never ends; a pipe is read
        raise InputError(f"{path}: a {'folder' if path.is_dir() else 'device'}, not a profile", FIX)
    try:
        raw = path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such profile", "measure it with `meshlab profile STRATEGY -o FILE.json`") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable profile (corrupt or truncated: {exc})", FIX) from None
    try:
        return replace(_profile(path, data), digest=hashlib.sha256(raw).hexdigest()[:16])
    except ValueError as exc:
        raise InputError(f"{path}: not a meshlab profile ({exc})", FIX) from None


#: How many figures a shape has, where the op class fixes it, and which of them count calls or blocks (>= 1).
ARITY = {"outer": 3, "block": 3, "stack": 4, "vae_decode": 2, "collective": 2}
COUNTS = {"outer": (2,), "block": (2,), "stack": (2, 3)}

_Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _File(BaseModel):
    """A part of the profile file: strict (JSON meshlab wrote: no conversions), extra keys kept."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)


class PointFile(_File):
    """One measured point as the file holds it."""

    op: Literal[OPS]
    shape: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    flops: _Amount
    bytes: _Amount
    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    label: str = ""

    @model_validator(mode="after")
    def _shape_fits_its_op(self) -> PointFile:
        """The op class fixes how many figures the shape has, and which count calls or blocks (>= 1)."""
        if self.op in ARITY and len(self.shape) != ARITY[self.op]:
            raise ValueError(f"a {self.op} point has shape {self.shape}, not {ARITY[self.op]} figures")
        if any(self.shape[i] < 1 for i in COUNTS.get(self.op, ())):
            raise ValueError(f"a {self.op} point has shape {self.shape}: its calls and blocks are at least 1")
        return self


class DeviceFile(_File):
    """The device the points were measured on (name, hardware, host, cores and backend kept as written)."""

    platform: Literal["cpu", "cuda", "tpu"]
    devices: int = Field(ge=1)
    memory_bytes: Optional[int] = Field(None, ge=0)  # 0: not known


class ProfileFile(_File):
    """A profile file (format 1), as `meshlab profile` writes it (``profile_document``)."""

    meshlab_profile: Literal[1]
    device: DeviceFile
    versions: Optional[dict[str, Any]] = None  # null in older files: none recorded
    plan: dict[str, Any]
    duration_s: _Amount = 0.0
    points: list[PointFile]
    curves: Any = None  # written for the reader's eye; the loader fits them again from the points


def _profile(path: Path, data: object) -> Profile:
    """The profile the file's data describes; what is wrong is a ValueError naming the first problem's field."""
    if not isinstance(data, dict) or data.get("meshlab_profile") != FORMAT:
        found = data.get("meshlab_profile") if isinstance(data, dict) else None
        raise ValueError(f"format {found!r}, this meshlab reads format {FORMAT}")
    try:
        checked = ProfileFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(problem_line(exc, data, "the profile")) from None
    points = tuple(Point(p.op, tuple(p.shape), p.flops, p.bytes, p.seconds, p.label) for p in checked.points)
    return Profile(str(path), checked.device.model_dump(), dict(checked.versions or {}), dict(checked.plan), points,
                   fit_all(points), checked.duration_s)
