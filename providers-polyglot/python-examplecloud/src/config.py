"""The provider's config block: where the API is and what to create.

Unknown keys are rejected and every error names its field path, e.g.
`providers[0].config.project: is required`, as the Rust template's `config.rs` does.
"""

import json
import re

from wit_world.imports.types import ErrorClass, ProviderError
from componentize_py_types import Err

DEFAULT_ENDPOINT = "https://api.examplecloud.test/v1"
DEFAULT_SIZE = "small"

# Field name -> default (None: required).
FIELDS = {"project": None, "endpoint": DEFAULT_ENDPOINT, "size": DEFAULT_SIZE}

PROJECT = re.compile(r"[a-z0-9-]+")


def config_error(at, message):
    """A config error at `at`: permanent, so the reconciler waits for the config to change."""
    return Err(ProviderError(ErrorClass.PERMANENT, f"{at}: {message}", "InvalidConfig"))


def validate(path, text):
    """Parses, defaults and checks the block (JSON); answers the normalized block as a dict."""
    try:
        block = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise config_error(path, f"not JSON: {e}")
    if not isinstance(block, dict):
        raise config_error(path, "must be a mapping")
    for key in block:
        if key not in FIELDS:
            expected = ", ".join(f"`{k}`" for k in FIELDS)
            raise config_error(f"{path}.{key}", f"unknown field `{key}`, expected one of {expected}")
    cfg = {}
    for key, default in FIELDS.items():
        value = block.get(key, default)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise config_error(f"{path}.{key}", "must be a string")
        cfg[key] = value
    if not cfg["project"]:
        raise config_error(f"{path}.project", "is required")
    if not PROJECT.fullmatch(cfg["project"]):
        raise config_error(f"{path}.project", "must be lowercase letters, digits and dashes")
    if not cfg["endpoint"].startswith("https://"):
        raise config_error(f"{path}.endpoint", "must be an https:// URL")
    return cfg


def from_context(config):
    """The normalized block the host hands back on every call (validate's own output)."""
    try:
        cfg = json.loads(config)
        return {key: str(cfg.get(key, default or "")) for key, default in FIELDS.items()}
    except (ValueError, AttributeError) as e:
        raise Err(
            ProviderError(ErrorClass.PERMANENT, f"normalized config: {e}", "InvalidConfig")
        )


def instances_url(cfg):
    """`<endpoint>/projects/<project>/instances`."""
    return f"{cfg['endpoint'].rstrip('/')}/projects/{cfg['project']}/instances"
