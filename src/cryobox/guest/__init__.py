"""cryobox guest agent: runs inside the microVM and serves the host over virtio-serial (stdlib only).

Also shipped into the guest image as the top-level package ``cryobox_guest``, so modules here use only
relative imports. Start it with ``python3 -m cryobox_guest`` (guest) or ``python -m cryobox.guest``.

Resume hooks (files in ``/etc/cryobox/resume.d/``) register with ``from cryobox_guest import on_resume``;
see :mod:`.hooks`.
"""

from .hooks import ORDER, HookRegistry, on_resume

__all__ = ["ORDER", "HookRegistry", "on_resume"]
