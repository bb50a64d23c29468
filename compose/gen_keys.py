#!/usr/bin/env python3
"""Generate the compose demo stack's keys and render its config files.

Writes, under ``--dir`` (default: this folder):

- ``keys/<name>.key``  private keys, mode 0600 (kept if they already exist; ``--force`` renews)
- ``keys/<name>.pub``  their public keys
- ``generated/<template>`` every file of ``templates/`` with ``${VAR}`` replaced:
  ``GATEWAY_PUBLIC_KEY``, ``AGENT_SITE_A_PUBLIC_KEY``, ``AGENT_SITE_B_PUBLIC_KEY`` (from the keys),
  ``KEY_DIR`` (where the processes find the key files; ``/etc/raven/keys`` in the containers),
  ``GATEWAY_HOST`` (``gateway``, the compose service), ``EDGE_GPU_<n>_ADDRESS`` (the GPU
  nodes' addresses, by default their service names) and ``AGENT_SITE_<X>_ADMIN_LISTEN`` (each
  agent has its own container in compose, so both use port 10266 there). ``--set VAR=VALUE``
  overrides any, e.g. to run the same processes natively on loopback addresses.

Private keys are never committed: ``keys/`` and ``generated/`` are ignored by git.
Uses ``raven.keys`` (installed in the image, or importable from the source tree).
"""

from __future__ import annotations

import argparse
import os
import string
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, str(ROOT))

from raven import keys  # noqa: E402

#: Key pairs of the stack; the variable of each public key is derived from the name.
KEY_NAMES = ("gateway", "agent-site-a", "agent-site-b")
DEFAULTS = {
    "KEY_DIR": "/etc/raven/keys",
    "GATEWAY_HOST": "gateway",
    "AGENT_SITE_A_ADMIN_LISTEN": "0.0.0.0:10266",
    "AGENT_SITE_B_ADMIN_LISTEN": "0.0.0.0:10266",
} | {f"EDGE_GPU_{n}_ADDRESS": f"edge-gpu-{n}" for n in range(1, 5)}


def public_key_variable(name: str) -> str:
    """``agent-site-a`` -> ``AGENT_SITE_A_PUBLIC_KEY``."""
    return name.upper().replace("-", "_") + "_PUBLIC_KEY"


def ensure_key(key_dir: Path, name: str, *, force: bool, owner: tuple[int, int] | None) -> str:
    """Create ``<name>.key`` (0600) unless present; write ``<name>.pub``; return the public key."""
    path = key_dir / f"{name}.key"
    if force or not path.exists():
        keys.write_private_key_file(path, keys.generate_private_key())
    private = keys.read_private_key_file(path)
    public = keys.encode_key(keys.public_key(private))
    pub_path = key_dir / f"{name}.pub"
    pub_path.write_text(public + "\n", encoding="ascii")
    if owner is not None:
        for p in (path, pub_path):
            os.chown(p, *owner)
    return public


def render_templates(template_dir: Path, out_dir: Path, variables: dict[str, str]) -> list[Path]:
    """Substitute ``${VAR}`` in every template; an unknown variable is an error."""
    templates = sorted(template_dir.glob("*.yaml"))
    if not templates:
        raise SystemExit(f"{template_dir}: no templates (*.yaml) found")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for template in templates:
        text = string.Template(template.read_text(encoding="utf-8")).substitute(variables)
        target = out_dir / template.name
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def generate(
    base: Path,
    *,
    force: bool = False,
    owner: tuple[int, int] | None = None,
    overrides: dict[str, str] | None = None,
) -> dict[str, str]:
    """Keys under ``base/keys``, rendered configs under ``base/generated``; returns variables."""
    key_dir = base / "keys"
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(key_dir, *owner)
    variables = dict(DEFAULTS)
    for name in KEY_NAMES:
        variables[public_key_variable(name)] = ensure_key(key_dir, name, force=force, owner=owner)
    variables.update(overrides or {})
    render_templates(base / "templates", base / "generated", variables)
    return variables


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--force", action="store_true", help="replace existing keys")
    parser.add_argument("--owner", type=_owner, help="UID[:GID] to own the key files")
    parser.add_argument("--set", action="append", default=[], metavar="VAR=VALUE")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        var, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected VAR=VALUE")
        overrides[var] = value
    variables = generate(args.dir, force=args.force, owner=args.owner, overrides=overrides)
    for name in KEY_NAMES:
        print(f"{name}: {variables[public_key_variable(name)]}")
    print(f"configs written to {args.dir / 'generated'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
