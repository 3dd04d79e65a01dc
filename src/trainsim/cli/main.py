"""Entry point of the ``trainsim`` command.

    $ trainsim --help
    $ trainsim replay trace.json.gz --json

Subcommands live in their own modules and are imported only when used, so that ``trainsim --help``
or ``trainsim replay`` never pays for ``import torch``. To add one, write a click command in a module
of ``trainsim.cli`` and add one line to ``COMMANDS``. A ``UserError`` raised anywhere becomes one line
on stderr and exit code 2; ``tests/cli/test_surface.py`` pins the surface.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Callable

import click

from trainsim.errors import UserError

# name -> "module:attribute" of a click.Command. Keep sorted; one line per command.
COMMANDS: dict[str, str] = {
    "bench-sim": "trainsim.cli.core:bench_sim",
    "calibrate": "trainsim.cli.cluster:calibrate",
    "compress-bench": "trainsim.cli.compress:compress_bench",
    "demo": "trainsim.cli.core:demo",
    "estimate": "trainsim.cli.plan:estimate",
    "goodput": "trainsim.cli.goodput:goodput",
    "ooo": "trainsim.cli.ooo:ooo",
    "plan": "trainsim.cli.plan:plan",
    "profile": "trainsim.cli.core:profile",
    "replay": "trainsim.cli.core:replay",
    "scaleout": "trainsim.cli.cluster:scaleout",
    "secopa": "trainsim.cli.compress:secopa",
    "validate": "trainsim.cli.validate:validate",
    "whatif": "trainsim.cli.core:whatif",
}


RENAMED: dict[tuple[str, ...], dict[str, tuple[str, float]]] = {
    ("bench-sim",): {"--repeat": ("--repeats", 1.0)},
    ("calibrate",): {"--delay": ("--latency-us", 1000.0)},
    ("validate", "dp"): {"--delay": ("--latency-us", 1000.0)},
    ("validate", "ooo-dp"): {"--delay": ("--latency-us", 1000.0)},
    ("validate", "pipeline"): {"--delay": ("--latency-us", 1000.0)},
    ("ooo", "order"): {"--ranks": ("--world", 1.0)},
    ("ooo", "pipeline"): {"--ranks": ("--world", 1.0)},
    ("scaleout",): {"--ranks": ("--world", 1.0)},
    ("whatif",): {"--network-bw": ("--network-bw-factor", 1.0)},
}
"""Flags renamed in 0.2 so that one name means one thing with its unit in it (``--world`` for ranks,
``--*-factor`` for multipliers, ``--latency-us`` for an added one-way latency, given in ms as ``--delay``): ``{command path: {old: (new, factor on the value)}}``. The old name
still works for one release, with a warning on stderr."""


def rename_flags(argv: list[str], warn: Callable[[str], None]) -> list[str]:
    """``argv`` with the renamed flags of its command (``RENAMED``) spelt the new way."""
    path = tuple(itertools.takewhile(lambda a: not a.startswith("-"), argv))[:2]
    table = RENAMED.get(path) or RENAMED.get(path[:1], {})
    out: list[str] = []
    pending: float | None = None  # the next token is the value of a renamed flag, times this
    for a in argv:
        if pending is not None:
            out.append(a if pending == 1.0 else _scaled(a, pending))
            pending = None
            continue
        flag, eq, value = a.partition("=")
        if flag in table:
            new, factor = table[flag]
            warn(f"trainsim: warning: {flag} is now {new}; the old name goes in the next release")
            if eq:
                out.append(f"{new}={value if factor == 1.0 else _scaled(value, factor)}")
            else:
                out.append(new)
                pending = factor
            continue
        out.append(a)
    return out


def _scaled(value: str, factor: float) -> str:
    try:
        return f"{float(value) * factor:g}"
    except ValueError:
        return value  # click words the error about the value


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use from a ``name -> "module:attr"`` table."""

    registry: dict[str, str] = COMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.registry)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.registry.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command), target
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trainsim")
def cli() -> None:
    """trainsim: why is my training step slow, what would a change buy me, and how should I parallelise?"""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 ok, 2 bad input, 1 internal error)."""
    argv = rename_flags(list(sys.argv[1:] if argv is None else argv), lambda s: click.echo(s, err=True))
    try:
        cli.main(args=argv, prog_name="trainsim", standalone_mode=False)
    except UserError as exc:
        click.echo(f"trainsim: error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("trainsim: aborted", err=True)
        return 130
    except click.UsageError as exc:  # one line, as for every other bad input (click's own takes four)
        where = exc.ctx.command_path if exc.ctx is not None else "trainsim"
        click.echo(f"{where}: error: {exc.format_message()} (see {where} --help)", err=True)
        return 2
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) or exc.exit_code == 2 else exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
