"""The host side of the guest agent: the connection to it (virtio-serial) and commands run through it."""
