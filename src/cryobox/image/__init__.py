"""Guest image builder: kernel, initramfs and rootfs from Debian packages, cached by content."""
