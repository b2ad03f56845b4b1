"""Disks on the host: the reflink-capable data volume and the qcow2 backing chains a VM's disk sits on."""
