"""`federation-configs`: list, print and copy the example configs and service files the package ships.

    federation-configs list                                    every shipped file
    federation-configs show wrapper.yaml                       print one (mosquitto.conf, topologies/line5.yaml, ...)
    federation-configs path topologies/line5.yaml              its installed path (for other commands' arguments)
    federation-configs copy mosquitto.conf wrapper.yaml --dest DIR [--force]

Names are relative to the shipped folders (`configs/`, `examples/`,
`packaging/`: federation.shipped), or to `configs/`. A copied file keeps its
name in DEST, a copied folder its name and tree; an existing file is never
overwritten without `--force`. Exit status: 0 done, 2 a bad name or a file
in the way (the message says which).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from federation import shipped
from federation.cli_version import add_version_option

PROG = "federation-configs"
EXIT_OK = 0
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad name, or a copy that would overwrite a file: exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="The example broker and wrapper configs, scenario topologies, examples "
                                            "and service files (systemd unit, logrotate) shipped with mqtt-federation.")
    add_version_option(parser, PROG)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("list", help="print every shipped file, one per line")
    show = commands.add_parser("show", help="print one shipped file")
    show.add_argument("name", help="e.g. mosquitto.conf, wrapper.yaml, topologies/line5.yaml, "
                                   "packaging/systemd/mqtt-federation.service")
    path = commands.add_parser("path", help="print the path of a shipped file or folder (the root without a name)")
    path.add_argument("name", nargs="?")
    copy = commands.add_parser("copy", help="copy shipped files or folders into a directory")
    copy.add_argument("names", nargs="+", metavar="name")
    copy.add_argument("--dest", required=True, type=Path, metavar="DIR", help="target directory (created)")
    copy.add_argument("--force", action="store_true", help="overwrite files that exist")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = build_parser().parse_args(argv)
        if options.command == "list":
            print("\n".join(shipped.listing()))
        elif options.command == "show":
            source = resolve_file(options.name)
            sys.stdout.write(source.read_text(encoding="utf-8"))
        elif options.command == "path":
            print(shipped.resolve(options.name) if options.name else shipped.ROOT)
        else:
            for target in copy(options.names, options.dest, options.force):
                print(target)
    except (UsageError, shipped.ShippedFileError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def resolve_file(name: str) -> Path:
    source = shipped.resolve(name)
    if source.is_dir():
        raise UsageError(f"{name!r} is a folder: `{PROG} list` names its files, `{PROG} copy` copies it whole")
    return source


def copy(names: Sequence[str], dest: Path, force: bool = False) -> list[Path]:
    """Copy each named file (as DEST/its name) or folder (as DEST/its name/...); the files written.

    Every target is checked before anything is written, so a refusal leaves DEST as it was."""
    plan: list[tuple[Path, Path]] = []
    for name in names:
        source = shipped.resolve(name)
        if source.is_dir():
            plan += [(file, dest / source.name / file.relative_to(source)) for file in sorted(source.rglob("*"))
                     if file.is_file() and "__pycache__" not in file.parts]
        else:
            plan.append((source, dest / source.name))
    existing = [str(target) for _, target in plan if target.exists()]
    if existing and not force:
        raise UsageError(f"would overwrite {', '.join(existing)}; give --force to replace, or another --dest")
    for source, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return [target for _, target in plan]


if __name__ == "__main__":
    sys.exit(main())
