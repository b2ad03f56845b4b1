"""One kernel: an IPython ``InteractiveShell`` in its own process, driven over two pipes with JSON lines.

``python3 -m cryobox_guest.kernels.shell --in R --out W``: cells arrive on fd ``R`` (``{"code", "silent"}``);
on fd ``W`` the kernel answers ``ready`` once, then for each cell its ``display`` (``display()`` calls, shown
figures), ``result`` (the cell's value), ``error`` (``ename``, ``evalue``, ``traceback`` lines) and a last
``done`` (``execution_count``). What the cell prints goes to the process's own stdout and stderr (file
descriptors 1 and 2, so subprocesses and C extensions are captured too), which the parent reads; both are
flushed before every message so the parent sees output in order.

This is what ipykernel does minus ZeroMQ: the display machinery is IPython's own (``DisplayFormatter`` with
every MIME type active, ``DisplayHook``, ``DisplayPublisher``, the matplotlib-inline backend), so a DataFrame
gives ``text/html`` and ``plt.show()`` an ``image/png``. Debian's ipykernel would bring ZeroMQ, debugpy and,
through pydevd, gdb into the image, and its dependencies do not resolve under debootstrap.
``SIGINT`` interrupts a running cell (a ``KeyboardInterrupt`` inside it); an idle kernel ignores it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell


class Channel:
    def __init__(self, fd: int) -> None:
        self._out = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._out.write(json.dumps(message, default=repr) + "\n")
        self._out.flush()


class Publisher(DisplayPublisher):  # type: ignore[misc]
    channel: Channel

    def publish(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: str | None = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        self.channel.send({"type": "display", "data": data})


class Hook(DisplayHook):  # type: ignore[misc]
    channel: Channel

    def start_displayhook(self) -> None:
        self._format: dict[str, Any] = {}

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        self._format = format_dict

    def finish_displayhook(self) -> None:
        if self._format:
            self.channel.send({"type": "result", "data": self._format})
        self._format = {}


class Shell(InteractiveShell):  # type: ignore[misc]
    channel: Channel

    def enable_gui(self, gui: str | None = None) -> None:
        pass  # no event loop to integrate: the inline backend draws into display messages

    def _showtraceback(self, etype: type[BaseException], evalue: BaseException, stb: list[str]) -> None:
        self.channel.send({"type": "error", "ename": etype.__name__, "evalue": str(evalue), "traceback": list(stb)})


def make_shell(channel: Channel) -> Shell:
    Publisher.channel = Hook.channel = Shell.channel = channel
    shell: Shell = Shell.instance(display_pub_class=Publisher, displayhook_class=Hook, colors="NoColor")
    shell.enable_matplotlib("inline")
    return shell


def serve(shell: Shell, channel: Channel, cells: Any) -> None:
    running = False

    def interrupt(signum: int, frame: object) -> None:
        if running:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    channel.send({"type": "ready"})
    for line in cells:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        running = True
        try:
            shell.run_cell(str(request.get("code", "")), store_history=not request.get("silent"), silent=False)
        except KeyboardInterrupt:  # between statements, outside run_cell's own handling
            shell.showtraceback()
        finally:
            running = False
        channel.send({"type": "done", "execution_count": shell.execution_count - 1})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cryobox_guest.kernels.shell")
    parser.add_argument("--in", dest="fd_in", type=int, required=True)
    parser.add_argument("--out", dest="fd_out", type=int, required=True)
    options = parser.parse_args(argv)
    channel = Channel(options.fd_out)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    shell = make_shell(channel)
    with os.fdopen(options.fd_in, "r", encoding="utf-8") as cells:
        serve(shell, channel, cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
