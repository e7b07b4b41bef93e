"""The ``treeattn`` command: a thin typer app, one module per command group.

Library code raises ``TreeattnError``; ``main`` renders it as one line on stderr and exits
with its ``exit_code`` (2 for bad input). Other exceptions keep their traceback.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from treeattn import interrupts
from treeattn.cli.paths import kept_on_success
from treeattn.errors import TreeattnError

HELP_OPTIONS = ["-h", "--help"]
app = typer.Typer(
    name="treeattn",
    help="Plan, simulate and run the cross-device merge of tree attention on your cluster's wiring.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_OPTIONS},
    # Markdown reflows docstring paragraphs, so wrapped source lines read as one sentence.
    rich_markup_mode="markdown",
)

# emoji=False: text such as a PCI bus id (0000:ab:00.0) is printed as written.
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def _print_version(value: bool) -> None:
    if value:
        from treeattn import __version__

        typer.echo(f"treeattn {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print treeattn's version and exit.")] = False,
) -> None:
    """Plan, simulate and run the cross-device merge of tree attention on your cluster's wiring."""


def _no_type_on_flags(command) -> None:  # noqa: ANN001 - a click Command or Group
    """Flags take no value: show no type for them in --help (typer writes ``<bool>``)."""
    # Made once, then cached: with every command's names, as a subcommand's context would inherit them.
    helper = command.get_help_option(command.context_class(command, help_option_names=HELP_OPTIONS))
    for param in (*command.params, *([helper] if helper is not None else [])):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _no_type_on_flags(sub)


def _click():  # noqa: ANN202 - the click module typer runs on
    try:  # typer >= 0.22 raises its vendored click's exceptions, whether or not click is installed
        from typer import _click as click
    except ImportError:
        import click
    return click


def _refuse_repeated_options(command) -> None:  # noqa: ANN001 - a click Command or Group
    """An option that takes one value, given twice, is an error: click keeps the last one
    silently, so a typo'd command line would run something else than it reads."""
    if getattr(command, "_refuses_repeats", False):
        return
    command._refuses_repeats = True
    click = _click()
    parse = command.parse_args

    def parse_args(ctx, args):  # noqa: ANN001, ANN202 - click's signature
        try:
            order = command.make_parser(ctx).parse_args(args=list(args))[2]
        except click.exceptions.ClickException:
            order = []  # the parse below reports what is wrong
        seen = set()
        for param in order:
            if (param.param_type_name == "option" and not param.multiple and not getattr(param, "count", False)
                    and not getattr(param, "is_flag", False)):
                if param.name in seen:
                    raise click.exceptions.UsageError(f"option {max(param.opts, key=len)} given twice; give it once",
                                                      ctx=ctx)
                seen.add(param.name)
        return parse(ctx, args)

    command.parse_args = parse_args
    for sub in getattr(command, "commands", {}).values():
        _refuse_repeated_options(sub)


def _register() -> None:
    # Each command module adds its commands to ``app`` when imported; one line per module. Every
    # command imports them all, so they import the cost model and the search inside the commands
    # that use them (tests/unit/test_startup_imports.py).
    import treeattn.cli.calibrate  # noqa: F401
    import treeattn.cli.check_model  # noqa: F401
    import treeattn.cli.emulate  # noqa: F401
    import treeattn.cli.plan  # noqa: F401
    import treeattn.cli.probe  # noqa: F401
    import treeattn.cli.report  # noqa: F401
    import treeattn.cli.run  # noqa: F401
    import treeattn.cli.simulate  # noqa: F401
    import treeattn.cli.topo  # noqa: F401
    import treeattn.cli.verify  # noqa: F401


class _ReaderMayLeave:
    """Stands for sys.stdout or sys.stderr while a command runs. When the reader has gone
    (``treeattn plan ... | head -1``), what is written after is dropped and the command goes on:
    the files it writes are still written and it ends with its own status, where click would
    end it with status 1, a failed run here."""

    def __init__(self, stream) -> None:  # noqa: ANN001 - a text stream
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if self._gone:
            if not isinstance(text, str):  # click tells a text stream from a binary one by this
                raise TypeError(f"write() argument must be str, not {type(text).__name__}")
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def writelines(self, lines) -> None:  # noqa: ANN001 - an iterable of str
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self._gone = True
        # The stream keeps what it could not write and flushes it again at interpreter exit
        # ("Exception ignored ... BrokenPipeError"), as would a rank or tool started later
        # on this descriptor: the null device takes it instead.
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):  # an in-memory stream has no descriptor
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str):  # noqa: ANN204 - whatever the stream has
        return getattr(self._stream, name)


_command = None


def built_command():  # noqa: ANN201 - a click Group
    """The click command ``main`` runs: every command module's commands, built from their
    signatures (about 0.1 s) once per process; a process that calls ``main`` again, as the
    tests do some 1,500 times, reuses it."""
    global _command
    if _command is None:
        _register()
        built = typer.main.get_command(app)
        _no_type_on_flags(built)
        _refuse_repeated_options(built)
        _command = built
    return _command


