"""The models built on this machine instead of loaded by name: deterministic tiny models, each cached under the
temp dir by name and seed. Names only here (no torch): the builder module is imported when a model is built."""

from __future__ import annotations

import importlib
from pathlib import Path

from workers.sync.scratch import node_temp_dir

FAMILY_NAMES = ("tiny-qwen2-base", "tiny-qwen2-instruct", "tiny-qwen3", "tiny-qwen3-2507")  # families.py: FAMILIES
# name -> (module, builder `build(out_dir, seed=) -> Path`)
LOCAL_MODELS: dict[str, tuple[str, str]] = {
    "tiny": ("workers.models.loading", "build_tiny_model"),
    "tiny-agent": ("workers.tiny.agent", "build_tiny_agent"),
    "tiny-reasoner": ("workers.tiny.reasoner", "build_tiny_reasoner"),
    **{name: ("workers.tiny.families", "family_builder") for name in FAMILY_NAMES},
}
# a rebuilt model of a new version gets its own cache directory: an older build in use is never replaced under it
_VERSION_ATTR = {"tiny-agent": "TINY_AGENT_VERSION"}


def is_local_model(name: str) -> bool:
    return name in LOCAL_MODELS


def local_model_path(name: str, seed: int) -> str | None:
    """The directory of local model `name` for `seed`, built (once per machine) on whichever node asks; None for
    a hub name or a path."""
    if name not in LOCAL_MODELS:
        return None
    module_name, attr = LOCAL_MODELS[name]
    module = importlib.import_module(module_name)
    build = module.family_builder(name) if attr == "family_builder" else getattr(module, attr)
    tag = f"-v{getattr(module, _VERSION_ATTR[name])}" if name in _VERSION_ATTR else ""
    root = Path(node_temp_dir()) / f"credit-orchestrator-{name}-{seed}{tag}"
    return str(build(root, seed=seed))


def main(argv: list[str] | None = None) -> int:
    """`python -m workers.tiny.local NAME [NAME ...]`: build these local models (seed 0) now, one after another,
    so later trials and tests find them cached; prints each one's directory."""
    import sys

    names = sys.argv[1:] if argv is None else argv
    unknown = [n for n in names if n not in LOCAL_MODELS]
    if unknown or not names:
        print(f"usage: python -m workers.tiny.local NAME [NAME ...]; names: {', '.join(LOCAL_MODELS)}"
              + (f" (unknown: {', '.join(unknown)})" if unknown else ""), file=sys.stderr)
        return 2
    for name in names:
        print(f"{name}: {local_model_path(name, 0)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
