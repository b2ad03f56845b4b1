"""cryobox guest agent: runs inside the microVM and serves the host over virtio-serial (stdlib only).

Also shipped into the guest image as the top-level package ``cryobox_guest``, so modules here use only
relative imports. Start it with ``python3 -m cryobox_guest`` (guest) or ``python -m cryobox.guest``.
"""
