"""The build driver: runs inside a throwaway build VM and turns a recipe's steps into an image, one command at a
time (``python3 -m cryobox_guest.build <command> [json]``; the host calls it through the guest agent's exec and
streams its output as build logs). The host only moves bytes: layers, context blobs and the target disk.

Stdlib only, relative imports only (shipped as ``cryobox_guest.build``). Modules: :mod:`.commands` (the command
line and exit codes), :mod:`.session` (prepare, freeze, thaw, finish), :mod:`.layers` (``unpack``: the safe layer
extractor), :mod:`.accounts` (``ensure-user``, users of the target), :mod:`.steps` (``step``) with
:mod:`.step_run` and :mod:`.step_copy`, :mod:`.mounts` and :mod:`.overlays` (what a ``RUN`` gets around it),
:mod:`.paths` (:func:`.paths.resolve_in_root`), :mod:`.writer` (safe writes into the target).
"""

from .errors import BuildError
from .paths import resolve_in_root

__all__ = ["BuildError", "resolve_in_root"]
