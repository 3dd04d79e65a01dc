"""``trainsim validate``: run the real thing on this machine and measure how wrong the predictions are.

    $ trainsim validate --help
    $ trainsim validate dp --quick --json

Each subcommand lives in its own module and is imported only when used (no ``import torch`` here).
To add one, write a click command and add ONE line to ``VALIDATE_COMMANDS`` (keep it sorted).
Network-namespace helpers for the harnesses: ``trainsim.testbed.netns``.
"""

from __future__ import annotations

import click

from trainsim.cli.main import LazyGroup

# name -> "module:attribute" of a click.Command. Keep sorted; one line per subcommand.
VALIDATE_COMMANDS: dict[str, str] = {
    "calibrate": "trainsim.validate.calibrate:calibrate_command",
    "compress": "trainsim.validate.compress:compress_command",
    "dp": "trainsim.validate.dp:dp_command",
    "multistream": "trainsim.validate.multistream:multistream_command",
    "ooo-dp": "trainsim.validate.ooo:ooo_dp_command",
    "pipeline": "trainsim.validate.pipeline:pipeline_command",
    "whatif": "trainsim.validate.whatif:whatif_command",
}


class _LazyValidateGroup(LazyGroup):
    registry = VALIDATE_COMMANDS


@click.group(cls=_LazyValidateGroup, name="validate")
def validate() -> None:
    """Run real training on emulated networks and compare it with trainsim's predictions."""
