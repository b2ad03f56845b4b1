"""The control plane's decisions: sandboxes, placement, quotas, the fleet of agents, snapshots, forks, templates."""