def main(args: list[str] | None = None) -> None:
    """Entry point of the console script (``args`` defaults to ``sys.argv[1:]``)."""
    command = built_command()
    # Every console (render.console(), err_console, typer's help) looks sys.stdout and
    # sys.stderr up when it prints, so it writes through these.
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ReaderMayLeave(stdout), _ReaderMayLeave(stderr)
    try:
        with kept_on_success():
            _run(command, args)
    except SystemExit as exc:
        if getattr(exc.__cause__, "exit_now", False):
            # A launcher's rank whose process group has operations pending: the interpreter's
            # exit would tear the group down and wait for them (the whole set-up deadline).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code)
        raise
    finally:
        # A reader that leaves after the last line but before it is flushed is gone too.
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = stdout, stderr


# pydantic's error types for a value typer could not convert to an option's int or float, or
# found outside the option's range, and how treeattn says each (its constraint's bound).
_VALUE_ERRORS = {"int_parsing": "must be a whole number", "int_from_float": "must be a whole number",
                 "float_parsing": "must be a number", "finite_number": "must be a finite number",
                 "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
                 "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}"}


_RANGE_ERRORS = frozenset({"greater_than_equal", "greater_than", "less_than_equal", "less_than"})


def _bad_option_value(exc: Exception) -> str | None:
    """An option's value that is not a number or outside its range, in treeattn's words
    (``--batch must be a whole number, got '1.5'``) where typer would give pydantic's; None
    for any other usage error."""
    errors = getattr(exc.__cause__, "errors", None)
    param = getattr(exc, "param", None)
    if not callable(errors) or param is None or not getattr(param, "opts", None):
        return None
    try:
        first = errors()[0]
        rule = _VALUE_ERRORS[first["type"]].format(**{k: f"{v:g}" if isinstance(v, float) else v
                                                      for k, v in first.get("ctx", {}).items()})
    except (IndexError, KeyError, TypeError):
        return None
    with contextlib.suppress(TypeError, ValueError):
        # outside no range: every comparison with NaN fails (a whole number's rule stands)
        if first["type"] in _RANGE_ERRORS and math.isnan(float(first.get("input"))):
            rule = _VALUE_ERRORS["float_parsing"]
    return f"{max(param.opts, key=len)} {rule}, got {str(first.get('input'))!r}"


def _run(command, args: list[str] | None) -> None:  # noqa: ANN001 - a click Group
    interrupts.forget()
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["--version"] and len(argv) > 1:
        # --version is eager: click prints it and stops before reading the rest, which would
        # pass unread (``treeattn --version plan ...`` printed the version and exited 0)
        err_console.print(f"[bold red]error:[/] treeattn: --version takes nothing else, got "
                          f"{escape(repr(' '.join(argv[1:])))} (see --help)", markup=True, soft_wrap=True)
        sys.exit(2)
    try:
        # Every command: a signal that ends it (SIGTERM from torchrun's agent, srun, timeout)
        # unwinds it as Ctrl-C does, so its cleanup runs (a run's empty rows file removed) and
        # it says so, with the signal's status; within seconds where torch's C++ holds the
        # main thread (ended_if_stuck).
        with interrupts.ended_if_stuck(), interrupts.interrupts_raise():
            rc = command(args=args, standalone_mode=False, prog_name="treeattn")
    except TreeattnError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        raise SystemExit(exc.exit_code) from exc
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(interrupts.exit_status())
    except MemoryError:  # a 250 MB explicit plan read under a memory limit: one line, not a traceback
        err_console.print("[bold red]error:[/] out of memory: this command needed more than the process may use "
                          "(a limit set by ulimit -v or a container, or the machine's memory)", markup=True)
        sys.exit(1)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        click = _click()
        # click >= 8.2 raises it; before, such a group printed its help and ended with status 0.
        if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            # A group given no command (``treeattn``, ``treeattn topo``): its help is what was
            # asked for. typer's rich help has printed itself (the message is empty), click's is
            # the message; echoed as --help echoes it.
            typer.echo(exc.format_message())
            sys.exit(0)
        if isinstance(exc, click.exceptions.UsageError):
            # One line, as every other bad input (click writes usage, a hint and the error).
            where = exc.ctx.command_path if exc.ctx is not None else "treeattn"
            message = _bad_option_value(exc) or " ".join(exc.format_message().replace("Value error, ", "").split())
            err_console.print(f"[bold red]error:[/] {escape(where)}: {escape(message)} (see --help)", markup=True,
                              soft_wrap=True)
            sys.exit(2)
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
    # Not standalone, typer returns an exit status instead of raising (any KeyboardInterrupt
    # gives 130): the status follows the signal that raised it (SIGTERM 143, SIGHUP 129).
    if isinstance(rc, int) and rc:
        if rc == 130:
            err_console.print("aborted")
            rc = interrupts.exit_status()
        sys.exit(rc)
