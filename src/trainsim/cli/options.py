"""Options and checks that several commands share, in one place (so their names and wording agree).

    >>> from trainsim.cli.options import JSON_OPT, FORCE_OPT, check_new_file
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trainsim.errors import UserError

JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
FORCE_OPT = click.option("--force", is_flag=True, help="Overwrite an existing output file.")


def us_to_ms(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback: an option given in microseconds (``--latency-us``), handed on in milliseconds."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(v / 1000.0 for v in value)
    return value / 1000.0


def check_new_file(path: str | None, force: bool, option: str) -> None:
    """Refuse, before any work, to write over a file that exists unless ``--force``: a command never
    replaces something of the user's (a trace, an edited plan, a calibration) by surprise."""
    if path and Path(path).exists() and not force:
        raise UserError(f"{option} {path!r} exists; pass --force to overwrite it or choose another path")
